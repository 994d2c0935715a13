"""Build the tiny world's trained artifacts once, deterministically, and cache them.

:func:`build_world` trains and saves, into one cache folder::

    tokenizer/     the character tokenizer (:func:`objectives.tiny.models.build_tokenizer`)
    policy/        the base policy: ``build_policy("tiny")`` after a short supervised
                   fine-tuning on the ``train`` split, stopped early on purpose (weak but
                   learnable: sampled accuracy on ``native`` about 0.3-0.5)
    proxy_prm/     ``build_prm("proxy")``: a step verifier (causal LM), the policy's first
                   three layers trained further on correct solutions
    prm/           ``build_prm("full")``: the whole policy trained further the same way
    manifest.json  the settings used, sha256 of every saved file, measured accuracies,
                   wall time per part, library versions

Everything runs on one CPU thread (set for the build, restored afterwards) with fixed seeds,
so the same settings on the same machine give byte-identical weights. (The shipped PRMs
were trained on 2026-12-01 where float results differed from this machine type's: a
rebuild here gives the shipped tokenizer and policy byte for byte, PRMs of other bytes.)
The recipe and the
manifest are :mod:`objectives.tiny.manifest`'s, the training :mod:`objectives.tiny.train`'s,
the PRMs' measurement :mod:`objectives.tiny.prm_eval`'s. A folder whose
manifest matches the settings and whose files match their checksums is returned as it is
(a cache hit, no training). A build is written into a temporary folder beside the cache and
renamed into place at the end, under a file lock, so an interrupted build leaves no half
cache and two processes never build the same folder at once.

Training, in short:

* **policy**: next-token loss on the completion tokens only (``solution + <eos>``, the prompt
  masked), AdamW, linear warm-up then constant learning rate, batches of right-padded
  sequences drawn from per-epoch permutations of ``train``. It stops at ``sft_steps``, or
  earlier at the first check (every ``sft_check_every`` steps from ``sft_check_from``)
  where the sampled accuracy on a check set of ``native`` problems (not those evaluated
  afterwards) reaches ``sft_stop_accuracy``: the accuracy rises steeply in this phase of
  training, and a check lands in the target range more reliably than a step count.
* **PRMs** (generative step verifiers, :class:`allocopt.rewards.verifier.LikelihoodVerifier`):
  causal LMs that start from the base policy's weights (``full``: all of them; ``proxy``: its
  first three layers) and are trained further as language models on the correct worked
  solutions of ``train`` (:func:`objectives.tiny.train.train_prm`); a step's score is the
  likelihood of its line (``prm_score="line"``), or for the proxy its per-token geometric
  mean (``proxy_prm_score="token"``: the proxy is unsure of every result digit, so its whole
  right lines score low). They judge the arithmetic because they predict it: a wrong digit,
  a miscopied operand or a missing step is a token the model finds unlikely. The held-out
  measurement (:mod:`objectives.tiny.prm_eval`) uses ``native`` problems: their correct
  solutions, synthetic corruptions (wrong result, wrong operand, wrong operator, chain
  broken, a step garbled, left out or added) and the base policy's own samples at
  temperature 1; the manifest gives each PRM's recall of wrong steps and false alarms on
  correct ones, a step flagged when its score is below ``FLAG_BELOW`` (0.5), per source and
  per kind of corruption (labels from :func:`objectives.tiny.tasks.step_labels`). (Recipe
  format 1 trained token classifiers at ``<step>`` markers instead; they learned the
  structural checks only and caught 1-4 % of the policy's wrong steps.)

Command line: ``python -m objectives.tiny.build [--cache-dir D] [--force] [--set KEY=VALUE]``
prints the manifest (``--set`` overrides a :class:`~objectives.tiny.manifest.BuildSettings`
field).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from objectives.tiny import tasks as tt
from objectives.tiny.manifest import (CACHE_ENV, DEFAULT_CACHE_NAME, FORMAT, MANIFEST,
                                      SHIPPED_DIR, BuildSettings, Progress, WorldPaths,
                                      check_cache, default_cache_dir, file_checksums,
                                      reusable_part, reusable_policy, task_fingerprint)
from objectives.tiny.prm_eval import (CORRUPTIONS, FLAG_BELOW, corruption_probe, judged_set,
                                      verifier_metrics)
from objectives.tiny.tasks import Problem
from objectives.tiny.train import accuracy, generate, train_policy, train_prm

# ============================================================================ helpers
@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """No "Writing model shards" bars from ``save_pretrained`` while building."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the rename still keeps the cache whole
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ============================================================================== build
def _policy_metrics(policy: Any, sft_info: dict[str, Any], s: BuildSettings,
                    evaluated: Sequence[Problem], downstream: Sequence[Problem]) -> dict[str, Any]:
    """What the base policy's training did and its accuracies (native and downstream,
    sampled at temperature 1 and greedy)."""
    mnt = s.max_new_tokens
    return {
        **sft_info,
        "native_sampled_accuracy": accuracy(policy, evaluated, sample=True, seed=s.seed + 1,
                                            max_new_tokens=mnt),
        "native_greedy_accuracy": accuracy(policy, evaluated, sample=False, seed=s.seed,
                                           max_new_tokens=mnt),
        "downstream_pass_at_1_greedy": accuracy(policy, downstream, sample=False, seed=s.seed,
                                                max_new_tokens=mnt),
        "downstream_pass_at_1_sampled": accuracy(policy, downstream, sample=True,
                                                 seed=s.seed + 2, max_new_tokens=mnt),
        "eval_problems": s.eval_problems,
    }


def _build_into(root: Path, s: BuildSettings, progress: Progress,
                reuse_policy: Path | None = None) -> dict[str, Any]:
    import platform

    import torch
    import transformers

    from objectives.tiny.models import build_tokenizer

    timings: dict[str, float] = {}
    t_all = t = time.perf_counter()
    train = tt.make_split("train", seed=s.seed)
    n_native = s.eval_problems + s.sft_check_problems + s.prm_eval_problems
    native = tt.make_split("native", n_native, seed=s.seed)
    evaluated, check = native[:s.eval_problems], native[s.eval_problems:][:s.sft_check_problems]
    prm_heldout = native[s.eval_problems + s.sft_check_problems:]
    downstream = tt.generate(s.downstream, s.eval_problems, tt.split_seed("downstream", s.seed))
    timings["data"] = time.perf_counter() - t
    mnt = s.max_new_tokens
    source = reusable_policy(reuse_policy, s) if reuse_policy is not None else None
    if reuse_policy is not None and source is None:
        raise ValueError(f"reuse_policy={str(reuse_policy)!r}: not a build of these policy "
                         "settings with intact tokenizer and policy files")
    if source is not None:  # the same SFT, already run: copy its files and measurements
        progress(f"reusing the base policy of {reuse_policy}")
        for part in ("tokenizer", "policy"):
            shutil.copytree(Path(reuse_policy) / part, root / part)
        from transformers import Qwen2ForCausalLM

        policy = Qwen2ForCausalLM.from_pretrained(str(root / "policy")).eval()
        policy_metrics = dict(source["metrics"]["policy"])
        for key in ("sft", "policy_eval"):
            timings[key] = source["timings_s"][key]
    else:
        build_tokenizer(str(root / "tokenizer"))
        progress("training the base policy")
        t = time.perf_counter()
        policy, sft_info = train_policy(s, train, check, progress)
        policy.save_pretrained(str(root / "policy"))
        timings["sft"] = time.perf_counter() - t
        progress("evaluating the base policy")
        t = time.perf_counter()
        policy_metrics = _policy_metrics(policy, sft_info, s, evaluated, downstream)
        timings["policy_eval"] = time.perf_counter() - t
    shown = {k: v for k, v in policy_metrics.items() if k != "checks"}
    progress(f"base policy: {json.dumps(shown)}")

    progress("making PRM evaluation data")
    t = time.perf_counter()
    samples: list[tuple[Problem, str]] = []
    for k in range(s.prm_eval_samples):
        texts = generate(policy, [p.prompt for p in prm_heldout], sample=True,
                         seed=s.seed + 4 + k, max_new_tokens=mnt)
        samples += list(zip(prm_heldout, texts))
    prm_eval = judged_set(prm_heldout, samples, random.Random(f"prm-heldout:{s.seed}"))
    probe = corruption_probe(prm_heldout[:s.prm_probe_problems], s.seed)
    timings["prm_data"] = time.perf_counter() - t

    from objectives.tiny.models import build_tokenizer as _tokenizer
    from allocopt.rewards.verifier import LikelihoodVerifier

    tokenizer = _tokenizer()
    prm_train = train[:s.prm_train_problems]
    prm_metrics: dict[str, Any] = {}
    reused: dict[str, str] = {}
    for part, size, steps, lr, score in (
            ("proxy_prm", "proxy", s.proxy_prm_steps, s.proxy_prm_lr, s.proxy_prm_score),
            ("prm", "full", s.prm_steps, s.prm_lr, s.prm_score)):
        t = time.perf_counter()
        if source is not None and part in source.get("metrics", {}) \
                and reusable_part(Path(reuse_policy), source, s, (part,)):  # type: ignore[arg-type]
            progress(f"reusing the {size} PRM of {reuse_policy}")
            shutil.copytree(Path(reuse_policy) / part, root / part)  # type: ignore[operator]
            from transformers import Qwen2ForCausalLM

            model = Qwen2ForCausalLM.from_pretrained(str(root / part)).eval()
            info = {k: source["metrics"][part][k]
                    for k in ("steps_run", "final_loss", "tensors_from_policy")}
            timings[part] = source["timings_s"][part]
            reused[part] = source.get(f"{part}_reused_from_build_at", source["built_at"])
        else:
            progress(f"training the {size} PRM")
            model, info = train_prm(size, steps, lr, prm_train, s, progress, init=policy)
            model.save_pretrained(str(root / part))
            timings[part] = time.perf_counter() - t
        t = time.perf_counter()
        verifier = LikelihoodVerifier(model, tokenizer, name=part, score=score, batch_size=256)
        by_kind = verifier_metrics(verifier, probe)
        prm_metrics[part] = {
            "size": size, **info, **verifier_metrics(verifier, prm_eval),
            "flag_below": FLAG_BELOW, "score": score,
            "wrong_recall_by_corruption": {k: by_kind[f"wrong_recall_{k}"] for k in CORRUPTIONS
                                           if f"wrong_recall_{k}" in by_kind},
            "train_examples": len(prm_train), "heldout_examples": len(prm_eval)}
        timings[f"{part}_eval"] = time.perf_counter() - t
        progress(f"{part}: {json.dumps(prm_metrics[part])}")
    del policy
    timings["total"] = time.perf_counter() - t_all

    return {
        "format": FORMAT,
        "settings": s.to_json(),
        "tasks": task_fingerprint(),
        "checksums": file_checksums(root),
        "metrics": {"policy": policy_metrics, **prm_metrics},
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **({"policy_reused_from_build_at": source.get("policy_reused_from_build_at",
                                                      source["built_at"])}
           if source is not None else {}),
        **{f"{part}_reused_from_build_at": at for part, at in reused.items()},
    }


def build_world(cache_dir: Path | str | None = None, *, force: bool = False,
                progress: Progress | None = None, settings: BuildSettings | None = None,
                reuse_policy: Path | str | None = None, **overrides: Any) -> WorldPaths:
    """The tiny world's tokenizer, base policy and two PRMs, built once into ``cache_dir``
    (default :func:`default_cache_dir`) and reused while its manifest matches.

    ``settings`` (default :class:`BuildSettings`) with ``overrides`` replacing some of its
    fields, e.g. ``build_world(d, sft_steps=20, proxy_prm_steps=10, prm_steps=10)`` for a
    quick build. Without ``cache_dir`` and ``force``, the shipped build
    (:data:`SHIPPED_DIR`) is returned when it is a valid build of these settings (the
    defaults), so users and tests need no training. ``force`` rebuilds even a valid cache.
    ``progress`` gets one line per stage. ``reuse_policy``: an earlier build whose tokenizer
    and base policy are what these settings train (:func:`reusable_policy`; e.g. the shipped
    world when only PRM settings change): they and their measurements are copied instead of
    trained again (the same files, since the build is deterministic); ``ValueError`` if not.
    Each of its PRMs whose own training settings match too (:func:`training_fields`; e.g.
    when only a ``*_score`` setting changes) is copied as well, and measured again. A folder
    that is not a valid build of these settings (other settings, a missing or changed file,
    no manifest) is rebuilt and replaced as a whole.
    """
    s = dataclasses.replace(settings or BuildSettings(), **overrides)
    say: Progress = progress or (lambda msg: None)
    if cache_dir is None and not force and check_cache(SHIPPED_DIR, s) is not None:
        return WorldPaths.at(SHIPPED_DIR)  # the shipped build of these (default) settings
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root = root.absolute()
    paths = WorldPaths.at(root)
    if not force and check_cache(root, s) is not None:
        return paths
    root.parent.mkdir(parents=True, exist_ok=True)
    import torch

    with _file_lock(root.parent / f".{root.name}.lock"), _single_thread(), \
            _no_progress_bars(), torch.random.fork_rng(devices=[]):  # caller's RNG untouched
        if not force and check_cache(root, s) is not None:  # another process built it
            return paths
        for stale in root.parent.glob(f".{root.name}.tmp-*"):  # left by killed builds
            shutil.rmtree(stale, ignore_errors=True)
        say(f"building the tiny world into {root}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
        try:
            manifest = _build_into(tmp, s, say,
                                   None if reuse_policy is None else Path(reuse_policy))
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            umask = os.umask(0)
            os.umask(umask)
            tmp.chmod(0o777 & ~umask)  # mkdtemp made it private
            old = None
            if root.exists() or root.is_symlink():
                old = root.parent / f".{root.name}.tmp-old-{os.getpid()}"
                root.rename(old)
            tmp.rename(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return paths


# ================================================================================ CLI
def _parse_set(items: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as :class:`BuildSettings` overrides (values read as JSON, so
    ``20``, ``3e-3``, ``null``, ``{"num_steps": [3, 3]}``); bad input ends in one line."""
    fields = {f.name for f in dataclasses.fields(BuildSettings)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: must be KEY=VALUE")
        if key not in fields:
            parser.error(f"--set {key}: unknown setting; known: {', '.join(sorted(fields))}")
        try:
            value = json.loads(raw)
        except ValueError:
            parser.error(f"--set {key}={raw!r}: not a number, null or JSON value")
        if isinstance(getattr(BuildSettings(), key), float) and isinstance(value, int) \
                and not isinstance(value, bool):
            value = float(value)
        out[key] = value
    try:
        BuildSettings(**out)
    except (TypeError, ValueError) as exc:
        parser.error(f"--set: {exc}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m objectives.tiny.build",
                                     description="Build (or find cached) the tiny world: "
                                                 "tokenizer, SFT base policy, proxy and full PRM; "
                                                 "print its manifest.")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"where to build (default ${CACHE_ENV} or "
                             f"~/.cache/allocopt/{DEFAULT_CACHE_NAME})")
    parser.add_argument("--force", action="store_true", help="rebuild even a valid cache")
    parser.add_argument("--reuse-policy", type=Path, default=None, metavar="DIR",
                        help="copy the tokenizer and base policy of the build in DIR (same "
                             "policy settings) instead of training them again, and each PRM "
                             "whose training settings match too")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a BuildSettings field (repeatable), e.g. --set sft_steps=20")
    args = parser.parse_args(argv)
    overrides = _parse_set(args.set, parser)
    if args.reuse_policy is not None and reusable_policy(args.reuse_policy,
                                                        BuildSettings(**overrides)) is None:
        parser.error(f"--reuse-policy {args.reuse_policy}: not a build of these policy settings "
                     "with intact tokenizer and policy files")
    paths = build_world(args.cache_dir, force=args.force, reuse_policy=args.reuse_policy,
                        progress=lambda msg: print(msg, file=sys.stderr, flush=True), **overrides)
    print(json.dumps(paths.read_manifest(), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

