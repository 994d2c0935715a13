"""Account an OpenRLHF GRPO run (``openrlhf.cli.train_ppo_ray``) from its logs.

What OpenRLHF 0.11 writes (``openrlhf/trainer/ppo_trainer.py``, ``fit`` and ``train_step``;
``openrlhf/utils/logging_utils.py``; ``openrlhf/trainer/ray/ppo_actor.py``, ``ppo_train``):

* console: ``strategy.print(args)`` at start (``openrlhf/cli/train_ppo_ray.py``): the
  ``repr`` of the hierarchical ``SimpleNamespace`` (``namespace(actor=namespace(...), ...)``,
  ``openrlhf/utils/config.py`` ``hierarchize``); then per step the line
  ``✨ Global step N: {...}`` (``logger.info`` of the status dict);
* TensorBoard (``--logger.tensorboard_dir``): ``TensorboardLogger.log_train`` writes every
  status key as ``train/<key>`` at ``global_step``.

Per step this reads ``response_length`` and ``total_length`` (sample means over the trained
batch, reduced across ranks in ``PPOActor.ppo_train``: prompt = total - response),
``rollout/num_samples`` (rows trained), ``timing/generation`` (search),
``timing/make_experience`` and ``timing/ppo_train`` (learning; the reward model or remote
reward runs inside ``make_experience`` and is counted there), ``timing/broadcast`` (weight
sync: no phase). From the ``namespace`` dump or ``--key value`` command lines:
``rollout.batch_size`` (prompts per step), ``rollout.n_samples_per_prompt`` (G),
``train.max_epochs`` (update passes), ``train.batch_size`` (samples per optimizer step),
``algo.kl.init_coef`` (> 0: a reference model), ``ds.lora.rank``, ``ds.lora.target_modules``,
``actor.gradient_checkpointing_enable``, ``actor.model_name_or_path``,
``actor.num_nodes × actor.num_gpus_per_node``, ``algo.advantage.estimator``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Iterable

from allocopt.limits import MAX_LOG_BYTES, RepeatCounter, iter_lines
from allocopt.runlogs.common import (ImportedRun, LoggedStep, RunLogError, StepLog, as_number,
                                     check_overrides, imported, no_critic, run_path)
from allocopt.runlogs.keys import KeyReader, OtherReading, Provenance, check_number
from allocopt.runlogs.scalars import (MAX_FLAG_LINES, event_files, flag_line, parse_call_dump,
                                      parse_flags, read_event_scalars)

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_STEP = re.compile(r"Global step (\d{1,10}): (\{.*\})\s*$", re.ASCII)
MAX_TEXT_FILES = 1000
"""Entries of a log folder looked at for console logs."""
PHASE_TIMERS = {"timing/generation": "search", "timing/make_experience": "learning",
                "timing/ppo_train": "learning"}
# OpenRLHF's argparse defaults (openrlhf/cli/train_ppo_ray.py) where the log does not say
DEFAULTS = {"rollout.batch_size": 1024, "rollout.n_samples_per_prompt": 1, "train.max_epochs": 1,
            "train.batch_size": 128, "algo.kl.init_coef": 0.01, "ds.lora.rank": 0,
            "ds.lora.target_modules": "all-linear", "actor.gradient_checkpointing_enable": False,
            "actor.num_nodes": 1, "actor.num_gpus_per_node": 8, "algo.advantage.estimator": "gae",
            "ds.packing_samples": False}


def parse_openrlhf_console(lines: Iterable[str], where: str) -> tuple[dict[str, Any], dict[int, dict[str, float]]]:
    """``(config, {step: metrics})`` of an OpenRLHF console log given as its lines. A step
    logged more than :data:`~allocopt.limits.MAX_REPEATS` times is refused in one line."""
    config: dict[str, Any] = {}
    steps: dict[int, dict[str, float]] = {}
    flags: list[str] = []
    repeats = RepeatCounter()
    for n, line in enumerate(lines, 1):
        if "namespace(" in line and not config:
            config = parse_call_dump(line[line.find("namespace("):], "namespace") or {}
            continue
        at = line.find("Global step ")
        m = _STEP.match(line, at) if at >= 0 else None
        if m:
            try:
                d = ast.literal_eval(m.group(2))
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(d, dict):
                step = int(m.group(1))
                repeats.add(step, f"{where}: line {n}", f"Global step {step}", RunLogError)
                steps.setdefault(step, {}).update(
                    {str(k): float(v) for k, v in d.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)})
        elif flag_line(line) and len(flags) < MAX_FLAG_LINES:
            flags.append(line)
    for k, v in parse_flags("\n".join(flags)).items():
        config.setdefault(k, v)
    return config, steps


def _read_logs(p: Path, src: str) -> tuple[dict[str, Any], dict[int, dict[str, float]]]:
    """The config and steps of the console logs at ``p`` (a file, or ``*.log``, ``*.txt``,
    ``*.sh`` in a folder) and of the event files under it (``train/*`` scalars)."""
    config: dict[str, Any] = {}
    steps: dict[int, dict[str, float]] = {}
    if p.is_dir():
        texts = sorted(x for _, x in zip(range(MAX_TEXT_FILES), p.glob("*"))
                       if x.suffix in (".log", ".txt", ".sh"))
    else:
        texts = [] if p.name.startswith("events.out.tfevents.") else [p]
    for t in texts:
        c, s = parse_openrlhf_console(iter_lines(t, MAX_LOG_BYTES, "from_openrlhf", RunLogError,
                                                 errors="replace"), f"{src}: {t.name}")
        for k, v in c.items():
            config.setdefault(k, v)
        for st, m in s.items():
            steps.setdefault(st, {}).update(m)
    files = event_files(p, src)
    if files:
        for st, m in read_event_scalars(files, src).items():
            steps.setdefault(st, {}).update({k[len("train/"):]: v for k, v in m.items()
                                             if k.startswith("train/")})
    return config, steps


def _settings(keys: KeyReader, given: dict[str, Any]) -> dict[str, Any]:
    """The recipe settings of the run (OpenRLHF's defaults where the log is silent); a PPO run
    with a critic, a group of one or a missing model refused in one line."""
    src, d = keys.where, "OpenRLHF default"
    estimator = keys.text("algo.advantage.estimator", DEFAULTS["algo.advantage.estimator"], d)
    G = given.get("group_size") or keys.number("rollout.n_samples_per_prompt",
                                               DEFAULTS["rollout.n_samples_per_prompt"], d,
                                               least=1, most=65536)
    if estimator == "gae" or G < 2:
        raise RunLogError(f"{src}: algo.advantage.estimator={estimator!r}, "
                          f"rollout.n_samples_per_prompt={G}: PPO with a critic is not priced "
                          "here; a GRPO-style run (group_norm, reinforce_baseline, rloo, dr_grpo) "
                          "with n_samples_per_prompt >= 2 is")
    prompts = given.get("prompts") or keys.number("rollout.batch_size", DEFAULTS["rollout.batch_size"], d, least=1)
    per_step = keys.number("train.batch_size", DEFAULTS["train.batch_size"], d, least=1)
    settings: dict[str, Any] = {
        "engine": "verl", "prompts": prompts, "group_size": G,
        "update_passes": float(keys.number("train.max_epochs", DEFAULTS["train.max_epochs"], d, least=1)),
        "minibatches": max(1, prompts * G // per_step)}
    keys.notes.assume("engine", "'verl' (vLLM rollouts, DeepSpeed actor, old log-probs every step; "
                      "rows counted packed)")
    if not keys.flag("ds.packing_samples", DEFAULTS["ds.packing_samples"], d):
        keys.notes.assume("padding", "ds.packing_samples off: padding to the longest row is not counted")
    silent = not keys.has("algo.kl.init_coef")
    coef = keys.number("algo.kl.init_coef", DEFAULTS["algo.kl.init_coef"], d, least=0, whole=False,
                       other=OtherReading("0 (no reference pass)", {"beta": 0.0}) if silent else None)
    settings["beta"] = coef if coef > 0 else 0.0
    settings["lora_rank"] = keys.number("ds.lora.rank", DEFAULTS["ds.lora.rank"], d, least=0, most=65536)
    if settings["lora_rank"]:
        t = keys.get("ds.lora.target_modules", DEFAULTS["ds.lora.target_modules"], d)
        names = set(map(str, t)) if isinstance(t, (list, tuple)) else {str(t)}
        settings["lora_targets"] = ",".join(x for x in MODULES if x in names) or "all-linear"
    gc = DEFAULTS["actor.gradient_checkpointing_enable"]
    settings["gradient_checkpointing"] = keys.flag(
        "actor.gradient_checkpointing_enable", gc, d,
        other=OtherReading(str(not gc), {"gradient_checkpointing": not gc}))
    model = keys.text("actor.model_name_or_path")
    if model:
        settings["model"] = model
    elif "model" not in given:
        raise RunLogError(f"{src}: actor.model_name_or_path: not in the log; pass --model")
    reward = keys.text("reward.model_name_or_path")
    if reward and not keys.has("reward.remote_url"):
        settings["reward_model"] = reward.split(",")[0]
    return settings


def import_openrlhf(path: str | Path, **overrides: Any) -> ImportedRun:
    """Account the OpenRLHF run whose console log, TensorBoard event file or log folder
    (event files under it, and a ``*.log``/``*.txt``/``*.sh`` with the config) is ``path``.

    Returns:
        :class:`ImportedRun` over the logged training steps, with phase timings.

    Raises:
        RunLogError: unreadable files, no step with ``response_length``, a PPO-with-critic run
        (``n_samples_per_prompt`` 1 or estimator ``gae``), a missing model, a count that is not
        a whole number >= 1.
    """
    p = run_path(path, MAX_LOG_BYTES, "from_openrlhf")
    src = f"from_openrlhf={str(path)!r}"
    given = check_overrides(src, overrides)
    no_critic(src, given, "OpenRLHF's GRPO (PPO with a critic is not priced from its logs)")
    config, steps = _read_logs(p, src)
    notes = Provenance()
    notes.given(given)
    train = sorted((s, m) for s, m in steps.items() if "response_length" in m
                   or "rollout/response_length_mean" in m)
    if not train:
        raise RunLogError(f"{src}: no training step with response_length (expected "
                          "'Global step N: {...}' lines or train/response_length scalars)")
    if not config and not {"group_size", "prompts", "model"} <= set(given):
        raise RunLogError(f"{src}: no config (the 'namespace(...)' line OpenRLHF prints at "
                          "start, or --key value command lines); put the console log next to "
                          "the event files or pass --model, --prompts and --group-size")
    if not config:
        notes.assume("algo.advantage.estimator", "a GRPO-style estimator (no config; G given)")
        config["algo.advantage.estimator"] = "group_norm"
    keys = KeyReader(config, src, "config", notes)
    settings = _settings(keys, given)
    devices = keys.number("actor.num_nodes", DEFAULTS["actor.num_nodes"], "OpenRLHF default", least=1) \
        * keys.number("actor.num_gpus_per_node", DEFAULTS["actor.num_gpus_per_node"], "OpenRLHF default", least=1)
    settings.update(given)
    log = _steps(train, src, settings["prompts"] * settings["group_size"])
    pricing = log.pricing(
        src, settings, notes,
        lengths="per step: total_length - response_length (prompt), response_length",
        rows="per step: rollout/num_samples (rows trained)",
        per_row="all rows at the logged means (OpenRLHF logs no maximum length)",
        timers=("timing/generation -> search; timing/make_experience + timing/ppo_train -> "
                "learning (reward inside make_experience)"))
    return imported(pricing, notes, given, steps=len(log.steps), engine="verl",
                    phase_seconds=log.phase_seconds, num_devices=devices, source=str(path))


def _steps(train: list[tuple[int, dict[str, float]]], src: str, rows_planned: int) -> StepLog:
    """The logged steps: prompt = total_length - response_length, rows trained from
    ``rollout/num_samples`` (a whole number >= 1)."""
    log = StepLog(PHASE_TIMERS)
    for s, m in train:
        where = f"{src}: step {s}"
        resp = as_number(where, "response_length", m.get("response_length",
                                                         m.get("rollout/response_length_mean")))
        if "total_length" not in m:
            raise RunLogError(f"{where}: total_length: missing (prompt length unknown)")
        prompt = as_number(where, "total_length", m["total_length"]) - resp
        if prompt < 1:
            raise RunLogError(f"{where}: total_length={m['total_length']:g} is not above "
                              f"response_length={resp:g}")
        rows = m.get("rollout/num_samples")
        weight = 1.0 if rows is None else \
            check_number(where, "rollout/num_samples", rows, least=1, most=2**31) / rows_planned
        log.add(where, m, LoggedStep(prompt, resp, None, weight))
    return log
