"""Every command the README and the documentation pages show runs, so a page cannot go stale.

The ```bash blocks of README.md and docs/**/*.md (docs/index.md repeats the README) are read;
their lines that start with ``allocopt `` or ``python `` (continued by a trailing ``\\``) are
the documented commands. The ```python blocks are read whole: each is one program, run as a
file with this interpreter. A block is marked in the Markdown by an HTML comment on the line
before it:

* ``<!-- no-test: REASON -->``: not run (needs a GPU, the network, a server, your own paths);
  the test is skipped at collection with that reason;
* ``<!-- slow -->``: run only with ``-m slow`` (CI runs it).

Each page's blocks run in order in one temporary folder of their own (so ``best`` finds the
study an earlier block made), with the repository's ``studies/``, ``tests/``, ``examples/`` and
``benchmarks/`` linked in, the worktree first on ``PYTHONPATH``, and ``python`` meaning this
interpreter. A command passes when it exits 0 and prints something; a Python block when it
exits 0.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "index.md")
RUNNABLE = ("allocopt ", "python ")
LINKED = ("studies", "tests", "examples", "benchmarks")
_MARK = re.compile(r"^<!--\s*(no-test|slow)\s*(?::\s*(.*?))?\s*-->$")


@dataclass(frozen=True)
class Block:
    page: str          # path relative to the repository
    line: int          # line of the opening fence
    commands: tuple[str, ...]  # bash: one documented command each; python: the block's source
    mark: str | None   # None, "slow" or "no-test"
    reason: str = ""
    lang: str = "bash"  # "bash" or "python"


def documented_blocks(path: Path) -> list[Block]:
    """The ```bash blocks of ``path`` that hold at least one documented command and its
    non-empty ```python blocks, in file order, with marks."""
    lines = path.read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        lang = lines[i].strip()[3:] if lines[i].strip() in ("```bash", "```python") else None
        if lang is None:
            i += 1
            continue
        start = i
        prev = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = _MARK.match(prev)
        body, i = [], i + 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if lang == "python":
            source = "\n".join(body).strip("\n")
            if source.strip():
                blocks.append(Block(str(path.relative_to(ROOT)), start + 1, (source + "\n",),
                                    m.group(1) if m else None, (m.group(2) or "") if m else "", "python"))
            i += 1
            continue
        commands, cur = [], ""
        for raw in body:
            cur += raw.rstrip()
            if cur.endswith("\\"):
                cur = cur[:-1] + " "
                continue
            if cur.lstrip().startswith(RUNNABLE):
                commands.append(" ".join(cur.split()))
            cur = ""
        if commands:
            blocks.append(Block(str(path.relative_to(ROOT)), start + 1, tuple(commands),
                                m.group(1) if m else None, (m.group(2) or "") if m else ""))
        i += 1
    return blocks


def _params() -> list:
    out = []
    for page in PAGES:
        for b in documented_blocks(page):
            marks = []
            if b.mark == "no-test":  # not a test (test_no_test_blocks_say_why checks its reason)
                continue
            if b.mark == "slow":
                marks.append(pytest.mark.slow)
            out.append(pytest.param(b, id=f"{b.page}:{b.line}", marks=marks))
    return out


_FOLDERS: dict[str, Path] = {}


@pytest.fixture
def page_folder(tmp_path_factory, request) -> Path:
    """One folder per page, shared by its blocks (they run in file order)."""
    page = request.node.callspec.params["block"].page
    if page not in _FOLDERS:
        d = tmp_path_factory.mktemp(re.sub(r"\W", "_", page))
        for name in LINKED:
            (d / name).symlink_to(ROOT / name)
        _FOLDERS[page] = d
    return _FOLDERS[page]


def _shell(command: str) -> str:
    if command.startswith("python "):
        return shlex.quote(sys.executable) + command[len("python"):]
    return command


@pytest.mark.parametrize("block", _params())
def test_documented_command_runs(block: Block, page_folder: Path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("MLFLOW_TRACKING_URI", None)
    if block.lang == "python":
        script = page_folder / f"_block_{block.line}.py"
        script.write_text(block.commands[0])
        proc = subprocess.run([sys.executable, script.name], cwd=page_folder, env=env,
                              capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, (
            f"{block.page}:{block.line}: the Python block exited {proc.returncode}\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return
    for command in block.commands:
        proc = subprocess.run(["bash", "-c", _shell(command)], cwd=page_folder, env=env,
                              capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, (
            f"{block.page}:{block.line}: `{command}` exited {proc.returncode}\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        assert proc.stdout.strip() or proc.stderr.strip(), f"`{command}` printed nothing"


def test_blocks_are_found_and_marked():
    """The extraction itself, on a page written here: marks, continuations, other lines."""
    import tempfile

    text = ("intro\n\n```bash\nallocopt best --study a   # comment\npip install x\n```\n\n"
            "<!-- no-test: needs a GPU -->\n```bash\nallocopt study --spec s.toml \\\n    --trials 2\n```\n"
            "<!-- slow -->\n\n```bash\npython x.py\n```\n```python\nallocopt = 1\n```\n"
            "<!-- no-test: needs a trainer -->\n```python\nimport x\n\nx.y()\n```\n```python\n\n```\n")
    with tempfile.TemporaryDirectory(dir=ROOT) as d:
        p = Path(d) / "page.md"
        p.write_text(text)
        got = documented_blocks(p)
    assert [(b.line, b.commands, b.mark, b.reason) for b in got] == [
        (3, ("allocopt best --study a # comment",), None, ""),
        (9, ("allocopt study --spec s.toml --trials 2",), "no-test", "needs a GPU"),
        (15, ("python x.py",), "slow", ""),
        (18, ("allocopt = 1\n",), None, ""),
        (22, ("import x\n\nx.y()\n",), "no-test", "needs a trainer")]
    assert [b.lang for b in got] == ["bash", "bash", "bash", "python", "python"]


def test_readme_is_short_and_runs_commands():
    """The README fits on two screens and shows commands that run (not only skipped ones)."""
    assert len((ROOT / "README.md").read_text().split("\n")) <= 125
    blocks = documented_blocks(ROOT / "README.md")
    # run by the default test run or under -m slow (which CI runs too), not only no-test ones
    assert sum(len(b.commands) for b in blocks if b.mark in (None, "slow") and b.lang == "bash") >= 3


def test_cli_reference_lists_every_command_and_option():
    """docs/gen_cli.py (run by the mkdocs hook) covers every command and option of the app."""
    import typer.main

    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from gen_cli import cli_markdown
    finally:
        sys.path.remove(str(ROOT / "docs"))
    from allocopt.cli import app

    text = cli_markdown()
    group = typer.main.get_command(app)
    assert len(group.commands) >= 11
    for name, cmd in group.commands.items():
        section = text.split(f"## `allocopt {name}`", 1)[1].split("\n## ", 1)[0]
        for p in cmd.params:
            for opt in p.opts:
                if opt.startswith("--") and not p.hidden:
                    assert f"`{opt}" in section or f" {opt}" in section or f"{opt}`" in section, (name, opt)


def test_no_test_blocks_say_why():
    """Every documented block left out of the runs above says why (``<!-- no-test: reason -->``)."""
    left = [b for page in PAGES for b in documented_blocks(page) if b.mark == "no-test"]
    assert left and all(b.reason for b in left), [f"{b.page}:{b.line}" for b in left if not b.reason]
