"""The ``envace-lite`` command: ``main.app`` (the console script's entry point), its options
(``options``: a config, notebook parameters), its data and drills commands (``data``), and its
one-line error handling (``errors``)."""
