"""The `tieredkv` command line: one module per command group, one error boundary in `main`."""
from tieredkv.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
