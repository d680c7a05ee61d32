"""Task kinds and the worker entry point."""
