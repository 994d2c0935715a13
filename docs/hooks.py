"""mkdocs hooks: the generated command reference.

``reference/cli.md`` holds the marker ``<!-- cli-reference -->``; it is replaced by
:func:`gen_cli.cli_markdown`, built from the ``allocopt`` app at build time.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs' signature)
    if MARKER not in markdown:
        return markdown
    sys.path.insert(0, str(_HERE))
    sys.path.insert(0, str(_HERE.parent))
    try:
        from gen_cli import cli_markdown
    finally:
        del sys.path[:2]
    return markdown.replace(MARKER, cli_markdown())
