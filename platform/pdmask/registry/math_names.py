"""The names of the math API's proximity and direction tests, without importing torch.

The registry validates recipes against these names; keeping them torch-free lets `pdm --help`,
`pdm recipes list` and `pdm sweep --dry-run` start without loading torch (about a second).
`pdmask.trust_region.methods` holds the tests themselves; a test checks the two agree.
"""

PROXIMITY_NAMES = ("ratio", "kl_binary", "tv_binary", "kl_topk", "tv_topk")
DIRECTION_NAMES = ("ratio", "ddot_agg", "ddot_uni", "ddot_bucket", "tv_deriv")
