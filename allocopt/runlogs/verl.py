"""Account a verl PPO/GRPO run from its console log or its JSON-lines metrics.

What verl prints (``verl/trainer/ppo/ray_trainer.py``: ``pprint`` of the resolved config at
start, then ``logger.log(data=metrics, step=global_steps)``; the console backend writes one
line per step, ``step:N - key:value - key:value …``, behind Ray's ``(TaskRunner pid=…)``
prefix; the ``file`` backend writes JSON lines). Read per step: ``response_length/mean``,
``response_length/max``, ``prompt_length/mean``, ``perf/total_num_tokens`` and the phase
timings ``timing_s/gen`` (search), ``timing_s/reward`` (reward), ``timing_s/old_log_prob``,
``timing_s/ref``, ``timing_s/update_actor`` (learning). Read from the config dump (or from
``key.path=value`` override lines): ``data.train_batch_size`` (prompts per step),
``actor_rollout_ref.rollout.n`` (G), ``actor.ppo_epochs`` (update passes),
``actor.ppo_mini_batch_size`` (optimizer steps per pass), ``actor.use_kl_loss`` /
``kl_loss_coef`` and ``algorithm.use_kl_in_reward`` (the reference pass), ``model.lora_rank``
(or ``model.lora.rank``), ``model.target_modules``, ``model.enable_gradient_checkpointing``,
``model.use_remove_padding``, ``model.path``, ``trainer.n_gpus_per_node × trainer.nnodes``.

Limits (:mod:`allocopt.limits`): the log at most 512 MiB, read one line at a time (at most
1 MiB a line); at most :data:`MAX_STEPS` (1,000,000) steps and 10,000 lines / 1 MiB of config
dump; JSON lines nested at most 64 deep. Config numbers must be numbers (not strings), whole
and in range (batch size, G, mini-batch size, GPUs >= 1); step numbers whole, 0 to 2**31;
metrics finite. Else one line naming the file and the field.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from typing import Any

from allocopt.limits import MAX_DEPTH, MAX_LOG_BYTES, iter_lines, loads_json
from allocopt.runlogs.scalars import scalar
from allocopt.runlogs.common import (ImportedRun, LoggedStep, RunLogError, account_steps,
                                     as_number, check_overrides)

_PREFIX = re.compile(r"^(?:【[^】]*】\s*)?(?:\([\w.]+ pid=\d+(?:, ip=[\d.]+)?\)\s?)?")
_STEP = re.compile(r"^step:(\d+) - (.*)$")
_OVERRIDE = re.compile(r"^\s*\+{0,2}([A-Za-z_][\w.]*)=(\S+?)\s*\\?$")
PHASE_TIMERS = {"gen": "search", "reward": "reward", "old_log_prob": "learning",
                "ref": "learning", "update_actor": "learning"}
MAX_STEPS = 1_000_000
"""Most training steps one log may hold."""
_MAX_BLOCK_LINES = 10_000
_MAX_BLOCK_CHARS = 2**20
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
EXPERT_PARAMETERS = {"experts.gate_up_proj": "experts.gate_up_proj",
                     "experts.down_proj": "experts.down_proj", "gate.weight": "router"}
"""``model.target_parameters`` (peft ``target_parameters``, matched by suffix) -> allocopt's
LoRA target names (:data:`allocopt.flops.shapes.EXPERT_MODULES`)."""


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def parse_verl_log(path: Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, float]]]]:
    """``(config, steps)``: the flattened config (dotted keys) and ``(step, metrics)`` per
    training step, from a console log or JSON lines. Raises :class:`RunLogError`."""
    src = f"from_verl={str(path)!r}"
    config: dict[str, Any] = {}
    steps: dict[int, dict[str, float]] = {}
    block: list[str] | None = None
    depth = chars = 0

    def step_of(v: Any, n: int) -> dict[str, float]:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise RunLogError(f"{src}: line {n}: step={v!r}: must be a whole number")
        try:
            f = float(v)
        except ValueError:
            raise RunLogError(f"{src}: line {n}: step={v!r}: must be a whole number") from None
        if not (math.isfinite(f) and f.is_integer() and 0 <= f <= 2**31):
            raise RunLogError(f"{src}: line {n}: step={v!r}: must be a whole number from 0 to 2**31")
        if int(f) not in steps and len(steps) >= MAX_STEPS:
            raise RunLogError(f"{src}: more than the limit of {MAX_STEPS} steps")
        return steps.setdefault(int(f), {})

    for n, raw in enumerate(iter_lines(path, MAX_LOG_BYTES, "from_verl", RunLogError, errors="replace"), 1):
        line = _PREFIX.sub("", raw.rstrip())
        if block is None and line.lstrip().startswith("{'"):  # pprint of the config
            block, depth, chars = [], 0, 0
        if block is not None:
            block.append(line)
            chars += len(line)
            if len(block) > _MAX_BLOCK_LINES or chars > _MAX_BLOCK_CHARS:
                raise RunLogError(f"{src}: line {n}: the config dump is over the limit of "
                                  f"{_MAX_BLOCK_LINES} lines / 1 MiB")
            depth += line.count("{") - line.count("}")
            if depth > MAX_DEPTH:
                raise RunLogError(f"{src}: line {n}: the config dump is nested deeper than the "
                                  f"limit of {MAX_DEPTH} levels")
            if depth <= 0:
                try:
                    config.update(_flatten(ast.literal_eval("\n".join(block))))
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    pass  # not a config dump after all
                block = None
            continue
        if line.startswith("{") and '"' in line:  # JSON lines (verl's file logger)
            try:
                rec = loads_json(line, f"{path}:{n}", "from_verl", RunLogError)
            except RunLogError as e:
                if "nested deeper" in str(e):
                    raise
                continue
            data = rec.get("data", rec) if isinstance(rec, dict) else None
            if isinstance(data, dict) and "step" in rec:
                step_of(rec["step"], n).update(
                    {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
            continue
        m = _STEP.match(line.strip())
        if m:
            metrics = step_of(m.group(1), n)
            for part in m.group(2).split(" - "):
                key, sep, value = part.rpartition(":")
                if sep:
                    try:
                        metrics[key.strip()] = float(value)
                    except ValueError:
                        pass
            continue
        o = _OVERRIDE.match(line)
        if o and "." in o.group(1):
            config.setdefault(o.group(1), scalar(o.group(2)))
    return config, sorted(steps.items())


def n_gpus_of(cfg: Any, num: Any) -> int:
    """GPUs of the actor (``trainer.n_gpus_per_node × trainer.nnodes``; 1 when not logged)."""
    n = num("trainer.n_gpus_per_node", cfg("trainer.n_gpus_per_node", 1, "not in the log"), least=1)
    return int(n) * int(num("trainer.nnodes", cfg("trainer.nnodes", 1, "verl default"), least=1))


def _micro_batches(settings: dict[str, Any], cfg: Any, num: Any, given: dict[str, Any],
                   gpus: int, src: str, assumed: dict[str, str], *, experts: bool) -> None:
    """``micro_batch_size`` and ``log_prob_micro_batch_size`` (rows per GPU per forward call)
    from verl's ``actor.ppo_micro_batch_size_per_gpu`` and
    ``rollout.log_prob_micro_batch_size_per_gpu`` (or the deprecated global sizes over the
    GPUs, as verl normalizes them). With ``actor.use_dynamic_bsz`` verl packs each micro-batch
    up to ``ppo_max_token_len_per_gpu`` tokens, so the rows per call depend on the lengths:
    with LoRA on experts (the only count they move) that is refused unless given."""
    a, r = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    if cfg(a + "use_dynamic_bsz", False, "verl default") is True:
        if experts and "micro_batch_size" not in given:
            raise RunLogError(
                f"{src}: {a}use_dynamic_bsz=True: verl packs micro-batches by token count "
                f"({a}ppo_max_token_len_per_gpu), so the expert-adapter folds per call are not "
                "in the log; pass --micro-batch-size (and --log-prob-micro-batch-size) ROWS, "
                "the mean rows per micro-batch per GPU")
        return
    for key, (per_gpu, total) in (("micro_batch_size", ("ppo_micro_batch_size_per_gpu", a + "ppo_micro_batch_size")),
                                  ("log_prob_micro_batch_size", ("log_prob_micro_batch_size_per_gpu",
                                                                 r + "log_prob_micro_batch_size"))):
        base = a if key == "micro_batch_size" else r
        v = num(base + per_gpu, cfg(base + per_gpu, None, "not in the log"), least=1)
        if v is None:
            t = num(total, cfg(total, None, "not in the log"), least=1)
            v = None if t is None else max(1, int(t) // gpus)
        if v is not None:
            settings[key] = int(v)
        elif experts:
            assumed[key] = "1 (not in the log: verl requires it; one fold per row, an upper bound)"


def import_verl(path: str | Path, **overrides: Any) -> ImportedRun:
    """Account the verl run whose console log (or JSON-lines metrics file) is ``path``.

    Args:
        path: the log file.
        overrides: :data:`~allocopt.plan.recipe.RECIPE_KEYS` that win over the log (``model``
            when ``actor_rollout_ref.model.path`` is not a preset or a local folder).

    Returns:
        :class:`ImportedRun` over the training steps in the log (``step:0`` validation-only
        lines are skipped), with phase timings when the log has ``timing_s/*``.

    Raises:
        RunLogError: unreadable log, no training step, a missing batch size or group size.
    """
    p = Path(path)
    src = f"from_verl={str(path)!r}"
    if not p.is_file():
        raise RunLogError(f"{src}: not a file")
    given = check_overrides(src, overrides)
    config, steps = parse_verl_log(p)
    read: dict[str, str] = {k: "given" for k in given}
    assumed: dict[str, str] = {}

    def cfg(key: str, default: Any, why: str, *alts: str) -> Any:
        for k in (key, *alts):
            if config.get(k) is not None:
                read[k] = f"{config[k]!r} (config)"
                return config[k]
        assumed[key] = f"{default!r} ({why})"
        return default

    def num(key: str, v: Any, *, least: float, whole: bool = True) -> Any:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RunLogError(f"{src}: {key}={v!r}: must be a number, not {type(v).__name__}")
        if not math.isfinite(v) or v < least or v > 2**31 or (whole and not float(v).is_integer()):
            raise RunLogError(f"{src}: {key}={v!r}: must be {'a whole number' if whole else 'a finite number'} "
                              f">= {least:g} (and at most 2**31)")
        return int(v) if whole else float(v)

    train = [(s, m) for s, m in steps if "response_length/mean" in m]
    if not train:
        raise RunLogError(f"{src}: no training step with response_length/mean "
                          "(expected lines 'step:N - … - response_length/mean:…')")
    settings: dict[str, Any] = {"engine": "verl"}
    batch = num("data.train_batch_size", cfg("data.train_batch_size", None, "not in the log"), least=1)
    G = num("actor_rollout_ref.rollout.n", cfg("actor_rollout_ref.rollout.n", None, "not in the log"), least=1)
    for name, v in (("data.train_batch_size", batch), ("actor_rollout_ref.rollout.n", G)):
        if v is None and {"data.train_batch_size": "prompts",
                          "actor_rollout_ref.rollout.n": "group_size"}[name] not in given:
            raise RunLogError(f"{src}: {name}: not in the log's config; pass --"
                              f"{'prompts' if 'batch' in name else 'group-size'}")
    if batch is not None:
        settings["prompts"] = int(batch)
    if G is not None:
        settings["group_size"] = int(G)
    settings["update_passes"] = float(num("actor_rollout_ref.actor.ppo_epochs",
                                          cfg("actor_rollout_ref.actor.ppo_epochs", 1, "verl default"), least=1))
    mini = num("actor_rollout_ref.actor.ppo_mini_batch_size",
               cfg("actor_rollout_ref.actor.ppo_mini_batch_size", batch, "verl: the whole batch"), least=1)
    if mini:
        settings["minibatches"] = max(1, int(batch or mini) // int(mini))
    kl_loss = bool(cfg("actor_rollout_ref.actor.use_kl_loss", False, "verl default"))
    kl_reward = bool(cfg("algorithm.use_kl_in_reward", False, "verl default"))
    coef = num("actor_rollout_ref.actor.kl_loss_coef", cfg("actor_rollout_ref.actor.kl_loss_coef", 0.001,
               "verl default"), least=0, whole=False) if kl_loss \
        else num("algorithm.kl_ctrl.kl_coef", cfg("algorithm.kl_ctrl.kl_coef", 0.001, "verl default"),
                 least=0, whole=False) if kl_reward else 0.0
    settings["beta"] = coef if (kl_loss or kl_reward) and coef > 0 else 0.0
    rank = cfg("actor_rollout_ref.model.lora_rank", 0, "verl default: full fine-tuning",
               "actor_rollout_ref.model.lora.rank")
    settings["lora_rank"] = num("actor_rollout_ref.model.lora_rank", rank or 0, least=0)
    if settings["lora_rank"]:
        targets = cfg("actor_rollout_ref.model.target_modules", "all-linear", "verl default")
        if isinstance(targets, (list, tuple)):
            targets = ",".join(t for t in MODULES if t in set(targets)) or "all-linear"
        params = cfg("actor_rollout_ref.model.target_parameters", None, "verl default: none")
        experts = [name for p in (params if isinstance(params, (list, tuple)) else [])
                   for suffix, name in EXPERT_PARAMETERS.items() if str(p).endswith(suffix)]
        settings["lora_targets"] = ",".join([str(targets), *dict.fromkeys(experts)])
        _micro_batches(settings, cfg, num, given, n_gpus_of(cfg, num), src, assumed,
                       experts=bool(experts))
    settings["gradient_checkpointing"] = bool(cfg(
        "actor_rollout_ref.model.enable_gradient_checkpointing", True, "verl default"))
    rmpad = cfg("actor_rollout_ref.model.use_remove_padding", True, "verl GRPO examples")
    if rmpad is False:
        assumed["padding"] = ("use_remove_padding=False: the verl engine counts packed rows; "
                              "executed padding to max_prompt/response_length is not included")
    model = cfg("actor_rollout_ref.model.path", None, "not in the log")
    if model:
        settings["model"] = str(model)
    elif "model" not in given:
        raise RunLogError(f"{src}: actor_rollout_ref.model.path: not in the log; pass --model")
    n_gpus = num("trainer.n_gpus_per_node", cfg("trainer.n_gpus_per_node", None, "not in the log"), least=1)
    nnodes = num("trainer.nnodes", cfg("trainer.nnodes", 1, "verl default"), least=1)
    settings.update(given)

    logged: list[LoggedStep] = []
    seconds = {"search": 0.0, "learning": 0.0, "reward": 0.0}
    timed = False
    tokens_logged = 0.0
    for s, m in train:
        where = f"{src}: step {s}"
        pm = as_number(where, "prompt_length/mean", m["prompt_length/mean"]) \
            if "prompt_length/mean" in m else None
        if pm is None:
            raise RunLogError(f"{where}: prompt_length/mean: missing")
        rmax = m.get("response_length/max")
        logged.append(LoggedStep(pm, as_number(where, "response_length/mean", m["response_length/mean"]),
                                 None if rmax is None else as_number(where, "response_length/max", rmax),
                                 1.0))
        tokens_logged += as_number(where, "perf/total_num_tokens", m.get("perf/total_num_tokens", 0.0))
        for timer, phase in PHASE_TIMERS.items():
            if f"timing_s/{timer}" in m:
                seconds[phase] += as_number(where, f"timing_s/{timer}", m[f"timing_s/{timer}"])
                timed = True
    read["lengths"] = "per step: prompt_length/mean, response_length/mean, response_length/max"
    if tokens_logged:
        read["perf/total_num_tokens"] = f"{tokens_logged:.0f} over the run (cross-check)"
    if timed:
        read["phase_seconds"] = ("timing_s/gen -> search; timing_s/reward -> reward; "
                                 "timing_s/old_log_prob + ref + update_actor -> learning")
    assumed["per-row lengths"] = ("prompts all at the mean; responses one row at the logged "
                                  "max, the rest equal (the logged mean kept)")
    acct = account_steps(src, settings, logged)
    return ImportedRun(account=acct, steps=len(logged), engine=str(settings.get("engine")),
                       fields_read=read, fields_assumed=assumed,
                       phase_seconds=seconds if timed else None,
                       num_devices=int(n_gpus) * int(nnodes or 1) if n_gpus else None,
                       source=str(path), settings=settings)
