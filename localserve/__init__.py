"""localserve: a local, multi-user LLM chat server with continuous batching."""

__version__ = "0.1.0"
