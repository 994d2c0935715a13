"""One training set-up: what a GRPO trial trains and how, read by the plan, the meter and the driver.

Standard library only. A :class:`TrainingSetup` holds every setting of a run that is not a
search variable (the allocation ρ, G, reward system): the policy, LoRA, engine, generation
limit, optimizer settings, and the expected token lengths a plan is priced at (stated
estimates; an objective replaces them with measured ones through
:meth:`TrainingSetup.with_lengths`; they price a plan but do not change what runs). From it come

* the :class:`~allocopt.plan.allocation.Workload` a plan is priced on: the policy's shape, this
  set-up and the reward models' shapes, nothing else (``Workload(policy, setup)``); its plans
  carry the set-up and its :func:`setup_fingerprint`;
* the driver's run (:func:`allocopt.grpo.driver.run_grpo` takes the set-up itself, and the seed:
  nothing else configures it), and with it the meter's per-iteration charge; the driver
  recomputes the fingerprint from the model it loaded (:func:`allocopt.grpo.driver.check_setup`)
  and refuses a plan priced for another set-up, in one line naming the fields that differ
  (:meth:`TrainingSetup.priced_differences`);
* what ``allocopt account`` and ``allocopt plan`` price: :func:`allocopt.plan.recipe.read_recipe`
  reads the same fields (flags or TOML) into a :class:`TrainingSetup` plus what an account
  adds (steps, G, passes, a reward model, a length spread), so the same TOML gives the same
  :meth:`TrainingSetup.fingerprint` in ``account --json`` and in the driver.

Every field has one default, here. Two of them depend on who runs the training, named by
:attr:`TrainingSetup.runner` (:data:`RUNNERS`): allocopt's own driver (the default) runs
without gradient checkpointing and without TRL's vLLM importance-sampling correction; a plain
TRL ``GRPOTrainer`` job (``runner = "trl"``) takes ``GRPOConfig``'s defaults, both on.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from allocopt.flops import ConfigError, LoRASpec, ModelShape
from allocopt.flops.grpo import ENGINES

MAX_ROLLOUTS_PER_ITERATION = 65_536
"""Most completions one iteration (prompts × G) may sample, and so the largest G. The FLOP
accounting prices every row of a rollout batch (about 50 µs and a few tuple entries a row, so
this bound keeps one pricing under ~4 s and a few MB); the largest published GRPO batches are
this size (DeepSeekMath: 1,024 prompts × G = 64)."""

PRICED_FIELDS: tuple[str, ...] = ("lora_rank", "lora_targets", "engine", "gradient_checkpointing",
                                  "beta", "max_completion_length", "importance_sampling_correction",
                                  "generated_per_trained", "critic")
"""The set-up fields that decide a plan's FLOPs besides the policy's shape and the expected
lengths: what :func:`setup_fingerprint` holds (``beta`` as whether a reference pass runs)."""

RUNNERS: dict[str, dict[str, bool]] = {
    "allocopt": {"gradient_checkpointing": False, "importance_sampling_correction": False},
    "trl": {"gradient_checkpointing": True, "importance_sampling_correction": True},
}
"""Defaults of the fields that depend on who runs the training (:attr:`TrainingSetup.runner`).

* ``allocopt``: allocopt's driver (:func:`allocopt.grpo.driver.run_grpo`) and the plans a study
  makes. No importance-sampling correction: with vLLM rollouts it runs an old-policy log-prob
  pass on every iteration, a floor of about 0.55 under ρ for Qwen2.5-1.5B at 103 + 304 tokens
  (:func:`allocopt.flops.grpo.old_logprobs_pass`), which would cut most of the paper's range
  [0.1, 0.95]. No gradient checkpointing: the driver trains LoRA one row per micro-batch, and
  the recomputation is executed FLOPs that buy nothing (about one more forward).
* ``trl``: a plain TRL ``GRPOTrainer`` job with ``GRPOConfig``'s defaults (TRL 1.16:
  ``gradient_checkpointing=True``, ``vllm_importance_sampling_correction=True``), for
  pricing a TRL run with ``allocopt account``.
"""

DEFAULT_MAX_COMPLETION_LENGTH = 1024
"""Generation limit (tokens) of a set-up that gives none and expects no longer completion."""


def default_max_completion_length(*longest: float | None) -> int:
    """The generation limit of a set-up that gives none: :data:`DEFAULT_MAX_COMPLETION_LENGTH`
    tokens, or the longest completion expected (``longest``, tokens; ``None`` ignored) rounded
    up when that is longer. Non-numbers are ignored (the set-up refuses them by name)."""
    ok = [math.ceil(v) for v in longest if isinstance(v, (int, float)) and not isinstance(v, bool)
          and math.isfinite(v)]
    return max([DEFAULT_MAX_COMPLETION_LENGTH] + ok)


@dataclass(frozen=True)
class TrainingSetup:
    """Everything about a GRPO training run but the allocation (ρ, G, reward system) and the
    models' shapes; the expected lengths are stated estimates an objective may replace with
    measured ones (:meth:`with_lengths`). Invalid values raise :class:`ConfigError`, one line
    naming the field."""

    model: str = "Qwen/Qwen2.5-1.5B-Instruct"
    """Policy: hub id, preset name or local folder (HF format)."""
    lora_rank: int = 32
    """LoRA rank ``r`` (0: full fine-tuning)."""
    lora_alpha: int = 64
    """LoRA scale numerator (peft ``lora_alpha``; the update is scaled by alpha / r)."""
    lora_targets: str = "all-linear"
    """LoRA target modules, comma separated, or ``all-linear`` (all seven linear maps)."""
    engine: str = "trl-vllm"
    """Executed-FLOP model of the engine that runs the trial (:data:`allocopt.flops.grpo.ENGINES`):
    ``trl-vllm`` (GPU, vLLM rollouts), ``trl-gpu``, ``trl-cpu``."""
    runner: str = "allocopt"
    """Who runs the training (:data:`RUNNERS`): ``allocopt`` (allocopt's driver and the plans
    a study makes) or ``trl`` (a plain TRL job with ``GRPOConfig``'s defaults). It decides the
    defaults of :attr:`gradient_checkpointing` and :attr:`importance_sampling_correction`
    only; given values win, and the fingerprint holds the values, not the runner."""
    gradient_checkpointing: bool | None = None
    """Recompute decoder layers in backward (non-reentrant; costs about one more forward,
    executed, never useful). ``None``: the runner's default (allocopt off, TRL on)."""
    max_completion_length: int | None = None
    """Generation limit per completion (tokens); the meter's worst case per completion.
    ``None``: :func:`default_max_completion_length` of ``completion_tokens`` and
    ``padded_completion_tokens`` (1024, or the longest expected completion when longer)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    beta: float = 0.0
    """KL coefficient β; > 0 adds a reference log-prob pass (a learning cost)."""
    learning_rate: float = 1e-5
    """Learning rate of every optimizer step (one per pass over a rollout batch)."""
    divide_lr_by_passes: bool = False
    """Divide the learning rate by the passes of an iteration (TRL ``num_iterations``)."""
    rollouts_per_iteration: int = 64
    """Completions per GRPO iteration (prompts × G; prompts = this // G)."""
    target_steps: int | None = 500
    """Iterations (rollout batches, each one optimizer step or ``μ`` passes) a plan aims at, the
    way a public recipe fixes its steps and lets the batch carry the compute
    (:func:`allocopt.plan.allocation.steps_batch`): a budget that buys more iterations than this
    at :attr:`rollouts_per_iteration` runs larger batches, up to :attr:`max_rollouts_per_iteration`.
    ``None`` or 0: off (the batch stays :attr:`rollouts_per_iteration` however large the budget).
    Default 500: inside the 100-2,000 steps public GRPO runs train."""
    max_rollouts_per_iteration: int = 8192
    """Largest batch (completions per iteration) :attr:`target_steps` may raise the batch to.
    Default 8,192: verl's DAPO recipe (``recipe/dapo/run_dapo_qwen2.5_32b.sh``:
    ``train_prompt_bsz=512`` x ``n_resp_per_prompt=16``); below :data:`MAX_ROLLOUTS_PER_ITERATION`
    (DeepSeekMath's 1,024 x 64), so one pricing stays well under a second. A set-up whose own
    batch is larger keeps its batch."""
    train_prompts: int | None = None
    """Prompts in the training set (an objective fills it: Polaris-53K less its held-out slice
    for ``qwen``, ``train_problems`` for ``tiny``); plans show their epochs over it
    (:attr:`allocopt.plan.allocation.TrialPlan.epochs`). ``None``: unknown, no epochs shown."""
    min_batch_share: float = 0.5
    """Least share of those prompts a plan may run per iteration, in (0, 1]: a plan whose whole
    iterations leave budget unspent may take a smaller batch (at least ``ceil(share ×
    prompts)``; :attr:`allocopt.plan.allocation.Workload.min_batch_share`). 1: always the full
    batch."""
    prompt_tokens: float = 103.0
    """Expected prompt length (tokens) when nothing was measured (objectives measure it on a
    seeded sample of the training prompts with the policy's tokenizer)."""
    completion_tokens: float = 304.0
    """Expected completion length (tokens, EOS included): a stated estimate, replaced by the
    mean of finished trials where an objective records them."""
    padded_completion_tokens: float | None = None
    """Expected longest completion of a batch, for engines that pad (default: the mean)."""
    steps_per_completion: float = 8.0
    """Expected reasoning steps per completion (one PRM marker token each)."""
    importance_sampling_correction: bool | None = None
    """TRL's vLLM importance-sampling correction (``vllm_importance_sampling_correction``):
    with vLLM rollouts it runs an old-policy log-prob pass on every iteration, even at one
    update pass; the meter charges it. ``None``: the runner's default (allocopt off: the ρ
    floor it sets, :data:`RUNNERS`; TRL on)."""
    generated_per_trained: float = 1.0
    """Prompts generated (and rewarded) per prompt trained, >= 1: DAPO's dynamic sampling
    (Yu et al. 2025, §3.2: keep the groups whose rewards are not all equal; verl's
    ``data.gen_batch_size`` / ``data.train_batch_size`` bounds it per generation round) and
    POLARIS-style filtering generate more groups than they train. Generation and reward run on
    ``generated_per_trained × prompts`` groups; log-prob passes and updates on ``prompts``.
    1: every generated group is trained (plain GRPO)."""
    critic: str = ""
    """Value model of PPO (hub id, preset or local folder; empty: none, GRPO's group
    baseline). Its shape may differ from the policy's; it is read with a ``d x 1`` value head
    at every position (verl's critic: ``AutoModelForTokenClassification``, ``num_labels=1``;
    OpenRLHF: ``value_head = Linear(d, 1)``) and fully fine-tuned. It costs a forward over every
    trained row (the values of the rollouts) and ``μ`` × (forward + backward) in the update,
    charged to learning; GAE is elementwise (0 matmul FLOPs). With a critic ``G`` may be 1."""
    max_iterations: int = 100_000
    """Safety cap; the budget normally ends the run."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share of GPU memory vLLM may take in colocate mode (TRL's default); no FLOPs."""

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ConfigError(f"runner={self.runner!r}: unknown; allowed: {', '.join(RUNNERS)}")
        for f, default in RUNNERS[self.runner].items():  # the runner's defaults, once
            if getattr(self, f) is None:
                object.__setattr__(self, f, default)
        if self.max_completion_length is None:
            object.__setattr__(self, "max_completion_length", default_max_completion_length(
                self.completion_tokens, self.padded_completion_tokens))
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"model={self.model!r}: must be a hub id, preset name or local folder")
        for f, lo in (("lora_rank", 0), ("lora_alpha", 1), ("max_completion_length", 1),
                      ("max_iterations", 1)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{f}={v!r}: must be an integer >= {lo}"
                                  + (" (0: full fine-tuning, else a positive integer: the LoRA rank)"
                                     if f == "lora_rank" else ""))
        n = self.rollouts_per_iteration
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_ROLLOUTS_PER_ITERATION:
            raise ConfigError(f"rollouts_per_iteration={n!r}: must be an integer from 2 to "
                              f"{MAX_ROLLOUTS_PER_ITERATION} (completions per iteration are priced "
                              "row by row)")
        for f in ("prompt_tokens", "completion_tokens", "steps_per_completion"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < (0 if f == "steps_per_completion" else 1):
                raise ConfigError(f"{f}={v!r}: must be a finite number"
                                  + (" >= 0" if f == "steps_per_completion" else " of tokens >= 1"))
        if self.target_steps == 0 and not isinstance(self.target_steps, bool):
            object.__setattr__(self, "target_steps", None)  # 0: off (TOML has no None)
        for f, lo, hi in (("target_steps", 1, None), ("train_prompts", 1, None),
                          ("max_rollouts_per_iteration", 2, MAX_ROLLOUTS_PER_ITERATION)):
            v = getattr(self, f)
            if v is None and f != "max_rollouts_per_iteration":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
                raise ConfigError(f"{f}={v!r}: must be an integer " + (f"from {lo} to {hi}" if hi else f">= {lo}")
                                  + (" (0: off)" if f == "target_steps" else
                                     " (or omit it: unknown)" if f == "train_prompts" else ""))
        v = self.min_batch_share
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ConfigError(f"min_batch_share={v!r}: must be a share in (0, 1] of the prompts "
                              "per iteration (1: never a smaller batch)")
        v = self.vllm_gpu_memory_utilization
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ConfigError(f"vllm_gpu_memory_utilization={v!r}: must be a share in (0, 1]")
        for f in ("learning_rate", "temperature"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0) or not math.isfinite(v):
                raise ConfigError(f"{f}={v!r}: must be a positive number")
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) \
                or not math.isfinite(self.beta) or self.beta < 0:
            raise ConfigError(f"beta={self.beta!r}: must be a number >= 0")
        for f in ("gradient_checkpointing", "importance_sampling_correction", "divide_lr_by_passes"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"{f}={getattr(self, f)!r}: must be true or false (a TOML boolean, unquoted)")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine={self.engine!r}: unknown; allowed: {', '.join(ENGINES)}")
        if not isinstance(self.lora_targets, str):
            raise ConfigError(f"lora_targets={self.lora_targets!r}: must be a string such as "
                              "'all-linear' or 'q_proj,v_proj'")
        if self.lora_rank:
            LoRASpec(self.lora_rank, self.lora_targets)  # raises for bad targets
        v = self.generated_per_trained
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 1:
            raise ConfigError(f"generated_per_trained={v!r}: must be a number >= 1 (prompts "
                              "generated per prompt trained; 1: all generated groups are trained)")
        if not isinstance(self.critic, str):
            raise ConfigError(f"critic={self.critic!r}: must be a hub id, preset or local folder "
                              "(empty: no critic)")
        if self.completion_tokens > self.max_completion_length:
            raise ConfigError(f"completion_tokens={self.completion_tokens!r}: must be <= "
                              f"max_completion_length={self.max_completion_length}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "TrainingSetup":
        """A set-up from a dict of its fields (e.g. a study's ``[objective_settings]``).
        Raises :class:`ConfigError` naming an unknown key."""
        known = {f.name for f in fields(cls)}
        bad = sorted(set(data) - known)
        if bad:
            raise ConfigError(f"setting {bad[0]!r}: unknown; allowed: {', '.join(sorted(known))}")
        return cls(**dict(data))

    def with_lengths(self, **kw: Any) -> "TrainingSetup":
        """A copy with measured lengths (``prompt_tokens``, ``completion_tokens``, …); the
        generation limit and the runner's defaults stay as they were resolved."""
        return replace(self, **kw)

    @property
    def largest_rollouts_per_iteration(self) -> int:
        """Largest batch a plan of this set-up may run (completions): :attr:`max_rollouts_per_iteration`
        when :attr:`target_steps` is on (or :attr:`rollouts_per_iteration` when larger), else
        :attr:`rollouts_per_iteration`."""
        if self.target_steps is None:
            return self.rollouts_per_iteration
        return max(self.rollouts_per_iteration, self.max_rollouts_per_iteration)

    @property
    def lora(self) -> LoRASpec | None:
        """The LoRA spec (``None``: full fine-tuning)."""
        return LoRASpec(self.lora_rank, self.lora_targets) if self.lora_rank else None

    @property
    def reference(self) -> bool:
        """Whether a reference log-prob pass runs (β > 0)."""
        return self.beta > 0

    def fingerprint(self, policy: ModelShape) -> str:
        """:func:`setup_fingerprint` of this set-up on ``policy`` (12 hex digits)."""
        return setup_fingerprint(policy, lora=self.lora, engine_name=self.engine,
                                 gradient_checkpointing=self.gradient_checkpointing,
                                 reference=self.reference,
                                 max_completion_length=self.max_completion_length,
                                 importance_sampling_correction=self.importance_sampling_correction,
                                 generated_per_trained=self.generated_per_trained,
                                 critic=self.critic)

    def priced_differences(self, planned: "TrainingSetup") -> list[str]:
        """Each of :data:`PRICED_FIELDS` where this set-up (the one about to run) differs from
        ``planned`` (the one a plan priced), as ``"field=value (the plan priced other)"``, in
        field order; ``[]`` when they price alike. Compared as they decide FLOPs: LoRA targets
        as the modules they name (``all-linear`` is all seven), ``beta`` as whether it is > 0."""
        def priced(s: TrainingSetup, f: str) -> Any:
            if f == "lora_targets":
                return s.lora.target_modules if s.lora else None
            return s.reference if f == "beta" else getattr(s, f)

        return [f"{f}={getattr(self, f)!r} (the plan priced {getattr(planned, f)!r})"
                for f in PRICED_FIELDS if priced(self, f) != priced(planned, f)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def setup_fingerprint(policy: ModelShape, *, lora: LoRASpec | None, engine_name: str,
                      gradient_checkpointing: bool, reference: bool,
                      max_completion_length: int | None,
                      importance_sampling_correction: bool = True,
                      generated_per_trained: float = 1.0, critic: str = "") -> str:
    """A short hash (12 hex digits) of everything that decides a trial's FLOPs besides the
    allocation and the token counts: the policy's widths (not its name: a hub id and its local
    copy agree), LoRA rank and targets, engine name, gradient checkpointing, the reference
    pass (β > 0), the generation limit and vLLM's importance-sampling correction (an old-policy
    pass on every ``trl-vllm`` iteration). The plan stores it; the driver recomputes it from
    the model it loaded and the settings it runs, and refuses a mismatch. Over-generation
    (``generated_per_trained``) and a critic enter the hash only when set, so the fingerprints
    of plain GRPO set-ups stay as they were."""
    shape = policy.fingerprint_fields()
    data = {"policy": shape, "lora": None if lora is None else [lora.rank, list(lora.target_modules)],
            "engine": engine_name.split("+")[0], "gradient_checkpointing": bool(gradient_checkpointing),
            "reference": bool(reference), "max_completion_length": max_completion_length,
            "importance_sampling_correction": bool(importance_sampling_correction)}
    if generated_per_trained != 1:
        data["generated_per_trained"] = float(generated_per_trained)
    if critic:
        data["critic"] = critic
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


__all__ = ["DEFAULT_MAX_COMPLETION_LENGTH", "MAX_ROLLOUTS_PER_ITERATION", "PRICED_FIELDS", "RUNNERS",
           "TrainingSetup", "default_max_completion_length", "setup_fingerprint"]
