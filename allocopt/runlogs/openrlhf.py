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
from typing import Any

from allocopt.runlogs.common import (ImportedRun, LoggedStep, RunLogError, StepLog,
                                     as_number, check_overrides)
from allocopt.runlogs.scalars import (event_files, parse_call_dump, parse_flags,
                                      read_event_scalars, read_text)

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_STEP = re.compile(r"Global step (\d+): (\{.*\})\s*$")
PHASE_TIMERS = {"timing/generation": "search", "timing/make_experience": "learning",
                "timing/ppo_train": "learning"}
# OpenRLHF's argparse defaults (openrlhf/cli/train_ppo_ray.py) where the log does not say
DEFAULTS = {"rollout.batch_size": 1024, "rollout.n_samples_per_prompt": 1, "train.max_epochs": 1,
            "train.batch_size": 128, "algo.kl.init_coef": 0.01, "ds.lora.rank": 0,
            "ds.lora.target_modules": "all-linear", "actor.gradient_checkpointing_enable": False,
            "actor.num_nodes": 1, "actor.num_gpus_per_node": 8, "algo.advantage.estimator": "gae",
            "ds.packing_samples": False}


def parse_openrlhf_console(text: str) -> tuple[dict[str, Any], dict[int, dict[str, float]]]:
    """``(config, {step: metrics})`` of an OpenRLHF console log."""
    config: dict[str, Any] = {}
    steps: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        if "namespace(" in line and not config:
            config = parse_call_dump(line[line.find("namespace("):], "namespace") or {}
            continue
        m = _STEP.search(line)
        if m:
            try:
                d = ast.literal_eval(m.group(2))
            except (ValueError, SyntaxError):
                continue
            if isinstance(d, dict):
                steps.setdefault(int(m.group(1)), {}).update(
                    {str(k): float(v) for k, v in d.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)})
    for k, v in parse_flags(text).items():
        config.setdefault(k, v)
    return config, steps


def import_openrlhf(path: str | Path, **overrides: Any) -> ImportedRun:
    """Account the OpenRLHF run whose console log, TensorBoard event file or log folder
    (event files under it, and a ``*.log``/``*.txt``/``*.sh`` with the config) is ``path``.

    Returns:
        :class:`ImportedRun` over the logged training steps, with phase timings.

    Raises:
        RunLogError: unreadable files, no step with ``response_length``, a PPO-with-critic run
        (``n_samples_per_prompt`` 1 or estimator ``gae``), a missing model.
    """
    p = Path(path)
    src = f"from_openrlhf={str(path)!r}"
    if not p.exists():
        raise RunLogError(f"{src}: no such file or folder")
    given = check_overrides(src, overrides)
    config: dict[str, Any] = {}
    steps: dict[int, dict[str, float]] = {}
    texts = [p] if p.is_file() and not p.name.startswith("events.out.tfevents.") else \
        sorted(x for x in p.glob("*") if x.suffix in (".log", ".txt", ".sh")) if p.is_dir() else []
    for t in texts:
        c, s = parse_openrlhf_console(read_text(t, src))
        for k, v in c.items():
            config.setdefault(k, v)
        for st, m in s.items():
            steps.setdefault(st, {}).update(m)
    files = event_files(p)
    if files:
        for st, m in read_event_scalars(files, src).items():
            steps.setdefault(st, {}).update({k[len("train/"):]: v for k, v in m.items()
                                             if k.startswith("train/")})
    read: dict[str, str] = {k: "given" for k in given}
    assumed: dict[str, str] = {}

    def cfg(key: str) -> Any:
        if config.get(key) is not None:
            read[key] = f"{config[key]!r} (config)"
            return config[key]
        assumed[key] = f"{DEFAULTS.get(key)!r} (OpenRLHF default)"
        return DEFAULTS.get(key)

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
        assumed["algo.advantage.estimator"] = "a GRPO-style estimator (no config; G given)"
        config["algo.advantage.estimator"] = "group_norm"
    estimator = str(cfg("algo.advantage.estimator"))
    G = int(given.get("group_size") or cfg("rollout.n_samples_per_prompt"))
    if estimator == "gae" or G < 2:
        raise RunLogError(f"{src}: algo.advantage.estimator={estimator!r}, "
                          f"rollout.n_samples_per_prompt={G}: PPO with a critic is not priced "
                          "here; a GRPO-style run (group_norm, reinforce_baseline, rloo, dr_grpo) "
                          "with n_samples_per_prompt >= 2 is")
    prompts = int(given.get("prompts") or cfg("rollout.batch_size"))
    settings: dict[str, Any] = {"engine": "verl", "prompts": prompts,
                                "group_size": G,
                                "update_passes": float(cfg("train.max_epochs")),
                                "minibatches": max(1, prompts * G // int(cfg("train.batch_size")))}
    assumed["engine"] = ("'verl' (vLLM rollouts, DeepSpeed actor, old log-probs every step; "
                         "rows counted packed)")
    if not cfg("ds.packing_samples"):
        assumed["padding"] = "ds.packing_samples off: padding to the longest row is not counted"
    coef = float(cfg("algo.kl.init_coef"))
    settings["beta"] = coef if coef > 0 else 0.0
    settings["lora_rank"] = int(cfg("ds.lora.rank") or 0)
    if settings["lora_rank"]:
        t = cfg("ds.lora.target_modules")
        names = set(t) if isinstance(t, (list, tuple)) else {str(t)}
        settings["lora_targets"] = ",".join(x for x in MODULES if x in names) or "all-linear"
    settings["gradient_checkpointing"] = bool(cfg("actor.gradient_checkpointing_enable"))
    model = config.get("actor.model_name_or_path")
    if model:
        settings["model"] = str(model)
        read["actor.model_name_or_path"] = f"{model!r} (config)"
    elif "model" not in given:
        raise RunLogError(f"{src}: actor.model_name_or_path: not in the log; pass --model")
    if config.get("reward.model_name_or_path") and not config.get("reward.remote_url"):
        settings["reward_model"] = str(config["reward.model_name_or_path"]).split(",")[0]
        read["reward.model_name_or_path"] = f"{settings['reward_model']!r} (config)"
    devices = int(cfg("actor.num_nodes")) * int(cfg("actor.num_gpus_per_node"))
    settings.update(given)

    rows_planned = settings["prompts"] * settings["group_size"]
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
        weight = 1.0 if rows is None else as_number(where, "rollout/num_samples", rows) / rows_planned
        log.add(where, m, LoggedStep(prompt, resp, None, weight))
    acct = log.account(
        src, settings, read, assumed,
        lengths="per step: total_length - response_length (prompt), response_length",
        rows="per step: rollout/num_samples (rows trained)",
        per_row="all rows at the logged means (OpenRLHF logs no maximum length)",
        timers=("timing/generation -> search; timing/make_experience + timing/ppo_train -> "
                "learning (reward inside make_experience)"))
    return ImportedRun(account=acct, steps=len(log.steps), engine="verl", fields_read=read,
                       fields_assumed=assumed, phase_seconds=log.phase_seconds,
                       num_devices=devices, source=str(path), settings=settings)
