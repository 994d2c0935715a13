"""``python -m allocopt``: the ``allocopt`` command line."""

from allocopt.cli import main

main()
