"""Command-line interface: one module per noun."""
