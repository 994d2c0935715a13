"""Runs launched elsewhere: reserve trials of a study (ask), turn each into a ready TRL or verl
config, and record what came back (tell).

``ask`` reserves trials with Optuna's ``study.ask()`` (the study's own sampler, so pilots and
proposals are what a worker would run) and leaves them RUNNING *without* a heartbeat, which
:mod:`allocopt.store.heartbeat` reads as "reserved for a run launched elsewhere": no worker fails them.
Each gets a plan (:func:`allocopt.plan.allocation.make_plan`) realized with whole update passes,
as TRL (``num_iterations``) and verl (``ppo_epochs``) run them: the whole-pass count nearest the
plan's ρ, and the iterations that count buys within the budget (:class:`AskedRun`). Neither
engine can train part of a batch, so ρ moves in steps of one pass: the run's ``expected_rho``
can differ from the asked ρ (allocopt's own driver realizes fractional passes); the trial keeps
the asked ρ as its parameter and ``tell`` records the ρ actually spent.

``tell`` records targets and the compute a run actually spent, exactly as a trial run by
allocopt is recorded (same user attributes, the ``budget`` constraint, ``study.tell``), so the
surrogate learns from it like from any other trial. A run that spent more than its budget is
recorded and flagged (``over_budget``, a violated ``budget`` constraint).

Mappings (one optimizer step per pass over a rollout batch, as the allocopt driver runs it;
the learning rate is per optimizer step and is not scaled by the passes):

===================  ===========================================  =================================================
plan                 TRL ``GRPOConfig``                            verl (Hydra overrides)
===================  ===========================================  =================================================
rollouts N           ``generation_batch_size = N``                 ``data.train_batch_size = N / G`` (prompts)
group size G         ``num_generations``                           ``actor_rollout_ref.rollout.n``
passes μ             ``num_iterations``                            ``actor_rollout_ref.actor.ppo_epochs``
one step per pass    ``per_device_train_batch_size × processes ×   ``actor_rollout_ref.actor.ppo_mini_batch_size =
                     gradient_accumulation_steps = N``             N / G`` (prompts; verl multiplies by n)
iterations I         ``max_steps = I × μ`` (optimizer steps)       ``trainer.total_training_steps = I``
===================  ===========================================  =================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from allocopt.plan.allocation import (Allocation, InfeasiblePlan, TrialPlan, Workload,
                                 iteration_flops, make_plan, plan_workload)
from allocopt.flops import ComputeBreakdown, ConfigError, FlopAccount
from allocopt.plan.engines import trl_grpo_config, verl_entrypoint, verl_overrides as _verl_overrides
from allocopt.record import (TrialRecord, write_asked, write_complete, write_infeasible,
                             write_start)
from allocopt.spec import SearchSpace, StudySpec

FORMATS = ("trl", "verl")


from allocopt.errors import TellError  # noqa: E402,F401  (defined there; imported from here too)


@dataclass(frozen=True)
class AskedRun:
    """One reserved trial and the run that realizes it with whole update passes."""

    trial_number: int
    budget_flops: float
    fidelity: str
    """``full`` or ``pilot``."""
    plan: TrialPlan
    """allocopt's own plan (may have fractional passes μ)."""
    passes: int
    """Whole update passes over each rollout batch (TRL ``num_iterations``, verl ``ppo_epochs``)."""
    iterations: int
    """Rollout batches (GRPO iterations) the budget buys at ``passes``."""
    expected: FlopAccount
    """Expected FLOPs of the run at ``passes`` × ``iterations`` (mean lengths of the workload)."""

    @property
    def expected_rho(self) -> float:
        return self.expected.executed.rho

    def to_dict(self) -> dict[str, Any]:
        a = self.plan.allocation
        return {"trial": self.trial_number, "budget_flops": self.budget_flops,
                "fidelity": self.fidelity, "rho": a.rho, "group_size": a.group_size,
                "reward": a.reward, "model": self.plan.policy, "reward_model": self.plan.reward_model,
                "prompts_per_iteration": self.plan.prompts_per_iteration,
                "rollouts_per_iteration": self.plan.rollouts_per_iteration,
                "update_passes": self.passes, "iterations": self.iterations,
                "expected_rho": self.expected_rho,
                "expected_total_flops": self.expected.executed.total_flops,
                "plan_update_passes": self.plan.update_passes, "plan_iterations": self.plan.iterations}


def spec_of(study: Any) -> StudySpec:
    """The :class:`StudySpec` a study was run with (its ``spec`` user attribute).

    Raises:
        TellError: the study has no spec (it was not made by ``allocopt study``/``race``).
    """
    d = dict(study.user_attrs.get("spec") or {})
    if not d:
        raise TellError(f"study={study.study_name!r}: has no allocopt spec; start it with "
                        "`allocopt study` (e.g. --trials 0) first")
    d["space"] = SearchSpace(**{k: tuple(v) if isinstance(v, list) else v
                                for k, v in (d.get("space") or {}).items()})
    if isinstance(d.get("target"), list):
        d["target"] = tuple(d["target"])
    return StudySpec(**d)


def whole_pass_run(plan: TrialPlan, workload: Workload, trial_number: int = -1,
                   fidelity: str = "full") -> AskedRun:
    """The plan realized with whole passes: μ in {floor, ceil} of the plan's, whichever's ρ is
    nearer the asked one, and the most iterations whose expected FLOPs fit the budget.

    Raises:
        InfeasiblePlan: not one iteration fits.
    """
    a, N = plan.allocation, plan.rollouts_per_iteration
    workload = plan_workload(workload, plan)  # the plan's batch (it may be smaller than the workload's)
    best = None
    for passes in sorted({max(1, math.floor(plan.update_passes)), max(1, math.ceil(plan.update_passes))}):
        per = iteration_flops(workload, a, passes * N)
        iters = int(plan.budget_flops // max(1, per.executed.total_flops))
        if iters < 1:
            continue
        cand = (abs(per.executed.rho - a.rho), passes, iters, per * iters)
        best = cand if best is None or cand < best else best
    if best is None:
        need = iteration_flops(workload, a, max(1, round(plan.update_passes)) * N).executed.total_flops
        raise InfeasiblePlan(f"budget_flops={plan.budget_flops:.3g}: no whole-pass run fits one "
                             f"iteration (needs {need:.3g})", min_budget_flops=need)
    _, passes, iters, expected = best
    return AskedRun(trial_number, plan.budget_flops, fidelity, plan, passes, iters, expected)


def reserve(study: Any, spec: StudySpec, workload: Workload, n: int, fmt: str,
            distributions: Mapping[str, Any], max_tries: int = 20,
            reserved: list[int] | None = None) -> tuple[list[AskedRun], int]:
    """Reserve ``n`` runnable trials with the study's sampler.

    A proposal the budget cannot buy is recorded at once as INFEASIBLE with a violated
    ``budget`` constraint, as a worker would, and another is asked (at most ``max_tries`` per
    trial). Whole passes realize ρ in steps (one pass more is a jump in learning FLOPs): the
    run's ``expected_rho`` may differ from the asked ρ (shown by ``ask``, and ``allocopt tell``
    records the ρ the run really spent); the trial keeps the asked ρ as its parameter.

    ``reserved`` (a list) gets each asked trial's number as soon as it is asked, so a caller
    that fails half-way can :func:`release` them (those already told INFEASIBLE are skipped).

    Returns:
        ``(runs, infeasible)``: the reserved runs and how many proposals were infeasible.
    """
    import os
    import socket

    from allocopt.store.claims import reserving
    from allocopt.store.heartbeat import ASKING_ATTR

    runs: list[AskedRun] = []
    infeasible = 0
    while len(runs) < n:
        if infeasible >= max_tries * n:
            break
        with reserving():  # no heartbeat: reserved for a run elsewhere, never failed as stale
            trial = study.ask(dict(distributions))
        if reserved is not None:
            reserved.append(trial.number)
        # who reserves it: a reservation cut short (no `asked` record) whose ask is gone is
        # failed when the study is next opened (allocopt.store.settle.reconcile_on_open)
        trial.storage.set_trial_system_attr(trial._trial_id, ASKING_ATTR, f"{socket.gethostname()}:{os.getpid()}")
        if hasattr(study.sampler, "suggest"):  # RaceSampler: fidelity and budget of this trial
            with reserving():
                study.sampler.suggest(trial)
        rec = TrialRecord.of(trial)
        from allocopt.spec import allocation_of

        alloc: Allocation = allocation_of(spec, trial.params)
        budget = rec.budget(spec.budget_for(alloc, workload))
        fidelity = rec.fidelity
        try:
            plan = make_plan(budget, alloc, workload)
            run = whole_pass_run(plan, workload, trial.number, fidelity)
        except InfeasiblePlan as e:
            excess = math.log10(max(e.min_budget_flops, 1) / budget) if e.min_budget_flops else 1.0
            trial.set_constraint("budget", max(excess, 1e-6))
            write_infeasible(trial, str(e))
            write_start(trial, budget_flops=budget, fidelity=fidelity)
            study.tell(trial, [0.0] * len(spec.targets))
            infeasible += 1
            continue
        write_start(trial, budget_flops=budget, fidelity=fidelity)
        write_asked(trial, plan.to_dict(), {"format": fmt, **run.to_dict()})
        runs.append(run)
    return runs, infeasible


def release(study: Any, numbers: list[int]) -> list[int]:
    """Give back trials reserved by a command that then failed (an unwritable ``--out``, an
    error, Ctrl-C): each still RUNNING is failed as interrupted
    (:func:`allocopt.record.write_interrupted`), so the next opening of the study enqueues its
    work to be asked again (:func:`allocopt.store.settle.requeue_interrupted`) instead of
    leaving it RUNNING for ever. Best effort per trial.

    Returns:
        the numbers released.
    """
    import optuna
    from optuna.trial import TrialState

    from allocopt.record import write_interrupted
    from allocopt.store.handles import trial_handle

    done = []
    for number in numbers:
        try:
            if study.get_trials(deepcopy=False)[number].state != TrialState.RUNNING:
                continue
            handle = trial_handle(study, number)
            if handle is not None:
                write_interrupted(optuna.trial.Trial(study, handle[1]))
            study.tell(number, state=TrialState.FAIL)
            done.append(number)
        except Exception:  # noqa: BLE001 - the others are still given back
            continue
    return done


# ----------------------------------------------------------------------------- configs
def trl_config(run: AskedRun, *, learning_rate: float, max_completion_length: int,
               temperature: float = 1.0, beta: float = 0.0, micro_batch: int = 8,
               num_processes: int = 1, seed: int = 0,
               importance_sampling_correction: bool = False,
               gradient_checkpointing: bool = False) -> dict[str, Any]:
    """``GRPOConfig`` fields that realize ``run`` (see the module table).

    ``vllm_importance_sampling_correction`` and ``gradient_checkpointing`` are written as the
    plan priced them (the study's set-up; allocopt's runner: both off, where TRL's own
    defaults are on, :data:`allocopt.plan.setup.RUNNERS`).

    ``per_device_train_batch_size`` is the largest divisor of ``N / num_processes`` that is at
    most ``micro_batch``; ``gradient_accumulation_steps`` makes one optimizer step per pass.

    Raises:
        ConfigError: ``N`` is not a multiple of ``num_processes``.
    """
    return trl_grpo_config(run.plan, passes=run.passes, iterations=run.iterations,
                           micro_batch=micro_batch, num_processes=num_processes,
                           learning_rate=learning_rate, max_completion_length=max_completion_length,
                           temperature=temperature, beta=beta, seed=seed,
                           importance_sampling_correction=importance_sampling_correction,
                           gradient_checkpointing=gradient_checkpointing)


def trl_command(cfg: Mapping[str, Any], config_path: str) -> str:
    """A ``trl grpo`` command line reading the fields from ``config_path`` (model, data and
    reward functions are the user's: placeholders in capitals)."""
    return (f"trl grpo --config {config_path} --model_name_or_path POLICY --dataset_name DATASET "
            "--reward_funcs REWARD --output_dir OUT")


def verl_overrides(run: AskedRun, *, learning_rate: float, max_completion_length: int,
                   temperature: float = 1.0, beta: float = 0.0,
                   gradient_checkpointing: bool = False) -> list[str]:
    """Hydra overrides for verl's ``main_ppo`` with ``algorithm.adv_estimator=grpo`` that realize
    ``run`` (see the module table). A model-based reward names its reward model; a rule-based
    one expects the user's ``custom_reward_function``."""
    return _verl_overrides(run.plan, passes=run.passes, iterations=run.iterations,
                           learning_rate=learning_rate, max_completion_length=max_completion_length,
                           temperature=temperature, beta=beta,
                           gradient_checkpointing=gradient_checkpointing)


# ----------------------------------------------------------------------------- tell
MAX_TOLD_FLOPS = 1e30
"""Most FLOPs one phase of a told trial may report: about 30,000 years of a 1 EFLOP/s cluster;
a larger count is a unit mistake, not a run."""
def account_from_metrics(d: Mapping[str, Any]) -> FlopAccount | None:
    """A :class:`FlopAccount` from ``search_flops``/``learning_flops``/``reward_flops`` (executed;
    ``useful_*`` optional, else the same) at the top level or under ``breakdown``; ``None``
    when none is given.

    Raises:
        ConfigError: a value that is not a number from 0 to :data:`MAX_TOLD_FLOPS`, or only
            some phases given.
    """
    src = d.get("breakdown") if isinstance(d.get("breakdown"), Mapping) else d
    keys = ("search_flops", "learning_flops", "reward_flops")
    if not any(k in src for k in keys):
        return None

    def phases(prefix: str) -> ComputeBreakdown:
        vals = {}
        for k in keys:
            v = src.get(prefix + k, src.get(k) if prefix else None)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or v > MAX_TOLD_FLOPS:
                raise ConfigError(f"{prefix}{k}={v!r}: must be a number of FLOPs from 0 to "
                                  f"{MAX_TOLD_FLOPS:.0e}")
            vals[k.split("_")[0]] = {"total": int(round(v))}
        return ComputeBreakdown(**vals)

    return FlopAccount(useful=phases("useful_"), executed=phases(""))


def targets_from_metrics(d: Mapping[str, Any], spec: StudySpec) -> dict[str, float]:
    """The study's targets (by key: ``pass_at_1``) from ``d`` or ``d["targets"]``, spelled
    either way (``pass@1`` or ``pass_at_1``), checked against the study's vocabulary.

    Raises:
        ConfigError: a target is missing, not a finite number or outside its declared range,
            or ``d["targets"]`` names a target the study does not know.
    """
    out = metric_targets(d, spec.vocabulary)
    missing = [t for t, k in zip(spec.targets, spec.target_keys) if k not in out]
    if missing:
        wanted = ", ".join(f"{t} ({dr})" for t, dr in zip(spec.targets, spec.directions))
        raise ConfigError(f"metrics: target {', '.join(missing)} missing; the study's targets: {wanted}")
    return out


def metric_targets(d: Mapping[str, Any], vocabulary: Any = None) -> dict[str, float]:
    """Every known target ``d`` (or ``d["targets"]``) holds, by key, each checked by its
    definition (a finite number, inside its range: ``pass@1`` a share in [0, 1]). With a study's
    ``vocabulary``, a ``targets`` table may name no other target; without one (``tell`` checks
    its metrics file so before it opens the storage) the built-in targets are checked and
    other names left to the study.

    Raises:
        ConfigError: a value that is not a finite number or is outside its range; an
            undeclared name in ``d["targets"]`` (with ``vocabulary``).
    """
    from allocopt.vocabulary import Vocabulary

    vocab = vocabulary if vocabulary is not None else Vocabulary()
    table = d.get("targets") if isinstance(d.get("targets"), Mapping) else None
    src = table if table is not None else d
    out: dict[str, float] = {}
    for t in vocab.targets:
        v = src.get(t.name, src.get(t.key))
        if v is not None:
            out[t.key] = t.check_value(v)
    if table is not None and vocabulary is not None:
        known = {n for t in vocab.targets for n in (t.name, t.key)}
        extra = next((str(k) for k in table if k not in known), None)
        if extra is not None:
            raise ConfigError(f"metrics: target {extra[:80]!r} is not declared by the study; declared: "
                              f"{', '.join(t.name for t in vocab.targets)} (declare it in the study "
                              "file's [targets] table, or leave it out of \"targets\")")
    return out


def check_tellable(study: Any, number: int) -> Any:
    """The FrozenTrial ``number`` if it is reserved by ask and still RUNNING.

    Raises:
        TellError: unknown trial, already finished, or a worker's live trial.
    """
    trials = study.get_trials(deepcopy=False)
    match = [t for t in trials if t.number == number]
    if not match:
        raise TellError(f"trial={number}: no such trial in study {study.study_name!r} "
                        f"({len(trials)} trials, numbers 0..{len(trials) - 1})")
    t = match[0]
    rec = TrialRecord.of(t)
    if rec.optuna_state != "RUNNING":
        raise TellError(f"trial={number}: already finished ({rec.state}); nothing changed")
    if rec.asked is None:
        who = t.system_attrs.get("allocopt.worker", "a worker")
        raise TellError(f"trial={number}: is being run by {who}, not reserved by allocopt ask; "
                        "nothing changed")
    return t


def record(study: Any, frozen: Any, spec: StudySpec, targets: Mapping[str, float],
           spent: FlopAccount, *, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record a reserved trial as COMPLETE with the writer :func:`allocopt.study.trial.run_one_trial`
    uses (:func:`allocopt.record.write_complete`: ``state``, ``targets``, ``metrics``), the
    ``budget`` constraint, plus ``over_budget`` and ``source=tell``.

    Returns:
        the metrics dict recorded.

    Raises:
        TellError: another ``tell`` of the same trial finished it first (two at once: one wins,
            the other gets this one line). On SQLite the check and the writes hold an exclusive
            ``flock`` on the database file, so the loser writes nothing; on a server database
            Optuna's row lock refuses the loser's finishing write.
    """
    import optuna

    from allocopt.store.handles import sqlite_file_lock, trial_handle

    rec = TrialRecord.of(frozen)
    budget = rec.budget(spec.budget_flops)
    used = spent.executed.total_flops
    metrics = {**spent.to_dict(), "budget_utilization": used / budget, "eval_flops": 0,
               "planned_rho": (rec.asked or {}).get("expected_rho", rec.plan.get("realized_rho", math.nan)),
               **dict(extra or {})}
    handle = trial_handle(study, frozen.number)
    if handle is None:
        raise KeyError(f"study {study.study_name!r} was not opened by open_study")
    storage, tid = handle
    trial = optuna.trial.Trial(study, tid)
    over = used > budget
    constraint = math.log10(used / budget) if over else -1.0
    finished = TellError(f"trial={frozen.number}: already finished (told by another tell at the same "
                         "time); nothing changed")
    with sqlite_file_lock(storage):  # one tell at a time per SQLite file: re-read, then write
        if storage.get_trial(tid).state.is_finished():
            raise finished
        _write_told(study, trial, frozen.number, spec, targets, metrics, over, constraint, finished)
    return metrics


def _write_told(study: Any, trial: Any, number: int, spec: StudySpec, targets: Mapping[str, float],
                metrics: Mapping[str, Any], over: bool, constraint: float, finished: TellError) -> None:
    import optuna

    from allocopt.study.trial import set_dashboard_constraint

    try:
        trial.set_constraint("budget", constraint)
        set_dashboard_constraint(study, trial, constraint)  # as run_one_trial: optuna-dashboard's form too
        write_complete(trial, targets, metrics, over_budget=over, source="tell")  # as run_one_trial does
        study.tell(number, [float(targets[k]) for k in spec.target_keys])
    except optuna.exceptions.UpdateFinishedTrialError:  # a server database's row lock
        raise finished from None
    except ValueError as e:  # Study.tell: "Cannot tell a COMPLETE trial."
        if "Cannot tell" not in str(e):
            raise
        raise finished from None


# ----------------------------------------------------------------------------- the folder
def write_asked_folder(run: AskedRun, folder: Any, *, study: str, storage: str, fmt: str, spec: StudySpec,
                       setup: Any, learning_rate: float, micro_batch: int = 8, num_processes: int = 1,
                       tell: bool = True) -> dict[str, Any]:
    """Write one trial's folder as ``allocopt ask`` does: ``ask.json`` (study, trial, budget,
    fidelity, allocation, the whole-pass run, the config, a command line and, with ``tell``, the
    ``allocopt tell`` line to run afterwards) and ``grpo_config.json`` (TRL ``GRPOConfig``
    fields, :func:`trl_config`) or ``verl_overrides.txt`` (one Hydra override a line,
    :func:`verl_overrides`).

    Args:
        run: the reserved run (:func:`whole_pass_run`).
        folder: the trial's folder (``pathlib.Path``; made if missing).
        fmt: ``trl`` or ``verl``.
        setup: the workload's :class:`~allocopt.plan.setup.TrainingSetup` (lengths, temperature,
            β, gradient checkpointing and the importance-sampling correction as priced).
        learning_rate: per optimizer step.

    Returns:
        what ``ask.json`` holds, plus ``folder``.
    """
    import json
    from pathlib import Path

    from allocopt.redact import without_password

    folder = Path(folder)
    bare, variable = without_password(storage)
    run_kw = dict(max_completion_length=setup.max_completion_length, temperature=setup.temperature,
                  beta=setup.beta, gradient_checkpointing=setup.gradient_checkpointing)
    folder.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"study": study, "storage": bare, **run.to_dict(),
                            "format": fmt, "learning_rate": learning_rate}
    if variable:  # the password is never written: the database client reads it from there
        info["credentials"] = f"set {variable} (the storage's password) before running `tell`"
    if tell:
        info["tell"] = (f"allocopt tell --study {study} --storage '{bare}' --trial "
                        f"{run.trial_number} --metrics metrics.json"
                        + (" --from-trl OUT" if fmt == "trl" else " --from-verl LOG"))
    if fmt == "trl":
        cfg = trl_config(run, learning_rate=learning_rate, **run_kw, micro_batch=micro_batch,
                         num_processes=num_processes, seed=spec.seed + run.trial_number,
                         importance_sampling_correction=setup.importance_sampling_correction)
        (folder / "grpo_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        info.update(config=cfg, command=trl_command(cfg, str(folder / "grpo_config.json")))
    else:
        ov = verl_overrides(run, learning_rate=learning_rate, **run_kw)
        (folder / "verl_overrides.txt").write_text("\n".join(ov) + "\n")
        info.update(overrides=ov, command=f"python -m {verl_entrypoint(ov)} " + " ".join(ov))
    (folder / "ask.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return {**info, "folder": str(folder)}


def reserve_and_write(st: Any, spec: StudySpec, workload: Any, n: int, fmt: str, dists: Mapping[str, Any],
                      out_dir: Any, *, study: str, storage: str, learning_rate: float, micro_batch: int,
                      num_processes: int) -> tuple[list[AskedRun], int, list[dict[str, Any]]]:
    """``allocopt ask``'s work: reserve ``n`` runnable trials (:func:`reserve`) and write each
    one's folder under ``out_dir`` (:func:`write_asked_folder`, ``trial-<N>/``). A failure after
    reserving gives the reserved trials back (:func:`release`: asked again next time).

    Returns:
        ``(runs, infeasible proposals recorded, what each ask.json holds)``.

    Raises:
        ConfigError: ``out_dir`` cannot be written (one line; the trials given back).
    """
    from pathlib import Path

    from allocopt.errors import ConfigError

    reserved: list[int] = []
    try:
        runs, n_infeasible = reserve(st, spec, workload, n, fmt, dists, reserved=reserved)
        shown = [write_asked_folder(run, Path(out_dir) / f"trial-{run.trial_number}", study=study,
                                    storage=storage, fmt=fmt, spec=spec, setup=workload.setup,
                                    learning_rate=learning_rate, micro_batch=micro_batch,
                                    num_processes=num_processes) for run in runs]
    except BaseException as e:
        given = release(st, reserved)
        if isinstance(e, OSError):
            raise ConfigError(f"out={str(out_dir)!r}: cannot be written ({e.strerror or e}); "
                              f"{len(given)} reserved trial(s) given back") from None
        raise
    return runs, n_infeasible, shown
