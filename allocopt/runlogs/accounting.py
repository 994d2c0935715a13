"""``allocopt account``'s work: the FLOP account of a recipe, or of an existing run from its logs
(TRL, verl, OpenRLHF, NeMo-RL), with its achieved FLOP/s per phase and, on request, the run's
throughput profile written for ``--throughput``. The command parses, calls :func:`account_any`
and prints the :class:`Accounting` it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from allocopt.errors import ConfigError, RunLogError
from allocopt.flops import FlopAccount
from allocopt.runlogs.common import ImportedRun

RUN_SOURCES = ("from_trl", "from_verl", "from_openrlhf", "from_nemo_rl")
"""The keyword of each run importer, as :func:`account_any` takes them (the ``--from-*`` flags)."""


@dataclass(frozen=True)
class Accounting:
    """What ``allocopt account`` shows: a FLOP account, its title and its JSON form."""

    account: FlopAccount
    """Useful and executed FLOPs per phase and item (of the recipe's steps, or the whole run)."""
    title: str
    """One line saying what was accounted (model, batch, passes, engine; or the run's source)."""
    data: Mapping[str, Any]
    """The JSON form (``allocopt account --json``)."""
    run: ImportedRun | None = None
    """The imported run, for its provenance (``fields_read``, ``fields_assumed``); ``None`` for a recipe."""
    rates: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    """Per timed phase: seconds, executed FLOP/s (per device) and MFU (:meth:`ImportedRun.achieved`)."""
    profile: Any = None
    """The throughput profile written to ``save_throughput`` (``None`` when none was asked)."""


def account_any(recipe: Path | None = None, *, runs: Mapping[str, Path | None] | None = None,
                peak_tflops: float | None = None, save_throughput: Path | None = None,
                gpu: str | None = None, **given: Any) -> Accounting:
    """The account of a recipe (``recipe`` TOML and ``given`` keys), or of one existing run.

    Args:
        recipe: TOML file with the recipe (:func:`allocopt.plan.recipe.read_recipe`).
        runs: :data:`RUN_SOURCES` -> path; at most one not ``None`` (a run's logs, accounted
            with ``given`` as overrides that win over the log).
        peak_tflops: peak TFLOP/s of one device, > 0: MFU per timed phase of a run.
        save_throughput: with a run that has phase timings: write its achieved FLOP/s per GPU
            per phase as a throughput profile (TOML, or JSON for ``.json``).
        gpu: the GPU named in that profile (default ``unknown-gpu``).
        given: :data:`allocopt.plan.recipe.RECIPE_KEYS`; ``None`` values are not given.

    Raises:
        ConfigError: one line naming the field: two runs, a recipe file with a run, a bad
            ``peak_tflops``, ``save_throughput`` without a run or not writable, a bad recipe
            value, or the run's logs cannot be accounted (:class:`RunLogError`'s line).
    """
    if peak_tflops is not None and not peak_tflops > 0:
        raise ConfigError(f"peak_tflops={peak_tflops!r}: must be a number > 0")
    chosen = {k: v for k, v in (runs or {}).items() if v is not None}
    if not chosen:
        if save_throughput is not None:
            raise ConfigError("save_throughput: needs a run with phase timings (--from-verl LOG or "
                              "--from-trl DIR)")
        return _account_recipe(recipe, given)
    if len(chosen) > 1:
        raise ConfigError(f"{', '.join(chosen)}: give one run, not {len(chosen)}")
    if recipe is not None:
        raise ConfigError("recipe: not used with --from-trl/--from-verl/--from-openrlhf/"
                          "--from-nemo-rl (flags override the log)")
    [(kind, path)] = chosen.items()
    run = _import_run(kind, path, {k: v for k, v in given.items() if v is not None})
    rates = run.achieved(peak_tflops)
    profile = _save_profile(run, save_throughput, gpu) if save_throughput is not None else None
    tool = {"from_trl": "TRL", "from_verl": "verl", "from_openrlhf": "OpenRLHF", "from_nemo_rl": "NeMo-RL"}[kind]
    priced = "" if tool.lower() == run.engine.lower() or kind == "from_trl" else f" (priced with the {run.engine} engine model)"
    return Accounting(run.account, f"{tool} run {run.source}: {run.steps} step(s){priced}",
                      {**run.to_dict(), "achieved": rates}, run=run, rates=rates, profile=profile)


OTHER_READING_BAR = 0.02
"""An other reading that moves the total by more than this share is printed with its total."""


def assumption_lines(data: Mapping[str, Any]) -> list[str]:
    """One line per assumed field of an imported run's JSON form (:meth:`ImportedRun.to_dict`):
    the executed total assumes it, and, where its other reading moves the total by more than
    :data:`OTHER_READING_BAR`, what the total would be under that reading."""
    total = float(data.get("total_flops", 0.0))
    others = data.get("other_readings", {})
    lines = []
    for field_name, value in data.get("fields_assumed", {}).items():
        line = f"total {total:.3e} FLOPs assumes {field_name} = {value}"
        if field_name in others:
            o = others[field_name]
            line += (f"; if {o['reading']}: {o['total_flops']:.3e} ({o['change']:+.1%})"
                     if abs(o["change"]) > OTHER_READING_BAR else
                     f"; if {o['reading']}: within {OTHER_READING_BAR:.0%}")
        lines.append(line)
    return lines


def _account_recipe(recipe: Path | None, given: Mapping[str, Any]) -> Accounting:
    """A recipe's account, titled with what it prices (model, batch, passes, set-up)."""
    from allocopt.plan.hub import model_shape
    from allocopt.plan.recipe import account, generated_prompts, read_recipe, recipe_dict

    setup, r = read_recipe(recipe, **given)
    policy = model_shape(setup.model)
    acct = account(setup, r, policy)
    gen = generated_prompts(setup, r)
    title = (f"{setup.model}: {r.prompts} prompts x G={r.group_size}"
             + (f" trained of {gen} generated" if gen != r.prompts else "")
             + (f", critic {setup.critic}" if setup.critic else "") + f", {r.steps} step(s), "
             f"mu={r.update_passes:g}, {r.minibatches} minibatch(es)/pass, beta={setup.beta:g}, "
             f"{'LoRA r=' + str(setup.lora_rank) if setup.lora_rank else 'full fine-tuning'}, "
             f"checkpointing {'on' if setup.gradient_checkpointing else 'off'}, "
             f"reward: {r.reward_model or 'rule-based'}, engine {setup.engine}, runner {setup.runner}")
    data = {"recipe": recipe_dict(setup, r), "setup_fingerprint": setup.fingerprint(policy),
            **acct.to_dict()}
    return Accounting(acct, title, data)


def _import_run(kind: str, path: Path, overrides: Mapping[str, Any]) -> ImportedRun:
    """The run at ``path`` read by the importer ``kind`` names (one of :data:`RUN_SOURCES`);
    its :class:`RunLogError` becomes a :class:`ConfigError` with the same line."""
    from allocopt.runlogs.nemo_rl import import_nemo_rl
    from allocopt.runlogs.openrlhf import import_openrlhf
    from allocopt.runlogs.trl import import_trl
    from allocopt.runlogs.verl import import_verl

    importer = {"from_trl": import_trl, "from_verl": import_verl, "from_openrlhf": import_openrlhf,
                "from_nemo_rl": import_nemo_rl}[kind]
    try:
        return importer(path, **overrides)
    except RunLogError as e:
        raise ConfigError(str(e)) from None


def _save_profile(run: ImportedRun, path: Path, gpu: str | None) -> Any:
    """Write ``run``'s achieved FLOP/s per GPU per phase to ``path`` as a throughput profile of
    the run's set-up (:func:`allocopt.plan.throughput.profile_from_run`); returns the profile."""
    from allocopt.plan.hub import model_shape
    from allocopt.plan.recipe import read_recipe
    from allocopt.plan.throughput import profile_from_run, save_profile

    setup, _ = read_recipe(None, **dict(run.settings))
    profile = profile_from_run(run, gpu or "unknown-gpu", setup.fingerprint(model_shape(setup.model)))
    try:
        save_profile(profile, path)
    except OSError as e:
        raise ConfigError(f"save_throughput={str(path)!r}: cannot be written ({e.strerror or e})") from None
    return profile
