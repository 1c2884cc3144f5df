"""The ``envace-lite`` command: ``app`` (``main``, the console script's entry point), its options
(``options``: a config, notebook parameters), its data and drills commands (``data``), and its
one-line error handling (``errors``)."""
from envace_lite.cli.main import app

__all__ = ["app"]
