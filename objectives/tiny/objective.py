"""The tiny world objective: real GRPO of a tiny Qwen2 on seeded multi-step arithmetic (CPU).

Not a simulation: every trial trains the SFT'd tiny policy (``objectives.tiny.build``) with
TRL GRPO + LoRA under the plan's FLOP budget, and scores it on held-out problems:

* ``native_reward``: mean reward of the trial's own reward system on the native split
  (same distribution as training), greedy completions;
* ``pass_at_1``: share of exactly right final answers on the downstream split (more steps),
  greedy completions (pass@1 with greedy decoding);
* ``judge``: process quality, the share of correct steps (:func:`objectives.tiny.tasks.judge`)
  on the downstream split, the same for every reward system.

Evaluation FLOPs (``eval_flops``) are counted from the padded generation shapes and stay
outside the budget.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, ClassVar

from allocopt.plan.allocation import TrialPlan, Workload
from allocopt.flops import ModelShape, generation_flops
from allocopt.plan.setup import TrainingSetup


MEASURED_SETUP_KEYS = ("model", "prompt_tokens", "completion_tokens", "padded_completion_tokens")
"""Set-up fields :meth:`TinyObjective.setup` fills from the world (not settings)."""


def tiny_setup() -> TrainingSetup:
    """The tiny world's training set-up before the world's model and lengths are filled in
    (:meth:`TinyObjective.setup`): LoRA r 8 (alpha 16), trl-cpu, 64 rollouts per iteration,
    completions up to 48 tokens, learning rate 1e-3; the PRMs are step verifiers, so no step
    marker tokens. The lengths here (1 token) are placeholders, replaced by the measured ones.
    ``target_steps`` off: the batch stays 64 at every budget (its studies' plans and the
    trials already run against them stay as they were)."""
    return TrainingSetup(model="tiny", lora_rank=8, lora_alpha=16, engine="trl-cpu",
                         max_completion_length=48, learning_rate=1e-3, divide_lr_by_passes=False,
                         rollouts_per_iteration=64, prompt_tokens=1.0, completion_tokens=1.0,
                         steps_per_completion=0.0, target_steps=None)


@dataclass(frozen=True)
class TinySettings:
    """Settings of the tiny objective (not search variables).

    ``rollouts_per_iteration`` 64 rather than 32 (in :attr:`setup`): measured at 3e11 FLOPs
    (sparse, 3 seeds), the sd between seeds at ρ 0.2-0.8 fell from 0.01-0.045 to 0.006-0.019
    on ``native_reward`` and the response to ρ became one clear peak (0.6) on every target."""

    setup: TrainingSetup = field(default_factory=tiny_setup)
    """The training set-up (:func:`tiny_setup`); its model and lengths
    (:data:`MEASURED_SETUP_KEYS`) are filled from the world by :meth:`TinyObjective.setup`."""
    eval_problems: int = 1000
    """Problems per evaluation split (native and downstream), the same problems for every
    trial. 1000 give a binomial sd of at most 0.016 on a share; with 300 the eval noise
    (0.029) hid the difference between allocations (measured in the calibration)."""
    train_problems: int = 5000
    eval_batch_size: int = 100
    cache_dir: str | None = None
    """Where the built world lives (default ``$ALLOCOPT_CACHE`` or ``~/.cache/allocopt``)."""

    def __post_init__(self) -> None:
        for f in ("eval_problems", "train_problems", "eval_batch_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}={getattr(self, f)!r}: must be >= 1")

    @classmethod
    def from_flat(cls, **kw: Any) -> "TinySettings":
        """From flat ``key=value`` settings (a study's ``[objective_settings]``, ``--set``):
        :class:`TrainingSetup` fields (but :data:`MEASURED_SETUP_KEYS`) change :attr:`setup`.
        Raises ``ValueError`` (one line) for an unknown setting or a bad value."""
        from allocopt.objective import split_settings

        keys = [f.name for f in fields(TrainingSetup) if f.name not in MEASURED_SETUP_KEYS]
        setup, own = split_settings(cls, kw, "tiny", setup_keys=keys)
        return cls(setup=replace(tiny_setup(), **setup), **own)


def build_notice(cache_dir: Path | None = None) -> str | None:
    """One line saying that loading the world will build it from scratch, with the time it
    takes (the sum of the shipped build's per-part ``timings_s`` in its manifest, one core: its
    ``total`` is shorter when parts were reused from an earlier build), or ``None``
    when a build of the recipe (:class:`objectives.tiny.manifest.BuildSettings` defaults) is there:
    the shipped world (no ``cache_dir``), or ``cache_dir`` (default
    :func:`objectives.tiny.manifest.default_cache_dir`). Reads checksums only; trains nothing."""
    import json

    from objectives.tiny.manifest import MANIFEST, SHIPPED_DIR, BuildSettings, check_cache, default_cache_dir

    recipe = BuildSettings()
    if cache_dir is None and check_cache(SHIPPED_DIR, recipe) is not None:
        return None
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if check_cache(root, recipe) is not None:
        return None
    try:
        parts = json.loads((SHIPPED_DIR / MANIFEST).read_text())["timings_s"]
        minutes = f"about {sum(v for k, v in parts.items() if k != 'total') / 60:.0f} min"
    except (OSError, ValueError, KeyError, TypeError):
        minutes = "several minutes"
    where = f"{root} holds no" if cache_dir is not None else \
        f"neither the shipped world ({SHIPPED_DIR}) nor {root} holds a"
    return (f"tiny world: {where} build of the current recipe; building it into {root} now "
            f"({minutes} on one core, once; `python -m objectives.tiny.build` builds it ahead)")


@dataclass
class TinyObjective:
    """The CPU-scale objective: builds (or loads) the world once, then runs trials."""

    settings: TinySettings = field(default_factory=TinySettings)
    name: str = "tiny"
    _world: Any = None
    flops_per_second: ClassVar[float] = 1e10
    """Executed training FLOPs per wall second on one CPU core (``allocopt trial`` estimates
    the wall time from it). Measured: a 3e11-FLOP trial (ρ 0.5, G 4, sparse) trains in ~25 s
    on a lightly loaded core (35–42 s in all, README); 1.5e9 FLOP/s beside four other jobs on
    2 cores (199 s of training for 2.93e11 FLOPs). The faster figure: estimates are a floor."""
    overhead_seconds: ClassVar[float] = 15.0
    """Seconds a trial spends outside training: loading, evaluation of 2 × 1000 problems."""

    def world(self) -> Any:
        """The world's paths (:func:`objectives.tiny.build.build_world`): the shipped build, a
        cached one, else a build from scratch, announced first on stderr (:func:`build_notice`)."""
        if self._world is None:
            from objectives.tiny.build import build_world

            cache = Path(self.settings.cache_dir) if self.settings.cache_dir else None
            notice = build_notice(cache)
            if notice:
                print(notice, file=sys.stderr, flush=True)
            self._world = build_world(cache)
        return self._world

    def _shape(self, path: Path) -> ModelShape:
        return ModelShape.from_pretrained(str(path))

    def policy_path(self, model: str | None = None) -> Path:
        """The folder of the base policy an allocation's ``model`` names: ``None`` or ``tiny``
        the world's own, ``small`` or ``medium`` a policy of another size
        (:func:`objectives.tiny.sizes.sized_policy`, built once when missing).
        ``ValueError`` (one line) for another name."""
        if model is None or model == "tiny":
            return self.world().policy
        from objectives.tiny.sizes import sized_policy

        cache = Path(self.settings.cache_dir) / "sizes" if self.settings.cache_dir else None
        return sized_policy(model, cache, progress=lambda m: print(m, file=sys.stderr, flush=True))

    def setup(self, model: str | None = None) -> Any:
        """The world's :class:`allocopt.plan.setup.TrainingSetup` (plan, meter and driver read it)
        for the policy ``model`` names (:meth:`policy_path`): its path, mean train-split
        lengths, LoRA r 8 (alpha 16), trl-cpu."""
        from objectives.tiny.tasks import make_split

        train = make_split("train", 2000, 0)
        p = statistics.fmean(len(x.prompt) for x in train)
        c = statistics.fmean(len(x.solution) + 1 for x in train)  # + EOS; 1 char = 1 token
        s = self.settings.setup
        return replace(s, model=str(self.policy_path(model)), prompt_tokens=p, completion_tokens=c,
                       padded_completion_tokens=min(s.max_completion_length, round(1.5 * c)),
                       train_prompts=s.train_prompts or self.settings.train_problems)

    def workload(self) -> Workload:
        """The workload a plan is made for (:meth:`setup` on the world's models), with the shape
        of every policy size a study may name (:data:`objectives.tiny.sizes.SIZES`, from their
        configs: nothing is built to price a plan)."""
        from objectives.tiny.models import policy_fields
        from objectives.tiny.sizes import SIZES

        w = self.world()
        policies = {size: replace(ModelShape.from_config(policy_fields(size)), name=size)
                    for size in SIZES}
        return Workload(self._shape(w.policy), self.setup(),
                        reward_models={"proxy_prm": self._shape(w.proxy_prm), "prm": self._shape(w.prm)},
                        policies=policies)

    def reward(self, name: str) -> Any:
        from allocopt.rewards.systems import make_reward

        w = self.world()
        if name in ("proxy_prm", "prm"):
            # the tiny PRMs are generative step verifiers (causal LMs trained on correct
            # solutions); they share the policy's character tokenizer, so a completion
            # re-tokenizes into at most as many tokens as the policy generated (margin 1)
            from transformers import AutoModelForCausalLM

            from allocopt.rewards.verifier import LikelihoodVerifier

            model = AutoModelForCausalLM.from_pretrained(str(getattr(w, name)))
            # how this PRM scores a step (the build's ``*_score`` setting: the full PRM the
            # line's likelihood, the proxy its per-token geometric mean)
            score = w.read_manifest()["settings"].get(f"{name}_score", "line")
            return LikelihoodVerifier(model, self._tokenizer(), name=name, score=score,
                                      token_margin=1)
        return make_reward(name)

    def _tokenizer(self) -> Any:
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(str(self.world().tokenizer))
        tok.padding_side = "left"
        return tok

    def check_available(self) -> None:
        """Raise :class:`~allocopt.objective.ObjectiveUnavailable` unless torch, transformers,
        TRL and peft are installed (a CPU is enough)."""
        from importlib.util import find_spec

        from allocopt.objective import ObjectiveUnavailable

        missing = [m for m in ("torch", "transformers", "trl", "peft") if find_spec(m) is None]
        if missing:
            raise ObjectiveUnavailable(f"objective=tiny: needs {', '.join(missing)} (not installed); "
                                       'install them with pip install -e ".[cpu]"')

    def run(self, plan: TrialPlan, *, seed: int = 0,
            progress: Callable[..., None] | None = None) -> Any:
        """Run one trial of ``plan``; returns :class:`allocopt.objective.TrialResult` (the
        contract of :class:`allocopt.objective.Objective`)."""
        import torch
        from transformers import AutoModelForCausalLM

        from allocopt.grpo.driver import run_grpo
        from objectives.tiny.tasks import make_split

        # Tiny models gain nothing from a second thread, and two torch processes with two
        # threads each thrash on 2 cores (measured: a trial 30x slower beside two workers).
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar per trial under our own progress
        tok = self._tokenizer()
        name = plan.allocation.model
        model = AutoModelForCausalLM.from_pretrained(str(self.policy_path(name)))
        rows = [{"prompt": x.prompt, "answer": x.answer}
                for x in make_split("train", self.settings.train_problems, seed)]
        reward = self.reward(plan.allocation.reward)
        return run_grpo(plan, model=model, tokenizer=tok, train_rows=rows, reward=reward,
                        setup=self.setup(name), seed=seed, progress=progress,
                        evaluate=lambda m: self.evaluate(m, tok, reward))

    def evaluate(self, model: Any, tokenizer: Any, reward: Any) -> tuple[dict[str, float], int]:
        """Targets of a trained policy and the FLOPs the evaluation spent."""
        from objectives.tiny.tasks import is_correct, judge, make_split

        if hasattr(model, "merge_and_unload"):  # fold the LoRA adapters in: same function, fewer matmuls
            model = model.merge_and_unload()
        n = self.settings.eval_problems
        # native[0:600] is used by the world's build (policy check, SFT stop rule, PRM held-out)
        native = make_split("native", 600 + n, 0)[600:]
        down = make_split("downstream", n, 0)
        native_out, f1 = self._generate(model, tokenizer, [x.prompt for x in native])
        down_out, f2 = self._generate(model, tokenizer, [x.prompt for x in down])
        native_scores = reward([x.prompt for x in native], native_out, answer=[x.answer for x in native])
        if hasattr(reward, "consume_usage"):
            reward.consume_usage()  # evaluation's reward FLOPs are not the trial's
        targets = {
            "native_reward": statistics.fmean(native_scores),
            "pass_at_1": statistics.fmean(float(is_correct(c, x)) for c, x in zip(down_out, down)),
            "judge": statistics.fmean(judge(c, x.prompt) for c, x in zip(down_out, down)),
        }
        return targets, f1 + f2

    def _generate(self, model: Any, tokenizer: Any, prompts: list[str]) -> tuple[list[str], int]:
        """Greedy completions and their executed FLOPs (padded batch, full attention)."""
        import torch

        shape = ModelShape.from_config(model.config.to_dict())
        outs: list[str] = []
        flops = 0
        bs = self.settings.eval_batch_size
        model.eval()
        for i in range(0, len(prompts), bs):
            batch = prompts[i:i + bs]
            enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                gen = model.generate(**enc, do_sample=False,
                                     max_new_tokens=self.settings.setup.max_completion_length,
                                     pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.eos_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            outs.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
            flops += len(batch) * generation_flops(shape, enc["input_ids"].shape[1], new.shape[1],
                                                   attention="full")["total"]
        return outs, flops
