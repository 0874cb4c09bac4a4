"""The command line (``mldoctor``): the top layer, the only one that may import every other."""

from doctor.cli.main import app, main

__all__ = ["app", "main"]
