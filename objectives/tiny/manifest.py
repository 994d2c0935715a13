"""The tiny world's build recipe and its record: settings, where a built world lies, and
whether a folder is a whole build of some settings (or holds parts another build can reuse).

:class:`BuildSettings` is everything that decides the built weights and measurements;
:mod:`objectives.tiny.build` builds a world from them and writes its ``manifest.json``
(settings, task fingerprint, sha256 of every file, measurements). :func:`check_cache`,
:func:`reusable_policy` and :func:`reusable_part` read manifests back. No heavy imports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from objectives.tiny import tasks as tt
from objectives.tiny.tasks import TaskSpec

FORMAT = 2
"""Version of the cache layout and of the build recipe, stored in the manifest: bump it when
the recipe changes in code, and older caches stop matching."""
DEFAULT_CACHE_NAME = "tiny-v2"
SHIPPED_DIR = Path(__file__).resolve().parent / "world"
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
    sft_steps: int = 3000
    """Most optimizer steps; fewer when the early stop triggers. A cap, not the length: the
    sampled accuracy leaves its plateau at a step that differs by CPU (the shipped build's
    check reached 0.35 at step 1700 on an AMD EPYC, an Intel Xeon's at 1950), and the learning
    rate is constant after warm-up, so a build that stops before the cap is the same whatever
    the cap."""
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
    proxy_prm_score: str = "token"
    """How the proxy scores a step (:data:`allocopt.rewards.verifier.SCORES`): its per-token geometric
    mean likelihood. The proxy is unsure of every result digit (0.65 on a right one on
    average), so whole right lines score ~0.1-0.4 and a line score below 0.5 flags nearly all
    of them; per token, right lines score ~0.9 and a digit it rules out still flags."""
    prm_steps: int = 300
    prm_lr: float = 1e-3
    prm_score: str = "line"
    """How the full PRM scores a step: the likelihood of the whole line."""
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
        from objectives.tiny.models import POLICY_SIZES
        from allocopt.rewards.verifier import SCORES

        for name in ("proxy_prm_score", "prm_score"):
            if getattr(self, name) not in SCORES:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be one of "
                                 f"{', '.join(SCORES)}")

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


def task_fingerprint() -> dict[str, Any]:
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
    ``Qwen2ForCausalLM.from_pretrained(prm)`` (or ``proxy_prm``)."""

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


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_checksums(root: Path) -> dict[str, str]:
    """sha256 of every file of the artifact folders, by path relative to ``root``."""
    out = {}
    for part in PARTS:
        for p in sorted((root / part).rglob("*")):
            if p.is_file():
                out[p.relative_to(root).as_posix()] = sha256(p)
    return out


def check_cache(root: Path, settings: BuildSettings) -> dict[str, Any] | None:
    """The manifest of ``root`` when it is a complete build of ``settings`` whose files all
    match their checksums (and no file is missing or extra); else ``None``."""
    try:
        manifest = json.loads((Path(root) / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("settings") != settings.to_json() \
                or manifest.get("tasks") != task_fingerprint():
            return None
        if file_checksums(Path(root)) != manifest.get("checksums"):
            return None
        return manifest
    except (OSError, ValueError, AttributeError):
        return None


# ============================================================================== reuse
def policy_fields(s: BuildSettings) -> dict[str, Any]:
    """The settings that decide the base policy and its measurements (all but the PRMs')."""
    return {k: v for k, v in s.to_json().items() if not k.startswith(("prm_", "proxy_prm_"))}


_PRM_TRAINING = {"proxy_prm": ("proxy_prm_steps", "proxy_prm_lr"), "prm": ("prm_steps", "prm_lr")}
"""Per PRM, its own settings that decide its weights (besides the policy's and
``prm_batch_size``, ``prm_warmup``, ``prm_train_problems``, which both share); the ``*_score``
settings decide only how it is measured."""


def training_fields(s: BuildSettings, part: str) -> dict[str, Any]:
    """The settings that decide the weights of ``part`` (``tokenizer``/``policy``, or a PRM:
    the policy's too, since a PRM starts from it)."""
    fields = policy_fields(s)
    if part in _PRM_TRAINING:
        own = _PRM_TRAINING[part] + ("prm_batch_size", "prm_warmup", "prm_train_problems")
        fields.update({k: v for k, v in s.to_json().items() if k in own})
    return fields


def reusable_part(source: Path, manifest: dict[str, Any], s: BuildSettings,
                  parts: Sequence[str]) -> bool:
    """Whether ``parts`` of the build in ``source`` (its ``manifest``) are what ``s`` would
    train: same deciding settings (:func:`training_fields`) and task fingerprint, every file
    present and matching its checksum."""
    old = manifest.get("settings") or {}
    for part in parts:
        want = training_fields(s, part)
        if {k: old.get(k) for k in want} != want:
            return False
    if manifest.get("tasks") != task_fingerprint():
        return False
    files = {k: v for k, v in file_checksums(Path(source)).items() if k.split("/")[0] in parts}
    return bool(files) and files == {k: v for k, v in manifest.get("checksums", {}).items()
                                     if k.split("/")[0] in parts}


def reusable_policy(source: Path, s: BuildSettings) -> dict[str, Any] | None:
    """The manifest of the build in ``source`` when its tokenizer and base policy are what
    ``s`` would train (same policy settings and task fingerprint, files matching their
    checksums), so a build that changes only the PRMs can start from them; else ``None``.
    (Its PRMs are reused too where their own training settings match:
    :func:`objectives.tiny.build.build_world`.)"""
    try:
        manifest = json.loads((Path(source) / MANIFEST).read_text())
        return manifest if reusable_part(source, manifest, s, ("tokenizer", "policy")) else None
    except (OSError, ValueError, AttributeError):
        return None


__all__ = ["CACHE_ENV", "DEFAULT_CACHE_NAME", "FORMAT", "MANIFEST", "PARTS", "SHIPPED_DIR",
           "BuildSettings", "Progress", "WorldPaths", "check_cache", "default_cache_dir",
           "file_checksums", "policy_fields", "reusable_part", "reusable_policy",
           "task_fingerprint", "training_fields"]
