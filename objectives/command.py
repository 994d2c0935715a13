"""The ``command`` objective: each trial runs the user's own training stack.

For every trial the study asks, this objective

1. writes the trial's folder as ``allocopt ask`` does (``ask.json`` and TRL ``grpo_config.json``
   or verl ``verl_overrides.txt``: :func:`allocopt.plan.handoff.write_asked_folder`, the plan
   realized with whole update passes, :func:`allocopt.plan.handoff.whole_pass_run`);
2. runs the user's command (a shell template, e.g. ``bash train.sh {trial_dir}``; a ``torchrun``,
   ``accelerate launch``, verl-on-Ray or ``sbatch --wait`` line all fit) in its own process
   group, its output in ``<trial_dir>/command.log``, and waits at most ``timeout_s``;
3. reads the targets from the metrics file the command leaves (the JSON ``allocopt tell
   --metrics`` reads: :func:`allocopt.run_metrics.targets_from_metrics`) and the compute from
   the run's logs (the ``--from-trl`` / ``--from-verl`` importers, :mod:`allocopt.runlogs`);
4. returns a :class:`~allocopt.objective.TrialResult`, so the study records the trial as
   ``allocopt tell`` would (a run that spent more than its budget is flagged ``over_budget``).

A command that exits non-zero, runs past ``timeout_s`` (its process group is killed) or leaves
no metrics file, or a metrics file without the study's target, fails its trial with one line
naming the trial's folder and log; the study goes on. Workers on PostgreSQL then drive any
cluster the user has (``allocopt workers`` starts one per GPU on a host).

Placeholders of the template (each shell-quoted): ``{trial_dir}`` (required: the trial's
folder), ``{config}`` (``grpo_config.json`` or ``verl_overrides.txt`` in it), ``{overrides}``
(verl: the Hydra overrides, space-separated; TRL: empty), ``{trial}`` (the trial's number),
``{seed}``. Standard library and allocopt only; the command runs in the study's working folder.
"""

from __future__ import annotations

import errno
import os
import shlex
import string
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocopt.errors import ObjectiveUnavailable, TrialFailed
from allocopt.flops import ConfigError
from allocopt.objective import TrialResult
from allocopt.plan.allocation import TrialPlan, Workload
from allocopt.plan.setup import TrainingSetup
from objectives.command_process import end_orphans

FORMATS = ("trl", "verl")
PLACEHOLDERS = ("trial_dir", "config", "overrides", "trial", "seed")
KILL_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL to a timed-out command's process group."""


@dataclass(frozen=True)
class CommandSettings:
    """Settings of the ``command`` objective (``--set key=value``, a study's
    ``[objective_settings]``); the :class:`~allocopt.plan.setup.TrainingSetup` keys among them
    (``model``, ``prompt_tokens``, ``completion_tokens``, ``rollouts_per_iteration``, ``runner``,
    …) describe the user's run, which plans are priced on."""

    command: str = ""
    """Shell template run once per trial; must contain ``{trial_dir}`` (see the module's
    placeholders), e.g. ``bash train.sh {trial_dir}``."""
    timeout_s: float = 86400.0
    """Wall seconds a trial's command may run before its process group is killed and the
    trial fails."""
    format: str = "trl"
    """What the trial's folder holds and which log importer reads the compute: ``trl``
    (``grpo_config.json``; ``--from-trl``) or ``verl`` (``verl_overrides.txt``; ``--from-verl``)."""
    metrics_file: str = "metrics.json"
    """The JSON file the command leaves, relative to the trial's folder: the targets (e.g.
    ``{"targets": {"pass@1": 0.52}}``), as ``allocopt tell --metrics`` reads it."""
    log: str = ""
    """Where the compute is read, relative to the trial's folder: the TRL ``output_dir``
    (``trainer_state.json``, ``training_args.bin``, the adapter) or the verl console log;
    ``metrics``: the ``search_flops`` / ``learning_flops`` / ``reward_flops`` in the metrics
    file. Empty: the trial's folder (trl) or ``command.log`` (verl, whose console is logged there)."""
    out_dir: str = "trials"
    """Folder of the trials' folders: ``<out_dir>/<study>/trial-<N>/``."""
    plan_objective: str = ""
    """An objective whose workload plans are priced on (e.g. ``tiny`` for
    ``examples/trl_tiny_grpo.py``: the tiny world's model and lengths); empty: the set-up keys
    given here (``model`` a hub id or local folder)."""
    micro_batch: int = 8
    """TRL: largest ``per_device_train_batch_size``."""
    num_processes: int = 1
    """TRL: processes (GPUs) of one run (``torchrun --nproc-per-node``)."""
    setup: TrainingSetup = field(default_factory=lambda: TrainingSetup(runner="trl"))
    """The user's run (default runner ``trl``: ``GRPOConfig``'s defaults)."""

    def __post_init__(self) -> None:
        if not isinstance(self.command, str) or not self.command.strip():
            raise ValueError("setting command='': give the shell line each trial runs, e.g. "
                             "--set command='bash train.sh {trial_dir}'")
        fields_used = _placeholders(self.command)
        unknown = sorted(f for f in fields_used if f not in PLACEHOLDERS)
        if unknown:
            raise ValueError(f"setting command={_shown(self.command)}: unknown placeholder {_cut('{' + unknown[0] + '}')}; "
                             f"allowed: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        if "trial_dir" not in fields_used:
            raise ValueError(f"setting command={_shown(self.command)}: must contain {{trial_dir}} (the trial's "
                             "folder with its config; the command leaves its metrics there)")
        if not (self.timeout_s > 0 and self.timeout_s < float("inf")):
            raise ValueError(f"setting timeout_s={self.timeout_s!r}: must be a positive number of seconds")
        if self.format not in FORMATS:
            raise ValueError(f"setting format={self.format!r}: allowed: {', '.join(FORMATS)}")
        for name in ("metrics_file", "out_dir"):
            if not getattr(self, name).strip():
                raise ValueError(f"setting {name}='': must name a file or folder")
        if self.micro_batch < 1 or self.num_processes < 1:
            raise ValueError(f"setting micro_batch={self.micro_batch}, num_processes={self.num_processes}: "
                             "must be >= 1")

    @classmethod
    def from_flat(cls, **settings: Any) -> "CommandSettings":
        """From flat settings: own fields and :class:`TrainingSetup` keys. Raises ``ValueError``
        (one line) for an unknown or ill-typed setting or a bad value."""
        from allocopt.objective import split_settings

        setup, own = split_settings(cls, settings, "command")
        try:
            base = TrainingSetup.from_mapping({"runner": "trl", **setup})
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return cls(**own, setup=base)


def _cut(text: str, most: int = 40) -> str:
    """``text`` cut to ``most`` characters for a one-line message."""
    return text if len(text) <= most else text[:most - 3] + "..."


def _shown(text: str) -> str:
    """``text`` quoted for a one-line message, cut to 200 characters."""
    return repr(_cut(text, 200))


def _placeholders(template: str) -> set[str]:
    """The placeholders ``template`` uses. Raises ``ValueError`` (one line) for a template that
    is not one (an unmatched brace) or a placeholder with a format spec or conversion
    (``{trial:>99999999}``, ``{seed!r}``): each is replaced by its quoted value as it is."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"setting command={_shown(template)}: not a valid template ({e})") from None
    for _, name, spec, conversion in parts:
        if name is not None and (spec or conversion):
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"setting command={_shown(template)}: placeholder {_cut(shown)} has a "
                             "format spec or conversion; write placeholders bare, "
                             f"e.g. {{{name}}}")
    return {name for _, name, _, _ in parts if name is not None}


SHELL_WORDS = frozenset({
    "!", ".", ":", "(", "{", "[", "[[", "alias", "builtin", "case", "cd", "command", "eval", "exec",
    "export", "for", "if", "set", "source", "time", "ulimit", "umask", "unset", "until", "while"})
"""First words of a command line that are the shell's own (its program is looked up later)."""


def missing_program(template: str) -> str | None:
    """Why the program ``template`` starts cannot be run here, or ``None``: its first word
    (after ``NAME=value`` assignments) is looked up as ``/bin/sh`` would, on ``PATH`` or as a
    path from the working folder. Lines starting with a shell word (``cd``, ``if``, ``(``,
    :data:`SHELL_WORDS`) or a placeholder are not checked."""
    import shutil

    try:
        words = shlex.split(template, comments=True)
    except ValueError as e:
        return f"not a shell line ({e})"
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        words = words[1:]
    if not words or words[0] in SHELL_WORDS or any(c in words[0] for c in "{$`*?;&|<>()"):
        return None  # the shell's own, or known only once the line is filled in and expanded
    program = words[0]
    if "/" in program:
        if not os.path.isfile(program):
            return f"program {_cut(program, 200)} not found (from the working folder {os.getcwd()})"
        if not os.access(program, os.X_OK):
            return f"program {_cut(program, 200)} is not executable (chmod +x, or run it through its interpreter)"
        return None
    if shutil.which(program) is None:
        return f"program {_cut(program, 200)!r} not found on PATH"
    return None


@dataclass
class _Trial:
    study: str = "study"
    number: int = 0
    fidelity: str = "full"
    spec: Any = None


class CommandObjective:
    """Runs the user's command for each trial (see the module docstring)."""

    name = "command"

    def __init__(self, settings: CommandSettings, given: frozenset[str] = frozenset()):
        self.settings = settings
        self._given = given
        self._trial = _Trial()
        self._workload: Workload | None = None

    def bind_trial(self, *, study: str, number: int, fidelity: str, spec: Any) -> None:
        """Called by the study loop before :meth:`run`: the trial's study, number, fidelity and
        spec (the targets to read)."""
        self._trial = _Trial(study, number, fidelity, spec)

    def workload(self) -> Workload:
        """The user's run as plans price it: ``plan_objective``'s workload with the set-up keys
        given here, else a workload of the set-up given here; with a bound trial, its study's
        declared reward systems priced too."""
        base = self._base_workload()
        spec = self._trial.spec
        return spec.priced(base) if spec is not None and hasattr(spec, "priced") else base

    def _base_workload(self) -> Workload:
        if self._workload is None:
            s = self.settings
            if s.plan_objective:
                from allocopt.objective import get_objective

                base = get_objective(s.plan_objective).workload()
                changes = {k: v for k, v in s.setup.to_dict().items() if k in self._given}
                self._workload = base.with_setup(**changes) if changes else base
            else:
                from allocopt.plan.hub import model_shape

                self._workload = Workload(model_shape(s.setup.model), s.setup)
        return self._workload

    def check_available(self) -> None:
        """Refuse, before the first trial, a setting that can never work here: an ``out_dir``
        (or a folder inside it) that is not a folder, or a command whose program is not found
        (:func:`missing_program`). Where the command trains is its own business.

        Raises:
            ObjectiveUnavailable: one line naming the setting and its value.
        """
        out = Path(self.settings.out_dir)
        for p in (out, *out.parents):
            if p.exists() and not p.is_dir():
                raise ObjectiveUnavailable(f"setting out_dir={self.settings.out_dir!r}: {p} is not a folder; "
                                           "give a folder (made if missing) for the trials' folders")
        missing = missing_program(self.settings.command)
        if missing:
            raise ObjectiveUnavailable(f"setting command={_shown(self.settings.command)}: {missing}")

    def trial_dir(self) -> Path:
        t = self._trial
        return Path(self.settings.out_dir).resolve() / t.study / f"trial-{t.number}"

    def run(self, plan: TrialPlan, *, seed: int = 0, progress: Any = None) -> TrialResult:
        """Write the trial's folder, run the command, read its metrics and logs.

        Raises:
            InfeasiblePlan: no whole-pass run fits the budget (nothing run).
            TrialFailed: the command failed, timed out or left no usable metrics or logs (one
                line naming the trial's folder and its ``command.log``).
        """
        from allocopt.plan.handoff import whole_pass_run, write_asked_folder

        s, t = self.settings, self._trial
        workload = self.workload()
        run = whole_pass_run(plan, workload, t.number, t.fidelity)
        folder = self.trial_dir()
        where = f"trial folder {folder}, log {folder / 'command.log'}"
        empty = _nothing_spent(plan.budget_flops)
        spec = t.spec if t.spec is not None else _default_spec()
        try:
            info = write_asked_folder(run, folder, study=t.study, storage="", fmt=s.format, setup=workload.setup,
                                      learning_rate=workload.setup.learning_rate, seed=spec.seed,
                                      targets=dict(zip(spec.targets, spec.directions)),
                                      micro_batch=s.micro_batch, num_processes=s.num_processes, tell=False)
        except OSError as e:  # out_dir became a file, no permission (a full disk is the study's)
            if e.errno == errno.ENOSPC:
                raise
            raise TrialFailed(f"the trial's folder cannot be written ({e.strerror or e}: "
                              f"{e.filename or folder}; {where})", empty) from None
        line = _command_line(s.command, folder, s.format, info.get("overrides", []), t.number, seed, where, empty)
        for note in end_orphans(folder.parent, KILL_GRACE_S):  # one trial never trains twice at once
            warnings.warn(note, stacklevel=1)
        start = time.monotonic()
        rc = _run_command(line, folder, s.timeout_s, where, empty)
        seconds = time.monotonic() - start
        empty.wall_seconds["command"] = seconds
        if rc != 0:
            raise TrialFailed(f"command exited with code {rc} ({where})", empty)
        data = self._metrics(folder / s.metrics_file, where, empty)
        targets = self._targets(data, where, empty)
        spent = self._spent(folder, data, plan, where, empty)
        eval_flops = data.get("eval_flops", 0)
        return TrialResult(targets=targets, spent=spent, budget_flops=plan.budget_flops, curves=[],
                           wall_seconds={"command": seconds},
                           eval_flops=int(eval_flops) if isinstance(eval_flops, (int, float)) else 0)

    def _metrics(self, path: Path, where: str, empty: TrialResult) -> dict[str, Any]:
        """The metrics file the command wrote, through the reading layer (:mod:`allocopt.limits`:
        a regular file of at most 1 MiB, JSON nested at most 64 deep, numbers of at most 64
        characters, no key twice); anything else fails the trial in one line."""
        from allocopt.limits import MAX_METRICS_BYTES, read_json

        if not os.path.lexists(path):
            raise TrialFailed(f"command exited 0 but left no metrics file {path.name} ({where})", empty)
        try:
            data = read_json(path, MAX_METRICS_BYTES, "metrics_file")
        except ConfigError as e:
            raise TrialFailed(f"{e} ({where})", empty) from None
        if not isinstance(data, dict):
            raise TrialFailed(f"metrics file {path.name}: must be a JSON object ({where})", empty)
        return data

    def _targets(self, data: dict[str, Any], where: str, empty: TrialResult) -> dict[str, float]:
        from allocopt.run_metrics import targets_from_metrics

        spec = self._trial.spec if self._trial.spec is not None else _default_spec()
        try:
            return targets_from_metrics(data, spec)
        except ConfigError as e:
            raise TrialFailed(f"{e} ({where})", empty) from None

    def _spent(self, folder: Path, data: dict[str, Any], plan: TrialPlan, where: str,
               empty: TrialResult) -> Any:
        from allocopt.run_metrics import account_from_metrics

        s = self.settings
        if s.log == "metrics":
            try:
                spent = account_from_metrics(data)
            except ConfigError as e:
                raise TrialFailed(f"{e} ({where})", empty) from None
            if spent is None:
                raise TrialFailed(f"metrics file {s.metrics_file}: no search_flops, learning_flops, "
                                  f"reward_flops (log=metrics; {where})", empty)
            return spent
        from allocopt.runlogs import RunLogError, import_trl, import_verl

        source = folder / (s.log or ("." if s.format == "trl" else "command.log"))
        overrides = {"reward_model": plan.reward_model} if plan.reward_model else {}
        try:
            imported = (import_trl if s.format == "trl" else import_verl)(source, **overrides)
        except RunLogError as e:
            raise TrialFailed(f"compute from the {s.format} logs: {e} ({where})", empty) from None
        return imported.account


def _command_line(template: str, folder: Path, fmt: str, overrides: list[str], number: int, seed: int,
                  where: str, empty: TrialResult) -> str:
    """The shell line of one trial: ``template`` with its placeholders filled in, each
    shell-quoted. Raises :class:`TrialFailed` (one line naming the folder) for a template that
    cannot be filled (the settings' check refuses those before the first trial)."""
    config = folder / ("grpo_config.json" if fmt == "trl" else "verl_overrides.txt")
    try:
        return template.format(trial_dir=shlex.quote(str(folder)), config=shlex.quote(str(config)),
                               overrides=" ".join(shlex.quote(o) for o in overrides), trial=number, seed=seed)
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise TrialFailed(f"command template {_shown(template)} cannot be filled ({type(e).__name__}: {e}; {where})",
                          empty) from None


def _default_spec() -> Any:
    from allocopt.spec import StudySpec

    return StudySpec()


def _nothing_spent(budget_flops: float) -> TrialResult:
    """What a failed command is recorded with: its compute is unknown (logged as 0)."""
    from allocopt.flops import ComputeBreakdown, FlopAccount

    zero = ComputeBreakdown()
    return TrialResult(targets={}, spent=FlopAccount(useful=zero, executed=zero), budget_flops=budget_flops,
                       curves=[], wall_seconds={}, status="failed")


def _run_command(line: str, folder: Path, timeout_s: float, where: str, empty: TrialResult) -> int:
    """Run ``line`` with ``/bin/sh`` in a process group that never outlives this worker
    (:func:`objectives.command_process.run_guarded`), stdout and stderr to ``command.log`` in
    ``folder``; return its exit code. Past ``timeout_s`` (or on Ctrl-C, SIGTERM) the whole group
    gets SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`.

    Raises:
        TrialFailed: timed out.
        KeyboardInterrupt: after stopping the group.
    """
    from objectives.command_process import run_guarded

    def timed_out() -> TrialFailed:
        return TrialFailed(f"command ran past timeout_s={timeout_s:g} and was killed ({where})", empty)

    with open(folder / "command.log", "ab") as log:
        log.write(f"$ {line}\n".encode())
        log.flush()
        return run_guarded(line, folder, log, timeout_s=timeout_s, grace_s=KILL_GRACE_S, on_timeout=timed_out)


def make(**settings: Any) -> CommandObjective:
    """The ``command`` objective from flat settings (entry point ``allocopt.objectives``:
    ``command``). Raises ``ValueError`` (one line) for an unknown or ill-typed setting, a
    template without ``{trial_dir}``, or another bad value."""
    return CommandObjective(CommandSettings.from_flat(**settings), frozenset(settings))


make.targets = None  # whatever the user's metrics file reports; checked per trial
