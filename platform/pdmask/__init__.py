"""pdmask: trust-region masks for LLM RL."""

__version__ = "0.1.0"
