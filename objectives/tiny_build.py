"""Build the tiny world's trained artifacts once, deterministically, and cache them.

:func:`build_world` trains and saves, into one cache folder::

    tokenizer/     the character tokenizer (:func:`objectives.tiny_models.build_tokenizer`)
    policy/        the base policy: ``build_policy("tiny")`` after a short supervised
                   fine-tuning on the ``train`` split, stopped early on purpose (weak but
                   learnable: sampled accuracy on ``native`` about 0.3-0.5)
    proxy_prm/     ``build_prm("proxy")``: a step verifier (causal LM), the policy's first
                   three layers trained further on correct solutions
    prm/           ``build_prm("full")``: the whole policy trained further the same way
    manifest.json  the settings used, sha256 of every saved file, measured accuracies,
                   wall time per part, library versions

Everything runs on one CPU thread (set for the build, restored afterwards) with fixed seeds,
so the same settings on the same machine give byte-identical weights. A folder whose
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
* **PRMs** (generative step verifiers, :class:`objectives.verifier.LikelihoodVerifier`):
  causal LMs that start from the base policy's weights (``full``: all of them; ``proxy``: its
  first three layers) and are trained further as language models on the correct worked
  solutions of ``train`` (:func:`train_prm`); a step's score is the likelihood of its line.
  They judge the arithmetic because they predict it: a wrong digit, a miscopied operand or a
  missing step is a token the model finds unlikely. The held-out measurement uses ``native``
  problems: their correct solutions, synthetic corruptions (:func:`corrupt`: wrong result,
  wrong operand, wrong operator, chain broken, a step garbled, left out or added) and the
  base policy's own samples at temperature 1; the manifest gives each PRM's recall of wrong
  steps and false alarms on correct ones, a step flagged when its score is below
  :data:`FLAG_BELOW`, per source and per kind of corruption (labels from
  :func:`tiny_tasks.step_labels`). (Recipe format 1 trained token classifiers at ``<step>``
  markers instead; they learned the structural checks only and caught 1-4 % of the policy's
  wrong steps.)

Command line: ``python -m objectives.tiny_build [--cache-dir D] [--force] [--set KEY=VALUE]``
prints the manifest (``--set`` overrides a :class:`BuildSettings` field).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from objectives import tiny_tasks as tt
from objectives.tiny_tasks import Problem, Step, TaskSpec

FORMAT = 2
"""Version of the cache layout and of the build recipe, stored in the manifest: bump it when
the recipe changes in code, and older caches stop matching."""
DEFAULT_CACHE_NAME = "tiny-v2"
SHIPPED_DIR = Path(__file__).resolve().parent / "tiny_world"
"""The world built with the default :class:`BuildSettings`, shipped with the package (the
files this module's build wrote, checksums in its manifest): used as it is when it matches."""
CACHE_ENV = "ALLOCOPT_CACHE"
MANIFEST = "manifest.json"
PARTS = ("tokenizer", "policy", "proxy_prm", "prm")

Progress = Callable[[str], None]


# ============================================================================ settings
@dataclass(frozen=True)
class BuildSettings:
    """Everything that decides the built weights (and the measurements in the manifest)."""

    seed: int = 0
    policy_size: str = "tiny"
    # ---- supervised fine-tuning of the base policy
    sft_steps: int = 1800
    """Most optimizer steps; fewer when the early stop triggers."""
    sft_batch_size: int = 32
    sft_lr: float = 3e-3
    sft_warmup: int = 50
    sft_weight_decay: float = 0.0
    sft_stop_accuracy: float | None = 0.35
    """Stop at the first check whose sampled accuracy reaches this (``None``: never)."""
    sft_check_from: int = 800
    sft_check_every: int = 50
    sft_check_problems: int = 100
    """Size of the check set: ``native`` problems after the evaluated ones."""
    # ---- step-level reward models
    proxy_prm_steps: int = 800
    proxy_prm_lr: float = 2e-3
    prm_steps: int = 300
    prm_lr: float = 1e-3
    prm_batch_size: int = 32
    prm_warmup: int = 30
    prm_train_problems: int = 20_000
    """``train`` problems whose correct worked solutions the verifier LMs learn from."""
    prm_eval_problems: int = 300
    """``native`` problems the held-out PRM data comes from (their correct solution, two
    corruptions and ``prm_eval_samples`` samples of the base policy each)."""
    prm_eval_samples: int = 2
    """Samples of the base policy (temperature 1) per held-out problem: the PRMs' recall and
    false alarms on the policy's own steps are measured on these."""
    prm_probe_problems: int = 100
    """Held-out problems corrupted once per kind to measure what each PRM catches."""
    # ---- evaluation of the base policy
    eval_problems: int = 200
    max_new_tokens: int = 48
    downstream: TaskSpec = field(default_factory=lambda: tt.SPLITS["downstream"])
    """The downstream distribution whose pass@1 is reported (default: ``tiny_tasks``')."""

    def __post_init__(self) -> None:
        for name in ("sft_steps", "proxy_prm_steps", "prm_steps", "sft_warmup", "prm_warmup",
                     "sft_check_from"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r}: must be an integer >= 0")
        for name in ("sft_batch_size", "prm_batch_size", "sft_check_every", "sft_check_problems",
                     "prm_train_problems", "prm_eval_problems", "eval_problems",
                     "max_new_tokens", "prm_probe_problems", "prm_eval_samples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: must be an integer >= 1")
        for name in ("sft_lr", "proxy_prm_lr", "prm_lr", "sft_weight_decay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1 \
                    or (v == 0 and name != "sft_weight_decay"):
                raise ValueError(f"{name}={v!r}: must be a number in (0, 1)"
                                 + (" or 0" if name == "sft_weight_decay" else ""))
        v = self.sft_stop_accuracy
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not 0 < v <= 1):
            raise ValueError(f"sft_stop_accuracy={v!r}: must be in (0, 1] or None")
        from objectives.tiny_models import POLICY_SIZES

        if self.policy_size not in POLICY_SIZES:
            raise ValueError(f"policy_size={self.policy_size!r}: must be one of "
                             f"{', '.join(POLICY_SIZES)}")
        if isinstance(self.downstream, dict):  # from JSON / TOML
            object.__setattr__(self, "downstream", TaskSpec(**self.downstream))
        if not isinstance(self.downstream, TaskSpec):
            raise ValueError(f"downstream={self.downstream!r}: must be a TaskSpec")

    def to_json(self) -> dict[str, Any]:
        """The settings as plain JSON values (what the manifest stores and compares)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


def _task_fingerprint() -> dict[str, Any]:
    """What the build reads from :mod:`tiny_tasks` besides the settings: split specs and
    sizes and a checksum of the first problems of each split (a change there invalidates)."""
    fingerprint = {
        "splits": {name: dataclasses.asdict(spec) for name, spec in tt.SPLITS.items()},
        "split_sizes": dict(tt.SPLIT_SIZES),
        "checksums_head": {name: tt.checksum(tt.make_split(name, 50)) for name in tt.SPLITS}}
    return json.loads(json.dumps(fingerprint))  # as the manifest reads back (lists, not tuples)


# ============================================================================== paths
@dataclass(frozen=True)
class WorldPaths:
    """Where a built world lies. Load with
    ``PreTrainedTokenizerFast.from_pretrained(tokenizer)``,
    ``Qwen2ForCausalLM.from_pretrained(policy)`` and
    ``Qwen2ForTokenClassification.from_pretrained(prm)`` (or ``proxy_prm``)."""

    root: Path
    tokenizer: Path
    policy: Path
    proxy_prm: Path
    prm: Path
    manifest: Path

    @classmethod
    def at(cls, root: Path) -> "WorldPaths":
        root = Path(root)
        return cls(root=root, tokenizer=root / "tokenizer", policy=root / "policy",
                   proxy_prm=root / "proxy_prm", prm=root / "prm", manifest=root / MANIFEST)

    def read_manifest(self) -> dict[str, Any]:
        return json.loads(self.manifest.read_text())


def default_cache_dir() -> Path:
    """``$ALLOCOPT_CACHE`` or ``~/.cache/allocopt/tiny-v1``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "allocopt" / DEFAULT_CACHE_NAME


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_checksums(root: Path) -> dict[str, str]:
    """sha256 of every file of the artifact folders, by path relative to ``root``."""
    out = {}
    for part in PARTS:
        for p in sorted((root / part).rglob("*")):
            if p.is_file():
                out[p.relative_to(root).as_posix()] = _sha256(p)
    return out


def check_cache(root: Path, settings: BuildSettings) -> dict[str, Any] | None:
    """The manifest of ``root`` when it is a complete build of ``settings`` whose files all
    match their checksums (and no file is missing or extra); else ``None``."""
    try:
        manifest = json.loads((Path(root) / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("settings") != settings.to_json() \
                or manifest.get("tasks") != _task_fingerprint():
            return None
        if _file_checksums(Path(root)) != manifest.get("checksums"):
            return None
        return manifest
    except (OSError, ValueError, AttributeError):
        return None


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


_CHAR_IDS = {t: i for i, t in enumerate(tt.VOCAB)}
_STEP_ID = _CHAR_IDS[tt.STEP_TOKEN]
_EOS_ID = _CHAR_IDS[tt.EOS_TOKEN]
_PAD_ID = _CHAR_IDS[tt.PAD_TOKEN]


_SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in tt.SPECIAL_TOKENS) + ")")


def encode(text: str) -> list[int]:
    """Token ids of ``text`` as :func:`build_tokenizer` gives them (one per character, a
    special token such as ``<step>`` as its own id, ``<unk>`` for other characters), without
    the tokenizer's overhead."""
    ids: list[int] = []
    for i, piece in enumerate(_SPECIAL_RE.split(text)):
        if i % 2:
            ids.append(_CHAR_IDS[piece])
        else:
            ids.extend(_CHAR_IDS.get(c, _CHAR_IDS[tt.UNK_TOKEN]) for c in piece)
    return ids


def _pad(seqs: Sequence[list[int]], labels: Sequence[list[int]]):
    """Right-padded ``input_ids``, ``attention_mask``, ``labels`` (-100 on padding)."""
    import torch

    length = max(map(len, seqs))
    ids = torch.full((len(seqs), length), _PAD_ID, dtype=torch.long)
    lab = torch.full((len(seqs), length), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, (s, y) in enumerate(zip(seqs, labels)):
        ids[i, :len(s)] = torch.tensor(s)
        lab[i, :len(y)] = torch.tensor(y)
        mask[i, :len(s)] = 1
    return ids, mask, lab


def _optimizer(model: Any, lr: float, weight_decay: float, warmup: int):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98),
                            weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) if warmup else 1.0)
    return opt, sched


def _step(loss: Any, opt: Any, sched: Any) -> float:
    """One optimizer step on ``loss`` (backward, step, zero the gradients, advance the
    schedule); returns the loss as a float."""
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    return float(loss.detach())


def _batches(n: int, batch_size: int, rng: random.Random) -> Iterator[list[int]]:
    """Index batches from per-epoch permutations of ``range(n)`` (a batch may span two)."""
    order: list[int] = []
    while True:
        while len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order += epoch
        yield order[:batch_size]
        del order[:batch_size]


# ============================================================================= policy
def generate(model: Any, prompts: Sequence[str], *, sample: bool, seed: int,
             max_new_tokens: int, batch_size: int = 256) -> list[str]:
    """Completions of ``prompts`` (greedy, or sampled at temperature 1 from seed ``seed``),
    decoded without special tokens, cut at ``<eos>``."""
    import torch

    was_training = model.training
    model.eval()
    texts: list[str] = []
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            chunk = [encode(p) for p in prompts[start:start + batch_size]]
            length = max(map(len, chunk))
            ids = torch.tensor([[_PAD_ID] * (length - len(c)) + c for c in chunk])  # left
            mask = torch.tensor([[0] * (length - len(c)) + [1] * len(c) for c in chunk])
            kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample \
                else dict(do_sample=False)
            out = model.generate(input_ids=ids, attention_mask=mask,
                                 max_new_tokens=max_new_tokens, eos_token_id=_EOS_ID,
                                 pad_token_id=_PAD_ID, **kwargs)
            for row in out[:, length:].tolist():
                if _EOS_ID in row:
                    row = row[:row.index(_EOS_ID)]
                texts.append("".join(tt.VOCAB[i] for i in row if i >= len(tt.SPECIAL_TOKENS)))
    model.train(was_training)
    return texts


def accuracy(model: Any, problems: Sequence[Problem], *, sample: bool, seed: int,
             max_new_tokens: int) -> float:
    """Share of ``problems`` whose completion has the right final answer."""
    texts = generate(model, [p.prompt for p in problems], sample=sample, seed=seed,
                     max_new_tokens=max_new_tokens)
    return sum(tt.is_correct(t, p) for t, p in zip(texts, problems)) / len(problems)


def train_policy(s: BuildSettings, train: Sequence[Problem], check: Sequence[Problem],
                 progress: Progress) -> tuple[Any, dict[str, Any]]:
    """The SFT base policy and what its training did (steps run, last loss, checks)."""
    import torch

    from objectives.tiny_models import build_policy

    model = build_policy(s.policy_size, s.seed)
    model.generation_config.eos_token_id = _EOS_ID
    model.generation_config.pad_token_id = _PAD_ID
    seqs, labels = [], []
    for p in train:
        prompt, completion = encode(p.prompt), encode(p.solution) + [_EOS_ID]
        seqs.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    opt, sched = _optimizer(model, s.sft_lr, s.sft_weight_decay, s.sft_warmup)
    batches = _batches(len(seqs), s.sft_batch_size, random.Random(f"sft:{s.seed}"))
    torch.manual_seed(s.seed)
    model.train()
    checks: list[dict[str, float]] = []
    loss_value, step = float("nan"), 0
    for step in range(1, s.sft_steps + 1):
        idx = next(batches)
        ids, mask, lab = _pad([seqs[i] for i in idx], [labels[i] for i in idx])
        loss_value = _step(model(input_ids=ids, attention_mask=mask, labels=lab).loss, opt, sched)
        if step % 100 == 0:
            progress(f"sft step {step}/{s.sft_steps} loss {loss_value:.4f}")
        if s.sft_stop_accuracy is not None and step >= s.sft_check_from \
                and (step - s.sft_check_from) % s.sft_check_every == 0:
            acc = accuracy(model, check, sample=True, seed=s.seed + 7,
                           max_new_tokens=s.max_new_tokens)
            checks.append({"step": step, "sampled_accuracy": acc})
            progress(f"sft check at step {step}: sampled accuracy {acc:.3f}")
            if acc >= s.sft_stop_accuracy:
                break
    model.eval()
    return model, {"steps_run": step, "final_loss": loss_value, "checks": checks}


# ========================================================================= PRM data
def _near(value: int, rng: random.Random) -> int:
    """A plausible wrong value near ``value`` (a slip of one digit, a carry, a sign)."""
    while True:
        kind = rng.random()
        if kind < 0.45:
            wrong = value + rng.choice((-1, 1, -2, 2, -10, 10, -9, 9, -11, 11, -20, 20))
        elif kind < 0.8:  # one digit changed
            digits = list(str(abs(value)))
            i = rng.randrange(len(digits))
            digits[i] = str(rng.randrange(10))
            wrong = int("".join(digits)) * (-1 if value < 0 else 1)
        else:
            wrong = rng.randint(0, 199)
        if wrong != value:
            return wrong


def _render(steps: Sequence[Step | str], answer: str) -> str:
    lines = [s if isinstance(s, str) else f"{s.a}{s.op}{s.b}={s.result}" for s in steps]
    return "\n".join(lines + [f"{tt.ANSWER_MARKER}{answer}"])


CORRUPTIONS = ("result", "operand", "operator", "chain", "garbled", "missing", "extra")
"""Kinds of error :func:`corrupt` makes (``result`` drawn twice as often as the others)."""


def corrupt(problem: Problem, rng: random.Random, kind: str | None = None) -> str:
    """A wrong worked solution of ``problem``: one error at a random step (wrong result,
    wrong operand, wrong operator, chain broken, garbled line, a step left out or one too
    many; ``kind`` one of :data:`CORRUPTIONS`, default drawn), the later steps continuing
    correctly from the value written last, and the final answer the last value."""
    steps = problem.steps
    i = rng.randrange(len(steps))
    drawn = rng.choice(("result",) + CORRUPTIONS)
    kind = kind or drawn
    if kind not in CORRUPTIONS:
        raise ValueError(f"kind={kind!r}: must be one of {', '.join(CORRUPTIONS)}")
    out: list[Step | str] = list(steps[:i])
    a, s = steps[i].a, steps[i]
    if kind == "result":
        out.append(Step(a, s.op, s.b, _near(tt.apply(a, s.op, s.b), rng)))
    elif kind == "operand":
        b = abs(_near(s.b, rng)) if rng.random() < 0.7 else rng.randint(0, 99)
        if b == s.b:
            b += 1
        out.append(Step(a, s.op, b, tt.apply(a, s.op, b) if rng.random() < 0.7
                        else _near(tt.apply(a, s.op, b), rng)))
    elif kind == "operator":
        op = "-" if s.op == "+" else "+"
        out.append(Step(a, op, s.b, tt.apply(a, op, s.b)))
    elif kind == "chain":
        a2 = _near(a, rng) if rng.random() < 0.7 else rng.randint(0, 99)
        a2 = a2 if a2 != a else a + 1
        out.append(Step(a2, s.op, s.b, tt.apply(a2, s.op, s.b)))
    elif kind == "garbled":
        line = f"{a}{s.op}{s.b}={s.result}"
        cut = rng.randrange(1, len(line))
        out.append(rng.choice((line[:cut], line[:cut] + line[cut + 1:] + "=", line + "+")))
    elif kind == "extra":  # the right step, then one the prompt does not have
        out.append(s)
        b, op = rng.randint(0, 99), rng.choice(("+", "-"))
        out.append(Step(s.result, op, b, tt.apply(s.result, op, b)))
    # "missing": step i is left out
    last = next((x for x in reversed(out) if isinstance(x, Step)), None)
    value = s.result if kind == "garbled" or last is None else last.result
    for later in steps[i + 1:]:
        out.append(Step(value, later.op, later.b, tt.apply(value, later.op, later.b)))
        value = out[-1].result
    return _render(out, str(value))


def train_prm(size: str, steps: int, lr: float, data: Sequence[Problem], s: BuildSettings,
              progress: Progress, init: Any = None) -> tuple[Any, dict[str, Any]]:
    """``build_prm(size)`` (a causal LM) trained ``steps`` AdamW steps as a language model on
    the correct worked solutions of ``data`` (next-token loss on ``solution + <eos>``, the
    prompt masked, as the policy's SFT), and what the training did. A step verifier: it
    learns what a right step looks like, and :class:`objectives.verifier.LikelihoodVerifier`
    scores a step by the likelihood of its line.

    ``init`` (a model, e.g. the SFT'd base policy): its weights that fit (same name and shape)
    are copied in first, as real PRMs start from the instruct model they judge; with the
    default sizes the ``full`` PRM is the base policy's shape (every weight copied) and the
    ``proxy`` its first three layers (embedding, those layers, final norm copied)."""
    import torch

    from objectives.tiny_models import build_prm

    model = build_prm(size, s.seed)
    copied = 0
    if init is not None:
        own = model.state_dict()
        fit = {k: v for k, v in init.state_dict().items() if k in own and own[k].shape == v.shape}
        model.load_state_dict(fit, strict=False)
        copied = len(fit)
    seqs, labels = [], []
    for p in data:
        prompt, completion = encode(p.prompt), encode(p.solution) + [_EOS_ID]
        seqs.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    opt, _ = _optimizer(model, lr, 0.0, s.prm_warmup)
    # linear warm-up, then linear decay to a tenth of lr at the last step
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(
        (i + 1) / max(1, s.prm_warmup), max(0.1, 1 - 0.9 * i / max(1, steps))))
    batches = _batches(len(seqs), s.prm_batch_size, random.Random(f"prm:{size}:{s.seed}"))
    torch.manual_seed(s.seed)
    model.train()
    loss_value = float("nan")
    for step in range(1, steps + 1):
        idx = next(batches)
        ids, mask, lab = _pad([seqs[i] for i in idx], [labels[i] for i in idx])
        loss_value = _step(model(input_ids=ids, attention_mask=mask, labels=lab).loss, opt, sched)
        if step % 100 == 0:
            progress(f"{size} prm step {step}/{steps} loss {loss_value:.4f}")
    model.eval()
    return model, {"steps_run": steps, "final_loss": loss_value, "tensors_from_policy": copied}


Judged = tuple[Problem, str, str]
"""A completion to judge: ``(problem, completion, source)``."""


def judged_set(problems: Sequence[Problem], samples: Sequence[tuple[Problem, str]],
               rng: random.Random) -> list[Judged]:
    """Per problem its correct solution and two corruptions (sources ``correct``,
    ``corrupt``), then the policy ``samples`` (source ``policy``)."""
    out: list[Judged] = []
    for p in problems:
        out.append((p, p.solution, "correct"))
        out += [(p, corrupt(p, rng), "corrupt") for _ in range(2)]
    out += [(p, text, "policy") for p, text in samples]
    return out


def corruption_probe(problems: Sequence[Problem], seed: int) -> list[Judged]:
    """One corruption of every kind per problem, the source naming the kind: what a PRM
    catches (its recall of wrong steps per kind, :func:`verifier_metrics`)."""
    out: list[Judged] = []
    for kind in CORRUPTIONS:
        rng = random.Random(f"probe:{kind}:{seed}")
        out += [(p, corrupt(p, rng, kind), kind) for p in problems]
    return out


FLAG_BELOW = 0.5
"""A step whose verifier score is below this is *flagged* wrong (for the manifest's recall and
false-alarm rates; the reward itself uses the scores)."""


def verifier_metrics(verifier: Any, data: Sequence[Judged]) -> dict[str, Any]:
    """How well ``verifier`` (:class:`objectives.verifier.LikelihoodVerifier`) judges the
    written steps of ``data`` against :func:`tiny_tasks.step_labels` (the truth), a step
    flagged when its score is below :data:`FLAG_BELOW`: ``wrong_recall`` (share of wrong steps
    flagged), ``false_alarm`` (share of correct steps flagged), ``step_accuracy``, overall and
    per source, and ``share_correct_steps`` (the accuracy of flagging nothing). Steps a
    completion left out are not written, so not judged."""
    scores = verifier.step_scores([p.prompt for p, _, _ in data], [c for _, c, _ in data])
    verifier.consume_usage()
    hits: dict[str, list[int]] = {}
    caught: dict[str, list[int]] = {}
    alarms: dict[str, list[int]] = {}
    for (p, text, source), sc in zip(data, scores):
        truth = tt.step_labels(text, p.prompt)[:len(sc)]
        for key in ("all", source):
            for ok, score in zip(truth, sc):
                flagged = score < FLAG_BELOW
                hits.setdefault(key, []).append(int(flagged != ok))
                (alarms if ok else caught).setdefault(key, []).append(int(flagged))
    out: dict[str, Any] = {}
    for key in sorted(hits):
        suffix = "" if key == "all" else f"_{key}"
        out[f"step_accuracy{suffix}"] = sum(hits[key]) / len(hits[key])
        if caught.get(key):
            out[f"wrong_recall{suffix}"] = sum(caught[key]) / len(caught[key])
        if alarms.get(key):
            out[f"false_alarm{suffix}"] = sum(alarms[key]) / len(alarms[key])
    total = len(hits.get("all", []))
    out["share_correct_steps"] = len(alarms.get("all", [])) / total if total else 0.0
    out["steps"] = total
    out["wrong_steps_policy"] = len(caught.get("policy", []))
    return out


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


def _policy_fields(s: BuildSettings) -> dict[str, Any]:
    """The settings that decide the base policy and its measurements (all but the PRMs')."""
    return {k: v for k, v in s.to_json().items() if not k.startswith(("prm_", "proxy_prm_"))}


def reusable_policy(source: Path, s: BuildSettings) -> dict[str, Any] | None:
    """The manifest of the build in ``source`` when its tokenizer and base policy are what
    ``s`` would train (same policy settings and task fingerprint, files matching their
    checksums), so a build that changes only the PRMs can start from them; else ``None``."""
    try:
        manifest = json.loads((Path(source) / MANIFEST).read_text())
        old = manifest.get("settings") or {}
        if {k: old.get(k) for k in _policy_fields(s)} != _policy_fields(s) \
                or manifest.get("tasks") != _task_fingerprint():
            return None
        files = {k: v for k, v in _file_checksums(Path(source)).items()
                 if k.split("/")[0] in ("tokenizer", "policy")}
        if not files or files != {k: v for k, v in manifest.get("checksums", {}).items()
                                  if k.split("/")[0] in ("tokenizer", "policy")}:
            return None
        return manifest
    except (OSError, ValueError, AttributeError):
        return None


def _build_into(root: Path, s: BuildSettings, progress: Progress,
                reuse_policy: Path | None = None) -> dict[str, Any]:
    import platform

    import torch
    import transformers

    from objectives.tiny_models import build_tokenizer

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

    from objectives.tiny_models import build_tokenizer as _tokenizer
    from objectives.verifier import LikelihoodVerifier

    tokenizer = _tokenizer()
    prm_train = train[:s.prm_train_problems]
    prm_metrics: dict[str, Any] = {}
    for part, size, steps, lr in (("proxy_prm", "proxy", s.proxy_prm_steps, s.proxy_prm_lr),
                                  ("prm", "full", s.prm_steps, s.prm_lr)):
        progress(f"training the {size} PRM")
        t = time.perf_counter()
        model, info = train_prm(size, steps, lr, prm_train, s, progress, init=policy)
        model.save_pretrained(str(root / part))
        timings[part] = time.perf_counter() - t
        t = time.perf_counter()
        verifier = LikelihoodVerifier(model, tokenizer, name=part, batch_size=256)
        by_kind = verifier_metrics(verifier, probe)
        prm_metrics[part] = {
            "size": size, **info, **verifier_metrics(verifier, prm_eval),
            "flag_below": FLAG_BELOW,
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
        "tasks": _task_fingerprint(),
        "checksums": _file_checksums(root),
        "metrics": {"policy": policy_metrics, **prm_metrics},
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **({"policy_reused_from_build_at": source["built_at"]} if source is not None else {}),
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
    trained again (the same files, since the build is deterministic); ``ValueError`` if not. A folder that is not a valid build of these settings (other settings, a missing
    or changed file, no manifest) is rebuilt and replaced as a whole.
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
    parser = argparse.ArgumentParser(prog="python -m objectives.tiny_build",
                                     description="Build (or find cached) the tiny world: "
                                                 "tokenizer, SFT base policy, proxy and full PRM; "
                                                 "print its manifest.")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"where to build (default ${CACHE_ENV} or "
                             f"~/.cache/allocopt/{DEFAULT_CACHE_NAME})")
    parser.add_argument("--force", action="store_true", help="rebuild even a valid cache")
    parser.add_argument("--reuse-policy", type=Path, default=None, metavar="DIR",
                        help="copy the tokenizer and base policy of the build in DIR (same "
                             "policy settings) instead of training them again")
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
