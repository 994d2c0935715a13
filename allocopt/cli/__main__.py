"""``python -m allocopt.cli``: the ``allocopt`` command line."""

from allocopt.cli import main

main()
