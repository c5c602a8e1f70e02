"""Inlet: keep a LanceDB knowledge base fresh, reprocessing only what changed."""

__version__ = "0.1.0"
