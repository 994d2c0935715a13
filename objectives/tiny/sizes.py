"""The tiny world's policies of three sizes: the paper's first axis (model size) at CPU scale.

Every size is trained by the same recipe on the same data: the base policy's supervised
fine-tuning (:func:`objectives.tiny.train.train_policy`) on the ``train`` split, for the same
number of optimizer steps, :data:`SFT_STEPS` (the steps the shipped ``tiny`` policy ran before its
early stop), with no early stop. So a bigger policy starts stronger, as a bigger model of one
family does, and each keeps room to learn under GRPO (their accuracies: ``manifest.json`` of
each size, and the docs' model-size page).

``tiny`` is the shipped world's own policy (the same recipe gives it byte for byte: the early
stop fired at step :data:`SFT_STEPS`, and the checks before it draw no randomness the training
uses). ``small`` and ``medium`` are shipped under ``sizes/<size>/`` beside this module, each with
a manifest (settings, sha256 of its files, measured accuracies, wall time, versions); a missing
or changed one is rebuilt into the cache (``$ALLOCOPT_CACHE/../tiny-v2-sizes/<size>`` or
``~/.cache/allocopt/tiny-v2-sizes/<size>``). The world's tokenizer and its two PRMs are shared by
every size: the reward system is part of the environment a policy is trained in, as the paper
keeps one PRM for its 1.5B, 3B and 7B policies, so a size changes the policy and nothing else.

Command line: ``python -m objectives.tiny.sizes SIZE [--cache-dir D] [--force] [--ship]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from objectives.tiny import tasks as tt
from objectives.tiny.manifest import (MANIFEST, BuildSettings, Progress, default_cache_dir, sha256,
                                      task_fingerprint)

SFT_STEPS = 1700
"""Optimizer steps of every size's SFT: the steps the shipped ``tiny`` policy ran (its manifest's
``steps_run``; the default recipe's early stop fired there)."""
SFT_LR = {"tiny": 3e-3, "small": 3e-3, "medium": 1e-3}
"""Each size's SFT learning rate. ``tiny`` and ``small`` train at the world's 3e-3, where their
SFT leaves the loss plateau. ``medium`` (``small``'s width at 9 layers) stays on it at 3e-3 for
all :data:`SFT_STEPS` steps (final loss 0.39, native greedy accuracy 0.045); of the rates tried
below it, 1.5e-3 leaves it late (final loss 0.097, native greedy accuracy 0.475, below
``small``'s 0.605) and 1e-3 early (final loss 0.041, native greedy 0.67, downstream pass@1
greedy 0.43 against ``small``'s 0.40): the lowest final loss of the three, so ``medium`` trains
at 1e-3 (a deeper model of one family takes a smaller learning rate). A 4x-wide policy (d 192,
4 layers) stayed on the plateau or started weaker than ``small`` at every rate tried (3e-3,
1.5e-3, 7.5e-4), which is why ``medium`` grows in depth."""
SIZES = ("tiny", "small", "medium")
"""The sizes a tiny study may search over, smallest first (:data:`objectives.tiny.models.POLICY_SIZES`)."""
SHIPPED_SIZES_DIR = Path(__file__).resolve().parent / "sizes"
FILES = ("config.json", "generation_config.json", "model.safetensors")


def recipe(size: str) -> BuildSettings:
    """The build settings of the policy of ``size``: the default recipe at another
    ``policy_size``, :data:`SFT_STEPS` steps, no early stop, the size's :data:`SFT_LR`.
    ``ValueError`` for an unknown size."""
    if size not in SIZES:
        raise ValueError(f"model={size!r}: not a tiny policy size; known: {', '.join(SIZES)}")
    return BuildSettings(policy_size=size, sft_steps=SFT_STEPS, sft_stop_accuracy=None,
                         sft_lr=SFT_LR[size])


def _manifest_ok(folder: Path, size: str) -> bool:
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if m.get("settings") != recipe(size).to_json() or m.get("tasks") != task_fingerprint():
        return False
    want = m.get("checksums") or {}
    return set(want) == set(FILES) and all(
        (folder / f).is_file() and sha256(folder / f) == want[f] for f in FILES)


def cache_root() -> Path:
    """Where sized policies are built when the shipped ones do not match."""
    return default_cache_dir().parent / "tiny-v2-sizes"


def sized_policy(size: str, cache_dir: Path | None = None, *, progress: Progress | None = None,
                 force: bool = False) -> Path:
    """The folder of the base policy of ``size`` (load with ``Qwen2ForCausalLM.from_pretrained``):
    ``tiny`` is the world's own (:func:`objectives.tiny.build.build_world`); another size the
    shipped build when it matches :func:`recipe`, else a cached or new build under
    ``cache_dir`` (default :func:`cache_root`), trained on one thread (minutes: the shipped
    manifests give each size's SFT time)."""
    recipe(size)
    if size == "tiny" and not force:
        from objectives.tiny.build import build_world

        return build_world(cache_dir).policy
    if not force and cache_dir is None and _manifest_ok(SHIPPED_SIZES_DIR / size, size):
        return SHIPPED_SIZES_DIR / size
    folder = Path(cache_dir or cache_root()).expanduser().absolute() / size
    if not force and _manifest_ok(folder, size):
        return folder
    _build(folder, size, progress or (lambda msg: None))
    return folder


def _build(folder: Path, size: str, say: Progress) -> None:
    import torch

    from objectives.tiny.build import _file_lock, _no_progress_bars, _policy_metrics, _single_thread
    from objectives.tiny.train import train_policy

    s = recipe(size)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(folder.parent / f".{size}.lock"), _single_thread(), _no_progress_bars(), \
            torch.random.fork_rng(devices=[]):
        if _manifest_ok(folder, size):  # another process built it meanwhile
            return
        say(f"training the {size} tiny policy ({SFT_STEPS} SFT steps, one thread) into {folder}")
        train = tt.make_split("train", seed=s.seed)
        native = tt.make_split("native", s.eval_problems + s.sft_check_problems, seed=s.seed)
        evaluated, check = native[:s.eval_problems], native[s.eval_problems:]
        downstream = tt.generate(s.downstream, s.eval_problems, tt.split_seed("downstream", s.seed))
        t0 = time.perf_counter()
        policy, info = train_policy(s, train, check, say)
        sft_s = time.perf_counter() - t0
        metrics = _policy_metrics(policy, info, s, evaluated, downstream)
        tmp = Path(tempfile.mkdtemp(prefix=f".{size}.tmp-", dir=folder.parent))
        try:
            policy.save_pretrained(str(tmp))
            write_manifest(tmp, size, metrics, sum(p.numel() for p in policy.parameters()),
                           {"sft": sft_s, "total": time.perf_counter() - t0})
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def write_manifest(folder: Path, size: str, metrics: dict, num_params: int,
                   timings_s: dict[str, float]) -> None:
    """Write ``folder``'s manifest: the recipe of ``size``, the task fingerprint, sha256 of its
    files, the measured ``metrics`` (:func:`objectives.tiny.build._policy_metrics`), wall times."""
    import platform

    import torch
    import transformers

    manifest = {
        "settings": recipe(size).to_json(), "tasks": task_fingerprint(),
        "checksums": {f: sha256(folder / f) for f in FILES},
        "metrics": {"policy": metrics, "num_params": num_params},
        "timings_s": {k: round(v, 2) for k, v in timings_s.items()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m objectives.tiny.sizes",
                                description="Build (or find) the tiny world's policy of one size; "
                                            "print its manifest.")
    p.add_argument("size", choices=SIZES)
    p.add_argument("--cache-dir", type=Path, default=None,
                   help=f"where to build (default {cache_root()})")
    p.add_argument("--force", action="store_true", help="rebuild even a valid build")
    p.add_argument("--ship", action="store_true",
                   help=f"build into the shipped folder ({SHIPPED_SIZES_DIR}/SIZE)")
    args = p.parse_args(argv)
    if args.ship and args.cache_dir is not None:
        p.error("--ship and --cache-dir: give one")
    if args.ship and args.size == "tiny":
        p.error("--ship tiny: the tiny policy is the shipped world's (python -m objectives.tiny.build)")
    cache = SHIPPED_SIZES_DIR if args.ship else args.cache_dir
    folder = sized_policy(args.size, cache, force=args.force,
                          progress=lambda m: print(m, file=sys.stderr, flush=True))
    m = folder / MANIFEST
    print(m.read_text() if m.exists() else json.dumps({"policy": str(folder)}))
    return 0


__all__ = ["SFT_STEPS", "SIZES", "SHIPPED_SIZES_DIR", "cache_root", "recipe", "sized_policy"]

if __name__ == "__main__":
    sys.exit(main())
