"""The Ray plumbing both launch kinds and `pdm cluster` share: the address and its token, the
embedded instance and its reaper, the local head for jobs, the cluster's watch, what its nodes
must share and the check that proves it from every node."""
