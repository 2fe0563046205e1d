"""``python -m parcae.cli``: the same command line as the ``parcae`` console script."""

from parcae.cli import app

app()
