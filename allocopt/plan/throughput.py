"""Throughput profiles and time budgets: GPU-hours (or dollars) turned into FLOPs per allocation.

Standard library only. A :class:`ThroughputProfile` holds the achieved executed FLOP/s of one
GPU in each phase of a GRPO iteration (search prefill, search decode, learning, reward) for one
set-up (its :meth:`~allocopt.plan.setup.TrainingSetup.fingerprint`) on one named GPU, with where
each number came from. It is read from / written to a small TOML or JSON file
(:func:`load_profile`, :func:`save_profile`) and made from

* a run log: :func:`profile_from_run` (``allocopt account --from-verl/--from-trl ... --save-throughput FILE``);
* a study's finished trials: :func:`profile_from_trials` (the drivers time each phase:
  ``TrialResult.wall_seconds``, recorded as ``<phase>_wall_seconds`` metrics);
* values the user gives (a hand-written file).

A :class:`TimeBudget` (GPU-hours on ``gpus`` GPUs at a profile) gives each allocation the FLOPs
it can execute in that time (:meth:`TimeBudget.flops_for`). With phase shares ``s_i`` of the
allocation's executed FLOPs and per-GPU throughputs ``T_i``::

    seconds per FLOP (one GPU)  = Σ_i s_i / T_i
    budget_flops                = hours · 3600 · gpus / Σ_i s_i / T_i

so a search-heavy allocation (decode runs at a few percent of peak) gets fewer FLOPs than an
update-heavy one. The plan is then made and metered in FLOPs exactly as for a FLOP budget (a
deterministic hard budget); the hours are an expectation (:meth:`TimeBudget.hours_of`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from allocopt.flops import ComputeBreakdown, ConfigError
from allocopt.tomlio import unknown_key

THROUGHPUT_PHASES: tuple[str, ...] = ("search_prefill", "search_decode", "learning", "reward")
"""Phases a profile rates: the search phase split into prefill and decode (vLLM decode is
memory-bound and runs far below peak), learning (every pass of the update) and reward-model
inference."""


MAX_RATE = 1e19
"""Largest FLOP/s per GPU a profile may give (today's GPUs reach a few 1e15)."""
MAX_GPUS = 1_000_000
"""Most GPUs a measured run may have used."""


def _rate(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not 0 < v <= MAX_RATE:
        raise ConfigError(f"throughput.{name}={v!r}: must be a positive number of FLOP/s per GPU, "
                          f"at most {MAX_RATE:g} (or left out when not measured)")
    return float(v)


def _name(field_name: str, v: Any, allowed: str) -> None:
    if not isinstance(v, str) or not v.strip() or len(v) > 256 or not v.isprintable():
        raise ConfigError(f"throughput.{field_name}={str(v)[:80]!r}: must be {allowed} (1 to 256 "
                          "printable characters)")


@dataclass(frozen=True)
class ThroughputProfile:
    """Achieved executed FLOP/s of one GPU per phase, for one set-up on one GPU type.

    Invalid values raise :class:`ConfigError`, one line naming the field."""

    gpu: str
    """The GPU the rates were measured on, as people name it (``H100-80GB``, ``cpu``)."""
    setup_fingerprint: str
    """:meth:`allocopt.plan.setup.TrainingSetup.fingerprint` of the set-up measured (12 hex
    digits); ``*``: values the user vouches for on any set-up."""
    search_prefill: float | None = None
    """Prompt prefill of the rollouts, FLOP/s per GPU (``None``: not measured)."""
    search_decode: float | None = None
    """Token-by-token decode of the rollouts, FLOP/s per GPU. A log that times generation as one
    phase (verl ``timing_s/gen``) gives prefill and decode the same rate."""
    learning: float | None = None
    """The update (old/ref log-probs, forward, backward), FLOP/s per GPU."""
    reward: float | None = None
    """Reward-model inference, FLOP/s per GPU (``None`` is fine for rule-based rewards: 0 FLOPs)."""
    gpus: int = 1
    """GPUs of the measured run (the rates are per GPU: its FLOP/s divided by this)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Phase -> where its rate came from (file, trial numbers, ``given``)."""

    def __post_init__(self) -> None:
        _name("gpu", self.gpu, "the GPU's name (e.g. 'H100-80GB')")
        _name("setup_fingerprint", self.setup_fingerprint,
              "the set-up's fingerprint (allocopt account --json prints it) or '*'")
        for p in THROUGHPUT_PHASES:
            object.__setattr__(self, p, _rate(p, getattr(self, p)))
        if all(getattr(self, p) is None for p in THROUGHPUT_PHASES):
            raise ConfigError("throughput: no rate given; give at least search_prefill, search_decode "
                              "and learning (FLOP/s per GPU)")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or not 1 <= self.gpus <= MAX_GPUS:
            raise ConfigError(f"throughput.gpus={self.gpus!r}: must be an integer from 1 to {MAX_GPUS}")
        if not isinstance(self.sources, Mapping):
            raise ConfigError(f"throughput.sources={self.sources!r}: must be a table phase -> text")
        object.__setattr__(self, "sources", {str(k): str(v) for k, v in self.sources.items()})

    def rate(self, phase: str) -> float | None:
        """FLOP/s per GPU of ``phase`` (one of :data:`THROUGHPUT_PHASES`)."""
        return getattr(self, phase)

    def check_for(self, fingerprint: str, gpu: str | None = None) -> None:
        """Refuse this profile for a set-up with another ``fingerprint`` or another ``gpu``
        (``None``: any). Raises :class:`ConfigError`."""
        if self.setup_fingerprint not in ("*", fingerprint):
            raise ConfigError(f"throughput.setup_fingerprint={self.setup_fingerprint!r}: measured on another "
                              f"set-up than this one ({fingerprint}); measure this set-up, or set '*' to "
                              "vouch for the rates")
        if gpu is not None and gpu.strip().lower() != self.gpu.strip().lower():
            raise ConfigError(f"throughput.gpu={self.gpu!r}: measured on another GPU than --gpu {gpu!r}; "
                              "use a profile measured on that GPU")

    def seconds_per_flop(self, breakdown: ComputeBreakdown) -> float:
        """``Σ_i s_i / T_i``: seconds one GPU takes per executed FLOP of work composed like
        ``breakdown`` (its phase shares ``s_i``). Raises :class:`ConfigError` when a phase with
        FLOPs has no rate."""
        total = breakdown.total_flops
        if total <= 0:
            raise ConfigError("throughput: an empty breakdown has no time")
        return sum(f / total / self._need(p) for p, f in phase_flops(breakdown).items() if f)

    def _need(self, phase: str) -> float:
        r = self.rate(phase)
        if r is None:
            raise ConfigError(f"throughput.{phase}: not measured, but the plan spends FLOPs there; "
                              "give its FLOP/s per GPU in the profile")
        return r

    def hours_of(self, breakdown: ComputeBreakdown, gpus: int = 1) -> dict[str, float]:
        """GPU-wall hours per phase (and ``total``) of ``breakdown`` on ``gpus`` GPUs:
        ``flops_i / (T_i · gpus) / 3600``."""
        out = {p: (f / (self._need(p) * gpus) / 3600 if f else 0.0) for p, f in phase_flops(breakdown).items()}
        out["total"] = sum(out.values())
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v is not None}
        d["sources"] = dict(self.sources)
        return d

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], what: str = "throughput") -> "ThroughputProfile":
        """A profile from a table of its fields. Raises :class:`ConfigError` naming an unknown
        or missing key."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{what}: must be a table of gpu, setup_fingerprint and FLOP/s per phase")
        known = [f.name for f in fields(cls)]
        bad = sorted(set(data) - set(known))
        if bad:
            raise ConfigError(unknown_key(what, bad[0], known))
        for req in ("gpu", "setup_fingerprint"):
            if req not in data:
                raise ConfigError(f"{what}: {req} missing; the profile must say which "
                                  + ("GPU" if req == "gpu" else "set-up (fingerprint, or '*')") + " it measured")
        return cls(**dict(data))


def phase_flops(b: ComputeBreakdown) -> dict[str, int]:
    """Executed FLOPs of ``b`` per :data:`THROUGHPUT_PHASES` (``search.prefill``, the rest of
    search as decode, learning, reward)."""
    prefill = int(b.search.get("prefill", 0))
    return {"search_prefill": prefill, "search_decode": b.search_flops - prefill,
            "learning": b.learning_flops, "reward": b.reward_flops}


def load_profile(path: str | Path) -> ThroughputProfile:
    """The profile in a ``.json`` or ``.toml`` file. Raises :class:`ConfigError` (one line)."""
    p = Path(path)
    if p.suffix.lower() == ".json":  # the reading layer: a regular file of at most 1 MiB, JSON in limits
        from allocopt.limits import MAX_TOML_BYTES, read_json

        data = read_json(p, MAX_TOML_BYTES, "throughput")
    else:
        from allocopt.tomlio import read_toml

        data = read_toml(p, "throughput")
    return ThroughputProfile.from_mapping(data, f"throughput {p.name}")


def save_profile(profile: ThroughputProfile, path: str | Path) -> Path:
    """Write ``profile`` to ``path`` (JSON for ``.json``, else TOML); returns the path."""
    p = Path(path)
    d = profile.to_dict()
    if p.suffix.lower() == ".json":
        p.write_text(json.dumps(d, indent=2) + "\n", encoding="utf-8")
        return p
    lines = [f"{k} = {json.dumps(v)}" for k, v in d.items() if k != "sources"]
    lines += ["", "[sources]"] + [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in d["sources"].items()]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def profile_from_run(run: Any, gpu: str, fingerprint: str) -> ThroughputProfile:
    """The profile of an imported run (:class:`allocopt.runlogs.common.ImportedRun` with phase
    timings): per-GPU rate of each timed phase = executed FLOPs / seconds / devices; generation
    timed as one phase gives prefill and decode its rate. Raises :class:`ConfigError` when the
    log has no timings."""
    rates = run.achieved()
    if not rates:
        raise ConfigError(f"save_throughput: the run {run.source} has no phase timings; a profile needs "
                          "wall seconds per phase (verl timing_s/*)")
    src = f"{Path(str(run.source)).name} ({run.steps} steps, {run.num_devices or 1} device(s))"
    kw: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for phase, v in rates.items():
        if not v["flops_per_second_per_device"]:  # a phase with no FLOPs (a rule-based reward)
            continue
        names = ("search_prefill", "search_decode") if phase == "search" else (phase,)
        for n in names:
            kw[n] = v["flops_per_second_per_device"]
            sources[n] = src + (": generation timed as one phase" if phase == "search" else "")
    return ThroughputProfile(gpu=gpu, setup_fingerprint=fingerprint, gpus=run.num_devices or 1,
                             sources=sources, **kw)


def profile_from_trials(rows: Any, gpu: str, fingerprint: str, gpus: int = 1) -> ThroughputProfile:
    """The profile of finished trials: for each phase, Σ executed FLOPs / Σ wall seconds over
    the trials that recorded both (metrics ``<phase>_flops`` and ``<phase>_wall_seconds``;
    ``search_prefill_flops`` splits search when recorded, else both search phases get the
    search rate), divided by ``gpus``. ``rows``: mappings of a trial's metrics (each may carry
    ``number``). Raises :class:`ConfigError` when no trial timed a phase."""
    flops: dict[str, float] = {}
    secs: dict[str, float] = {}
    used: dict[str, list[str]] = {}
    for i, m in enumerate(rows):
        for phase in ("search", "learning", "reward"):
            f, s = m.get(f"{phase}_flops"), m.get(f"{phase}_wall_seconds")
            if f and s and s > 0:
                flops[phase] = flops.get(phase, 0.0) + float(f)
                secs[phase] = secs.get(phase, 0.0) + float(s)
                used.setdefault(phase, []).append(str(m.get("number", i)))
    if not secs:
        raise ConfigError("throughput: no finished trial recorded FLOPs and wall seconds of a phase")
    kw: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for phase in secs:
        rate = flops[phase] / secs[phase] / gpus
        names = ("search_prefill", "search_decode") if phase == "search" else (phase,)
        for n in names:
            kw[n] = rate
            sources[n] = f"trials {', '.join(used[phase])}: {phase}_flops / {phase}_wall_seconds"
    return ThroughputProfile(gpu=gpu, setup_fingerprint=fingerprint, gpus=gpus, sources=sources, **kw)


@dataclass(frozen=True)
class TimeBudget:
    """A budget in GPU-hours on ``gpus`` GPUs, priced at ``profile``'s per-phase throughput.

    ``budget_usd`` / ``usd_per_gpu_hour`` give GPU-hours ``usd / price`` (all ``gpus`` billed):
    ``gpu_hours = usd / price`` and the wall hours ``gpu_hours / gpus``."""

    gpu_hours: float
    """GPU-hours of the run (wall hours × gpus)."""
    profile: ThroughputProfile
    gpus: int = 1
    """GPUs the run uses (the rates are per GPU; the wall time is gpu_hours / gpus)."""

    def __post_init__(self) -> None:
        v = self.gpu_hours
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"budget_gpu_hours={v!r}: must be a positive number of GPU-hours")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ConfigError(f"gpus={self.gpus!r}: must be an integer >= 1")

    def flops_for_breakdown(self, breakdown: ComputeBreakdown) -> float:
        """FLOPs of work composed like ``breakdown`` that fit: ``gpu_hours · 3600 / Σ s_i/T_i``."""
        return self.gpu_hours * 3600.0 / self.profile.seconds_per_flop(breakdown)

    def flops_for(self, allocation: Any, workload: Any) -> float:
        """The FLOP budget of ``allocation`` on ``workload``: :meth:`flops_for_breakdown` of its
        mean iteration (64 iterations of its row schedule at the set-up's batch: the shares a
        plan at any budget runs). Raises :class:`ConfigError` (a phase without a rate)."""
        from allocopt.plan.allocation import expected_flops, rows_for_rho

        k = rows_for_rho(workload, allocation)
        return self.flops_for_breakdown(expected_flops(workload, allocation, k, 64).executed)

    def hours_of(self, breakdown: ComputeBreakdown) -> dict[str, float]:
        """Expected GPU-hours per phase (and ``total``) of ``breakdown`` on :attr:`gpus` GPUs,
        summed over the GPUs (wall hours × gpus)."""
        return {k: v * self.gpus for k, v in self.profile.hours_of(breakdown, self.gpus).items()}


TRAINING_WALL_PHASES = ("search+reward", "learning")
"""Wall-second phases of a trial (:attr:`allocopt.objective.TrialResult.wall_seconds`) that the
budget pays for: generation with its scoring, and the rest of the training loop (``reward`` is
part of ``search+reward``; ``eval`` is outside the budget)."""


def measured_gpu_hours(wall_seconds: Mapping[str, float], gpus: int) -> float | None:
    """Measured GPU-hours of a finished trial: the wall seconds of :data:`TRAINING_WALL_PHASES`
    × ``gpus`` / 3600; ``None`` when the trial timed none of them."""
    got = [float(wall_seconds[p]) for p in TRAINING_WALL_PHASES if p in wall_seconds]
    return sum(got) * gpus / 3600 if got else None


def gpu_hours_of(*, gpu_hours: float | None = None, usd: float | None = None,
                 usd_per_gpu_hour: float | None = None) -> float | None:
    """GPU-hours of the CLI's time-budget flags: ``gpu_hours``, or ``usd / usd_per_gpu_hour``;
    ``None`` when neither is given.

    Raises:
        ConfigError: both hours and dollars; dollars without a price (or a price without
            dollars); a number that is not positive (one line each).
    """
    if usd_per_gpu_hour is not None and usd is None:
        raise ConfigError("usd_per_gpu_hour: given without --budget-usd; give the budget in dollars too")
    for n, v in (("budget_gpu_hours", gpu_hours), ("budget_usd", usd), ("usd_per_gpu_hour", usd_per_gpu_hour)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v) or v <= 0):
            raise ConfigError(f"{n}={v!r}: must be a positive number"
                              + (" of GPU-hours" if n == "budget_gpu_hours" else " of dollars"))
    if usd is not None:
        if gpu_hours is not None:
            raise ConfigError("budget_usd, budget_gpu_hours: give one time budget, not both")
        if usd_per_gpu_hour is None:
            raise ConfigError("budget_usd: needs --usd-per-gpu-hour (the price of one GPU-hour)")
        return usd / usd_per_gpu_hour
    return gpu_hours


def time_budget(*, gpu_hours: float | None = None, gpus: int = 1,
                profile: ThroughputProfile | None = None) -> TimeBudget | None:
    """The :class:`TimeBudget` of ``gpu_hours`` on ``gpus`` GPUs at ``profile``; ``None``
    without hours.

    Raises:
        ConfigError: hours without a profile (no throughput source), bad values.
    """
    if gpu_hours is None:
        return None
    if profile is None:
        raise ConfigError("budget_gpu_hours: a time budget needs a throughput source; give --throughput "
                          "FILE (allocopt account --from-verl LOG --save-throughput FILE writes one)")
    return TimeBudget(gpu_hours=gpu_hours, profile=profile, gpus=gpus)


__all__ = ["THROUGHPUT_PHASES", "ThroughputProfile", "TimeBudget", "gpu_hours_of", "load_profile", "phase_flops",
           "profile_from_run", "profile_from_trials", "save_profile", "time_budget"]
