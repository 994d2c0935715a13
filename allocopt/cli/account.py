"""``allocopt account`` and ``allocopt plan``: FLOPs of a recipe, of an existing TRL or verl
run (from its logs), and the plan a budget buys. Thin: parsing, printing; the math lives in
:mod:`allocopt.plan.recipe` (a :class:`~allocopt.plan.setup.TrainingSetup` and what an account adds),
:mod:`allocopt.runlogs` and :mod:`allocopt.plan.allocation`.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from allocopt.cli.consoles import PipeConsole
from allocopt.flops import PHASES, ConfigError, FlopAccount
from allocopt.plan.setup import TrainingSetup
from allocopt.plan.hub import model_shape

D = {f.name: f.default for f in fields(TrainingSetup)}
"""The set-up's defaults: the one default of each field, shown in the help of both commands."""
RUNNER_HELP = ("Who runs the training, which decides the defaults of gradient checkpointing and "
               "the importance-sampling correction: allocopt (allocopt's driver and the runs a study "
               "plans: both off) or trl (a plain TRL GRPOTrainer job, GRPOConfig's defaults: both "
               f"on). \\[default: {D['runner']}]")

# This module does not import allocopt.cli (``python -m allocopt.cli`` runs that file as
# ``__main__``): bad input is raised as ConfigError, which allocopt.cli.main turns into one line.
out = PipeConsole()
err = Console(stderr=True)



from allocopt.cli.common import takes_time_budget  # noqa: E402


def fmt_flops(v: float) -> str:
    """FLOPs in scientific notation, e.g. ``1.234e+15``."""
    return f"{v:.3e}"


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: must be a number") from None


def breakdown_table(acct: FlopAccount, title: str) -> Table:
    """Rich table of a :class:`FlopAccount`: one row per phase item, executed and useful."""
    t = Table(title=title)
    t.add_column("phase")
    t.add_column("item")
    t.add_column("executed FLOPs", justify="right")
    t.add_column("useful FLOPs", justify="right")
    t.add_column("share", justify="right")
    total = acct.executed.total_flops or 1
    for p in PHASES:
        ex, us = getattr(acct.executed, p), getattr(acct.useful, p)
        for item in ex:
            if ex[item] or us.get(item):
                t.add_row(p, item, fmt_flops(ex[item]), fmt_flops(us.get(item, 0)),
                          f"{ex[item] / total:.1%}")
        t.add_row(f"[bold]{p}[/]", "[bold]total[/]",
                  f"[bold]{fmt_flops(getattr(acct.executed, p + '_flops'))}[/]",
                  fmt_flops(getattr(acct.useful, p + "_flops")),
                  f"[bold]{getattr(acct.executed, p + '_flops') / total:.1%}[/]", end_section=True)
    t.add_row("[bold]all[/]", "[bold]total[/]", f"[bold]{fmt_flops(acct.executed.total_flops)}[/]",
              fmt_flops(acct.useful.total_flops), "100.0%")
    t.caption = (f"rho (update fraction) = {acct.executed.rho:.4f} executed, "
                 f"{acct.useful.rho:.4f} useful")
    if acct.useful.search.get("prefill", 0) > acct.executed.search.get("prefill", 0):
        # the one phase where useful exceeds executed: prefix sharing, not a counting error
        t.caption += "\nuseful prefill: a prompt per completion; executed: once for its G"
    return t

def _OFF(flag: str) -> Any:  # noqa: N802 - an Option factory, read like a constant
    """The hidden ``--no-X`` twin of an on/off option ``--X``: typer's ``--X/--no-X`` form puts
    both names in columns of their own, and at 80 columns they squeeze the help (and the names)
    to a cut-off sliver. The help of ``--X`` names its twin."""
    return typer.Option(False, flag, hidden=True)


def _switch(name: str, on: Optional[bool], off: bool) -> Optional[bool]:
    """``--X`` / ``--no-X`` as one value: True, False or ``None`` (not given).

    Raises:
        ConfigError: both given.
    """
    if on and off:
        flag = name.replace("_", "-")
        raise ConfigError(f"{name}: --{flag} and --no-{flag} both given; give one")
    return False if off else on


SWITCHES = "Switches (each with a --no- form)"
"""The help panel of the on/off set-up options: a table of their own, so that their long names
are not cut at 80 columns beside the other options' types."""

ENGINE_HELP = ("Executed-FLOP model: trl-cpu, trl-gpu, trl-vllm (TRL + vLLM rollouts), trl-vllm-cpu "
               "(vLLM rollouts, TRL learning on CPU: vllm-cpu) or verl "
               "(FSDP actor with use_remove_padding, vLLM/SGLang rollouts).")


GENERATED_HELP = ("Prompts generated (and rewarded) per prompt trained, >= 1: DAPO dynamic sampling "
                  "or POLARIS-style filtering (e.g. 3 for verl's gen_batch_size = 3 x "
                  "train_batch_size in one round). Log-prob passes and updates run on the trained "
                  "prompts only. \\[default: 1]")
CRITIC_HELP = ("PPO value model (preset, folder with config.json, or hub id), fully fine-tuned, a "
               "d x 1 head at every position: its forward over every trained rollout and mu x "
               "(forward + backward) are learning; GAE costs 0 FLOPs. Allows -G 1. \\[default: none]")


MICRO_HELP = ("Trained rows per GPU in one forward call of the update: verl's actor "
              "ppo_micro_batch_size_per_gpu (no default: verl requires it "
              "unless use_dynamic_bsz), TRL per_device_train_batch_size (default 8). Only LoRA on "
              "MoE experts reads it: peft folds the expert adapters once per call. "
              "\\[default: 1, allocopt's driver]")
LOG_PROB_MICRO_HELP = ("Rows per GPU in one forward call of the old-policy log-prob pass: verl's "
                       "rollout log-prob micro batch size per GPU (no default); "
                       "TRL uses per_device_train_batch_size. \\[default: --micro-batch-size]")


def account(
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="TOML file with the recipe (keys as the long flags, with _); flags override it."),
    model: Optional[str] = typer.Option(None, help=f"Policy: preset (Qwen/Qwen2.5-1.5B …), folder with config.json, or hub id. \\[default: {D['model']}]"),
    prompt_tokens: Optional[float] = typer.Option(None, help=f"Mean prompt length in tokens. \\[default: {D['prompt_tokens']:g}]"),
    completion_tokens: Optional[float] = typer.Option(None, help=f"Mean completion length in tokens (EOS included). \\[default: {D['completion_tokens']:g}]"),
    completion_max: Optional[float] = typer.Option(None, help="Longest completion of a step in tokens, with --length-distribution. \\[default: the mean]"),
    length_distribution: Optional[str] = typer.Option(None, help="Spread of completion lengths between the mean and --completion-max: constant (all at the mean), uniform (evenly from 2*mean-max to max), one-long (one row at max, the rest equal). \\[default: constant]"),
    lengths: Optional[Path] = typer.Option(None, "--lengths", help="Per-completion lengths instead of means: CSV with the columns prompt_tokens, completion_tokens and (optional) count, or JSON lines {\"prompt_tokens\": 103, \"completion_tokens\": 304[, \"count\": 5]}; count makes a row a histogram bin. Rows in run order, group_size consecutive rows per prompt, a whole number of steps of prompts x G rows; the account is the file's mean step times --steps."),
    prompts: Optional[int] = typer.Option(None, help="Prompts per GRPO step. \\[default: 64]"),
    group_size: Optional[int] = typer.Option(None, "--group-size", "-G", help="Completions per prompt (G). \\[default: 8]"),
    steps: Optional[int] = typer.Option(None, help="GRPO steps (rollout batches). \\[default: 1]"),
    update_passes: Optional[float] = typer.Option(None, help="Passes over each rollout batch, each a forward + backward of every row: these cost FLOPs (mu; TRL num_iterations, verl ppo_epochs). \\[default: 1]"),
    minibatches: Optional[int] = typer.Option(None, help="Optimizer steps per pass (verl train_batch_size / ppo_mini_batch_size; TRL steps_per_generation / gradient_accumulation_steps). FLOP-free: they split a pass; > 1 makes the old-policy log-prob pass run. \\[default: 1]"),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help=MICRO_HELP),
    log_prob_micro_batch_size: Optional[int] = typer.Option(None, "--log-prob-micro-batch-size", help=LOG_PROB_MICRO_HELP),
    beta: Optional[float] = typer.Option(None, help="KL coefficient; > 0 adds a reference pass. \\[default: 0]"),
    importance_sampling_correction: Optional[bool] = typer.Option(None, "--importance-sampling-correction", rich_help_panel=SWITCHES, help="TRL's importance-sampling correction of vLLM rollouts: with trl-vllm it runs the old-policy log-prob pass every step (a floor of ~0.55 under rho); the --no- form: off. \\[default: the runner's: allocopt off, trl on]"),
    no_importance_sampling_correction: bool = _OFF("--no-importance-sampling-correction"),
    lora_rank: Optional[int] = typer.Option(None, help=f"LoRA rank; 0 = full fine-tuning. \\[default: {D['lora_rank']}]"),
    lora_targets: Optional[str] = typer.Option(None, help=f"LoRA target modules (comma separated) or all-linear; on a mixture-of-experts model also experts.gate_up_proj, experts.down_proj (both: experts) and router (peft target_parameters). \\[default: {D['lora_targets']}]"),
    gradient_checkpointing: Optional[bool] = typer.Option(None, "--gradient-checkpointing", rich_help_panel=SWITCHES,
                                                          help="Recompute activations in backward (non-reentrant; executed FLOPs only, never useful); the --no- form: off. \\[default: the runner's: allocopt off, trl on]"),
    no_gradient_checkpointing: bool = _OFF("--no-gradient-checkpointing"),
    reward_model: Optional[str] = typer.Option(None, help="Reward model (e.g. Qwen/Qwen2.5-Math-PRM-7B); omit for a rule-based reward (0 FLOPs)."),
    reward_steps: Optional[float] = typer.Option(None, help=f"Steps per completion for a step-level PRM (one marker token each); used with --reward-model. \\[default: {D['steps_per_completion']:g}]"),
    engine: Optional[str] = typer.Option(None, help=ENGINE_HELP + f" \\[default: {D['engine']}]"),
    runner: Optional[str] = typer.Option(None, help=RUNNER_HELP),
    max_completion_length: Optional[int] = typer.Option(None, help="Generation limit per completion (tokens); part of the set-up's fingerprint. \\[default: 1024, or the longest completion priced when longer]"),
    generated_per_trained: Optional[float] = typer.Option(None, help=GENERATED_HELP),
    critic: Optional[str] = typer.Option(None, help=CRITIC_HELP),
    from_trl: Optional[Path] = typer.Option(None, "--from-trl", help="Account an existing TRL GRPO run from its output folder (trainer_state.json, training_args.bin, adapter_config.json); recipe flags given override what the folder says."),
    from_verl: Optional[Path] = typer.Option(None, "--from-verl", help="Account an existing verl run from its console log or JSON-lines metrics (per-step response_length/mean etc., the printed config); recipe flags given override what the log says."),
    from_openrlhf: Optional[Path] = typer.Option(None, "--from-openrlhf", help="Account an existing OpenRLHF GRPO run from its console log (the namespace(...) config line, 'Global step N: {...}' lines) or a folder of its TensorBoard event files (with the console log next to them for the config)."),
    from_nemo_rl: Optional[Path] = typer.Option(None, "--from-nemo-rl", help="Account an existing NeMo-RL GRPO run from its TensorBoard folder (the tensorboard folder under its logger.log_dir: train, timing/train and performance scalars and the config as hparams)."),
    peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops", help="Peak TFLOP/s of one device (e.g. 989 for an H100 in bf16): with phase timings from --from-verl, print MFU per phase."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    save_throughput: Optional[Path] = typer.Option(None, "--save-throughput", help="With --from-verl/--from-trl and phase timings: write the run's achieved FLOP/s per GPU per phase as a throughput profile (TOML, or JSON for .json) for --throughput."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Name of the GPU the run used (e.g. H100-80GB), recorded in the --save-throughput profile. \\[default: unknown-gpu]"),
) -> None:
    """FLOPs of a GRPO recipe, or of an existing TRL / verl run, by phase and its rho."""
    from allocopt.runlogs.accounting import account_any

    given = dict(model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 completion_max=completion_max, length_distribution=length_distribution,
                 lengths=None if lengths is None else str(lengths),
                 prompts=prompts, group_size=group_size, steps=steps, update_passes=update_passes,
                 minibatches=minibatches, micro_batch_size=micro_batch_size,
                 log_prob_micro_batch_size=log_prob_micro_batch_size, beta=beta, lora_rank=lora_rank, lora_targets=lora_targets,
                 importance_sampling_correction=_switch("importance_sampling_correction",
                                                        importance_sampling_correction,
                                                        no_importance_sampling_correction),
                 gradient_checkpointing=_switch("gradient_checkpointing", gradient_checkpointing,
                                                no_gradient_checkpointing),
                 reward_model=reward_model, reward_steps=reward_steps, engine=engine, runner=runner,
                 max_completion_length=max_completion_length,
                 generated_per_trained=generated_per_trained, critic=critic)
    runs = dict(from_trl=from_trl, from_verl=from_verl, from_openrlhf=from_openrlhf,
                from_nemo_rl=from_nemo_rl)
    result = account_any(recipe, runs=runs, peak_tflops=peak_tflops,
                         save_throughput=save_throughput, gpu=gpu, **given)
    if result.profile is not None:
        err.print(f"throughput profile written to {save_throughput} (set-up "
                  f"{result.profile.setup_fingerprint}, {result.profile.gpu})", highlight=False)
    if as_json:
        out.print_json(json.dumps(dict(result.data)))
        return
    out.print(breakdown_table(result.account, result.title))
    if result.run is not None:
        from allocopt.runlogs.accounting import assumption_lines

        for line in assumption_lines(result.data):
            out.print(line, highlight=False, markup=False, soft_wrap=True)
        print_run_sources(result.run, result.rates)


def _at_dots(name: str, width: int) -> str:
    """A dotted field name too wide for its column, broken after its dots into lines of at
    most ``width`` (a part wider than that alone is folded by the table): each line a whole
    part of the name, not one cut mid-word."""
    lines, line = [], ""
    for part in name.replace(".", ".\0").split("\0"):
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = ""
        line += part
    return "\n".join(lines + [line])


def print_run_sources(run: Any, rates: Any) -> None:
    """Where each number of an imported run (:class:`~allocopt.runlogs.ImportedRun`) came from
    (read or assumed), and its achieved FLOP/s and MFU per timed phase (``rates``)."""
    t = Table(title="Where each number came from")
    values = [*run.fields_read.values(), *run.fields_assumed.values()]
    longest = max((len(k) for k in (*run.fields_read, *run.fields_assumed)), default=5)
    word = max((len(w) for v in values for w in str(v).split()), default=5)
    # a log's field names are the point: whole where the row still fits the console beside the
    # value's longest word and `assumed` (borders: 10), else wrapped, never cut
    field = min(longest, max(16, out.width - 17 - word))
    t.add_column("field", overflow="fold", min_width=field)
    t.add_column("value / source", overflow="fold", max_width=max(word, out.width - 17 - field))
    t.add_column("how")
    for k, v in run.fields_read.items():
        t.add_row(_at_dots(k, field), v, "read")
    for k, v in run.fields_assumed.items():
        t.add_row(_at_dots(k, field), v, "[yellow]assumed[/]")
    out.print(t)
    if rates:
        r = Table(title=f"Achieved FLOP/s over {run.num_devices or 1} device(s)")
        for c in ("phase", "seconds", "executed FLOP/s per device", "MFU"):
            r.add_column(c, justify="left" if c == "phase" else "right")
        for phase, v in rates.items():
            r.add_row(phase, f"{v['seconds']:.1f}", fmt_flops(v["flops_per_second_per_device"]),
                      "-" if v.get("mfu") is None else f"{v['mfu']:.1%}")
        out.print(r)


@takes_time_budget
def plan(
    budget: Optional[str] = typer.Option(None, help="FLOP budget of the run (search + learning + reward), e.g. 1e19; or give a time budget (--budget-gpu-hours / --budget-usd with --throughput)."),
    rho: str = typer.Option(..., help="Update fraction rho = learning / total, in (0, 1)."),
    group_size: int = typer.Option(8, "--group-size", "-G", help="Completions per prompt (G), >= 2."),
    reward: str = typer.Option("sparse", help="Reward system: sparse, structured, dense, proxy_prm, prm."),
    model: Optional[str] = typer.Option(None, help=f"Policy model: preset, folder with config.json, or hub id (the tiny world's sizes tiny, small, medium are planned by `allocopt study --spec studies/tiny-sizes.toml --dry-run`). \\[default: {D['model']}]"),
    rollouts: Optional[int] = typer.Option(None, help=f"Completions per iteration (prompts x G). \\[default: {D['rollouts_per_iteration']}]"),
    prompt_tokens: Optional[float] = typer.Option(None, help=f"Expected prompt length in tokens. \\[default: {D['prompt_tokens']:g}]"),
    completion_tokens: Optional[float] = typer.Option(None, help=f"Expected completion length in tokens. \\[default: {D['completion_tokens']:g}]"),
    steps_per_completion: Optional[float] = typer.Option(None, help=f"Expected reasoning steps per completion (PRM markers). \\[default: {D['steps_per_completion']:g}]"),
    lora_rank: Optional[int] = typer.Option(None, help=f"LoRA rank; 0 = full fine-tuning. \\[default: {D['lora_rank']}]"),
    beta: Optional[float] = typer.Option(None, help=f"KL coefficient; > 0 adds a reference pass. \\[default: {D['beta']:g}]"),
    gradient_checkpointing: Optional[bool] = typer.Option(None, "--gradient-checkpointing", rich_help_panel=SWITCHES,
                                                          help="Recompute activations in backward (non-reentrant); executed FLOPs only; the --no- form: off. \\[default: the runner's: allocopt off, trl on]"),
    no_gradient_checkpointing: bool = _OFF("--no-gradient-checkpointing"),
    importance_sampling_correction: Optional[bool] = typer.Option(None, "--importance-sampling-correction", rich_help_panel=SWITCHES,
                                                                  help="TRL's importance-sampling correction of vLLM rollouts: with trl-vllm an old-policy log-prob pass every iteration (a floor of ~0.55 under rho); the --no- form: off. \\[default: the runner's: allocopt off, trl on]"),
    no_importance_sampling_correction: bool = _OFF("--no-importance-sampling-correction"),
    prm_model: str = typer.Option("Qwen/Qwen2.5-Math-PRM-7B", help="Reward model for reward=prm."),
    engine: Optional[str] = typer.Option(None, help=ENGINE_HELP + " Or auto: the engine this machine runs "
                                         "(CUDA + vLLM: trl-vllm; CUDA: trl-gpu; no CUDA: trl-cpu for a "
                                         f"policy of at most 50M parameters, else trl-vllm). \\[default: {D['engine']}]"),
    runner: Optional[str] = typer.Option(None, help=RUNNER_HELP),
    max_completion_length: Optional[int] = typer.Option(None, help="Generation limit per completion (tokens) the run uses; part of the plan's set-up fingerprint. \\[default: 1024, or --completion-tokens rounded up when longer]"),
    generated_per_trained: Optional[float] = typer.Option(None, help=GENERATED_HELP),
    critic: Optional[str] = typer.Option(None, help=CRITIC_HELP),
    target_steps: Optional[int] = typer.Option(None, help=f"Iterations the plan aims at: a budget that buys more at --rollouts runs a larger batch (up to --max-rollouts) so that it buys about this many, as public recipes fix their steps; 0: off, the batch stays --rollouts. \\[default: {D['target_steps']}]"),
    max_rollouts: Optional[int] = typer.Option(None, help=f"Largest batch (completions per iteration) --target-steps may raise the batch to. \\[default: {D['max_rollouts_per_iteration']}]"),
    train_prompts: Optional[int] = typer.Option(None, help="Prompts in the training set (Polaris-53K: 53,291): the plan shows its epochs over it and warns above 4. \\[default: unknown]"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    time: Optional[dict] = None,  # the time-budget flags (takes_time_budget)
) -> None:
    """The GRPO training plan a FLOP budget buys at an allocation (rho, G, reward)."""
    from allocopt.plan.allocation import Allocation, Workload, default_reward_models, make_plan
    from allocopt.plan.throughput import TimeBudget

    b, t, profile = _plan_budget(budget, time or {})
    gradient_checkpointing = _switch("gradient_checkpointing", gradient_checkpointing, no_gradient_checkpointing)
    importance_sampling_correction = _switch("importance_sampling_correction", importance_sampling_correction,
                                             no_importance_sampling_correction)

    from allocopt.vocabulary import Vocabulary

    Vocabulary().reward(reward)  # the built-in systems: a study file declares others
    alloc = Allocation(rho=_number("rho", rho), group_size=group_size, reward=reward)
    engine, why = _engine_choice(engine, model)
    given = dict(model=model, rollouts_per_iteration=rollouts, prompt_tokens=prompt_tokens,
                 completion_tokens=completion_tokens, steps_per_completion=steps_per_completion,
                 lora_rank=lora_rank, beta=beta, gradient_checkpointing=gradient_checkpointing,
                 importance_sampling_correction=importance_sampling_correction, engine=engine,
                 runner=runner, max_completion_length=max_completion_length,
                 generated_per_trained=generated_per_trained, critic=critic, max_rollouts_per_iteration=max_rollouts,
                 train_prompts=train_prompts)
    # the set-up's own defaults (the ones account, the meter and the driver take) for the rest
    setup = TrainingSetup(**{k: v for k, v in given.items() if v is not None},
                          **({} if target_steps is None else {"target_steps": target_steps or None}))
    reward_models = {**default_reward_models(), "prm": model_shape(prm_model)}
    policy = model_shape(setup.model)
    policy.check_length(round(setup.prompt_tokens + setup.completion_tokens))
    w = Workload(policy, setup, reward_models)
    tb = None
    if profile is not None:
        profile.check_for(w.fingerprint(alloc))
        tb = TimeBudget(t["budget_gpu_hours"] if t else 1.0, profile, t["gpus"] if t else 1)
    if b is None:
        b = tb.flops_for(alloc, w)
    p = make_plan(b, alloc, w)
    hours = tb.hours_of(p.expected.executed) if tb is not None else None
    if as_json:
        out.print_json(json.dumps({**p.to_dict(), **({"expected_gpu_hours": hours, "gpus": tb.gpus,
                                                      "throughput": profile.to_dict()} if tb else {})}))
    else:
        print_plan(p, setup)
        if tb is not None:
            print_hours(p, tb, time_budget=t is not None)
        out.print(f"engine: {setup.engine} ({why})", highlight=False, markup=False, soft_wrap=True)


def _plan_budget(budget: Optional[str], time: dict) -> tuple[Optional[float], Optional[dict], Any]:
    """``plan``'s budget, parsed once: ``(FLOPs or None, the time budget's flags or None, the
    throughput profile or None)``; a time budget becomes the allocation's FLOPs later, when its
    workload is known. One line (ConfigError) for both or neither, or ``--gpus`` alone."""
    from allocopt.cli.common import read_one_budget
    from allocopt.plan.allocation import check_budget
    from allocopt.plan.throughput import ThroughputProfile, load_profile

    budget_gpu_hours, gpus, budget_usd, throughput = (time.get(k) for k in (
        "budget_gpu_hours", "gpus", "budget_usd", "throughput"))
    t = read_one_budget(budget, {**time, "throughput": throughput if budget_gpu_hours is not None
                                 or budget_usd is not None else None})
    if budget is None and t is None:
        raise ConfigError("budget: missing; give --budget FLOPS (e.g. 1e19) or --budget-gpu-hours H "
                          "with --throughput FILE")
    if gpus is not None and t is None:
        raise ConfigError("gpus: only used with a time budget (--budget-gpu-hours or --budget-usd)")
    b = None if budget is None else check_budget(budget)  # parsed once, here: FLOPs from now on
    profile = (ThroughputProfile.from_mapping(t["throughput"]) if t is not None
               else load_profile(throughput) if throughput is not None else None)
    return b, t, profile


def _engine_choice(engine: Optional[str], model: Optional[str]) -> tuple[Optional[str], str]:
    """``(engine, why)`` for ``plan --engine``: ``auto`` resolved for this machine
    (:func:`allocopt.plan.machine.resolve_engine`), any other as given, none: the default."""
    if engine is None:
        return None, "the default, TRL + vLLM on a GPU; --engine auto: this machine's"
    if engine != "auto":
        return engine, "as set"
    from allocopt.plan.machine import has_cuda, has_vllm, resolve_engine

    policy = model_shape(model or D["model"])
    return resolve_engine("auto", cuda=has_cuda(), vllm=has_vllm(), policy_params=policy.num_params())


def print_plan(p: Any, setup: Any) -> None:
    """The plan ``p`` (a :class:`~allocopt.plan.allocation.TrialPlan`) made for ``setup``: its
    allocation asked and realized, batch, passes, iterations and expected FLOPs."""
    alloc = p.allocation
    t = Table(title=f"Plan for {fmt_flops(p.budget_flops)} FLOPs", show_header=False)
    for k, v in (("model", p.policy), ("reward", f"{alloc.reward} ({p.reward_model or 'rule-based, 0 FLOPs'})"),
                 ("set-up", f"runner {setup.runner}, engine {setup.engine}, checkpointing "
                            f"{'on' if setup.gradient_checkpointing else 'off'}, IS correction "
                            f"{'on' if setup.importance_sampling_correction else 'off'}, limit "
                            f"{setup.max_completion_length} tokens, fingerprint {p.setup_fingerprint}"
                            + (f", {setup.generated_per_trained:g} prompts generated per prompt trained"
                               if setup.generated_per_trained != 1 else "")
                            + (f", critic {setup.critic}" if setup.critic else "")),
                 ("asked rho", f"{alloc.rho:g}"),
                 ("realized rho", f"{p.realized_rho:.4f}" + ("" if p.realizable else "  (NOT realizable within 0.01)")),
                 ("group size G", p.group_size),
                 ("prompts / iteration", f"{p.prompts_per_iteration}" + batch_note(p, setup)),
                 ("rollouts / iteration", p.rollouts_per_iteration),
                 ("update passes mu", f"{p.update_passes:.4f} ({p.rows_trained_per_iteration:.2f} rows trained per iteration; TRL num_iterations={p.num_iterations_trl})"),
                 ("iterations", f"{p.iterations}" + ("" if p.last_iteration_rows is None else
                                                      f" (the last trains {p.last_iteration_rows} rows: "
                                                      "cut to what fits)")),
                 ("epochs", "unknown (give the training set's size: --train-prompts)" if p.epochs is None
                  else f"{p.epochs:.2f} over {p.train_prompts:,} training prompts"),
                 ("FLOPs / iteration", fmt_flops(p.per_iteration.executed.total_flops)),
                 ("expected total", f"{fmt_flops(p.expected.executed.total_flops)} ({p.budget_utilization:.2%} of budget)")):
        t.add_row(k, str(v))
    out.print(t)
    out.print(breakdown_table(p.expected, "Expected FLOPs of the whole plan"))
    if p.warning:
        err.print(f"warning: {p.warning}", highlight=False, markup=False)
    if not p.realizable:
        err.print(f"warning: rho={alloc.rho:g} is not realizable with {p.rollouts_per_iteration} "
                  f"rollouts per iteration; the nearest is {p.realized_rho:.4f}")


def batch_note(p: Any, setup: Any) -> str:
    """Why plan ``p`` runs the batch it runs, when not the set-up's: a larger one so that the
    budget buys about ``target_steps`` iterations, or a smaller one that spends more of it."""
    own = max(1, setup.rollouts_per_iteration // p.group_size)
    if p.prompts_per_iteration == own:
        return ""
    if p.prompts_per_iteration > own:
        return (f" (the set-up's {own}, raised so that the budget buys about target_steps="
                f"{setup.target_steps} iterations; at most {setup.largest_rollouts_per_iteration} rollouts)")
    return f" (of the set-up's {own}: a smaller batch spends more of the budget)"


def print_hours(p: Any, tb: Any, time_budget: bool) -> None:
    """Expected GPU-hours of plan ``p`` per phase at ``tb``'s profile (FLOPs / per-GPU FLOP/s
    / GPUs, summed over the GPUs), with each rate and its source."""
    from allocopt.plan.throughput import phase_flops

    prof = tb.profile
    hours = tb.hours_of(p.expected.executed)
    head = (f"Time budget {tb.gpu_hours:g} GPU-hours on {tb.gpus} GPU(s) = {fmt_flops(p.budget_flops)} FLOPs "
            f"at this allocation" if time_budget else "Expected time")
    t = Table(title=f"{head} ({prof.gpu}, profile of set-up {prof.setup_fingerprint})")
    for c in ("phase", "FLOPs", "FLOP/s per GPU", "GPU-hours", "source"):
        t.add_column(c, justify="left" if c in ("phase", "source") else "right")
    for ph, f in phase_flops(p.expected.executed).items():
        r = prof.rate(ph)
        t.add_row(ph, fmt_flops(f), "-" if r is None else fmt_flops(r), f"{hours[ph]:.2f}",
                  prof.sources.get(ph, "given"))
    t.add_row("total", fmt_flops(p.expected.executed.total_flops), "", f"{hours['total']:.2f}",
              f"wall {hours['total'] / tb.gpus:.2f} h on {tb.gpus} GPU(s)")
    out.print(t)


def register(app: typer.Typer) -> None:
    """Add ``account`` and ``plan`` to the ``allocopt`` app."""
    app.command()(account)
    app.command()(plan)


__all__ = ["account", "plan", "register"]
