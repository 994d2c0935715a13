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

What else verl ran is read too: a critic where verl trains one (``critic.enable``, else
``algorithm.adv_estimator == "gae"``, verl's ``need_critic``), from ``critic.model.path`` (or
``--critic``), its ``critic.ppo_epochs`` and ``critic.model.enable_gradient_checkpointing``,
``trainer.critic_warmup`` (no actor update before it), and the timers ``timing_s/values``,
``timing_s/update_critic``; the DAPO recipe's dynamic sampling
(``algorithm.filter_groups.enable``): each step's ``train/num_gen_batches`` generation batches
of ``data.gen_batch_size`` prompts, of which ``data.train_batch_size`` are trained
(``recipe/dapo/dapo_ray_trainer.py``).

Limits (:mod:`allocopt.limits`): the log a regular file of at most 512 MiB, read one line at a
time (at most 1 MiB a line); at most :data:`MAX_STEPS` (1,000,000) steps, one step logged at
most 1,000 times, and 10,000 lines / 1 MiB of config dump; JSON lines nested at most 64 deep.
Config numbers must be numbers (not strings), whole and in range (batch size, G, mini-batch
size, GPUs >= 1); metric values in ASCII digits; step numbers whole, 0 to 2**31; metrics
finite. Else one line naming the file and the field.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from typing import Any

from allocopt.limits import MAX_DEPTH, MAX_LOG_BYTES, RepeatCounter, iter_lines, loads_json, read_number
from allocopt.runlogs.common import (ImportedRun, LoggedStep, RunLogError, StepLog, as_number,
                                     check_overrides, imported)
from allocopt.runlogs.keys import KeyReader, OtherReading, Provenance, check_number
from allocopt.runlogs.scalars import scalar

_PREFIX = re.compile(r"^(?:【[^】]*】\s*)?(?:\([\w.]+ pid=\d+(?:, ip=[\d.]+)?\)\s?)?")
_STEP = re.compile(r"^step:(\d+) - (.*)$", re.ASCII)
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
    repeats = RepeatCounter()

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
        repeats.add(int(f), f"{src}: line {n}", f"step {int(f)}", RunLogError)
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
                if "not valid JSON" not in str(e):  # JSON over a limit; other lines are not JSON
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
                    v = read_number(value, f"{src}: line {n}: {key.strip()[:80]}", RunLogError)
                    if v is not None:
                        metrics[key.strip()] = float(v)
            continue
        o = _OVERRIDE.match(line)
        if o and "." in o.group(1):
            config.setdefault(o.group(1), scalar(o.group(2)))
    return config, sorted(steps.items())


A, M, R = "actor_rollout_ref.actor.", "actor_rollout_ref.model.", "actor_rollout_ref.rollout."
STEP_TIMERS = {f"timing_s/{k}": v for k, v in PHASE_TIMERS.items()} | {
    "timing_s/values": "learning", "timing_s/update_critic": "learning"}
"""verl's per-step timers -> phase (the critic's ``values`` and ``update_critic`` are learning)."""


def n_gpus_of(keys: KeyReader) -> int:
    """GPUs of the actor (``trainer.n_gpus_per_node × trainer.nnodes``; 1 when not logged)."""
    n = keys.number("trainer.n_gpus_per_node", 1, "not in the log", least=1)
    return n * keys.number("trainer.nnodes", 1, "verl default", least=1)


def _micro_batches(settings: dict[str, Any], keys: KeyReader, given: dict[str, Any], gpus: int,
                   *, experts: bool) -> None:
    """``micro_batch_size`` and ``log_prob_micro_batch_size`` (rows per GPU per forward call)
    from verl's ``actor.ppo_micro_batch_size_per_gpu`` and
    ``rollout.log_prob_micro_batch_size_per_gpu`` (or the deprecated global sizes over the
    GPUs, as verl normalizes them). With ``actor.use_dynamic_bsz`` verl packs each micro-batch
    up to ``ppo_max_token_len_per_gpu`` tokens, so the rows per call depend on the lengths:
    with LoRA on experts (the only count they move) that is refused unless given."""
    if keys.flag(A + "use_dynamic_bsz", False, "verl default"):
        if experts and "micro_batch_size" not in given:
            raise RunLogError(
                f"{keys.where}: {A}use_dynamic_bsz=True: verl packs micro-batches by token count "
                f"({A}ppo_max_token_len_per_gpu), so the expert-adapter folds per call are not "
                "in the log; pass --micro-batch-size (and --log-prob-micro-batch-size) ROWS, "
                "the mean rows per micro-batch per GPU")
        return
    for key, base, name in (("micro_batch_size", A, "ppo_micro_batch_size"),
                            ("log_prob_micro_batch_size", R, "log_prob_micro_batch_size")):
        v = keys.number(base + name + "_per_gpu", None, "not in the log", least=1)
        if v is None:
            t = keys.number(base + name, None, "not in the log", least=1)
            v = None if t is None else max(1, t // gpus)
        if v is not None:
            settings[key] = v
        elif experts:
            keys.notes.assume(key, "1 (not in the log: verl requires it; one fold per row, an upper bound)")


def _lora(settings: dict[str, Any], keys: KeyReader, given: dict[str, Any]) -> None:
    """``lora_rank`` and, with one, ``lora_targets`` and the micro-batches (expert folds)."""
    settings["lora_rank"] = keys.number(M + "lora_rank", 0, "verl default: full fine-tuning",
                                        least=0, most=65536, alts=(M + "lora.rank",))
    if not settings["lora_rank"]:
        return
    targets = keys.get(M + "target_modules", "all-linear", "verl default")
    if isinstance(targets, (list, tuple)):
        targets = ",".join(t for t in MODULES if t in set(map(str, targets))) or "all-linear"
    params = keys.get(M + "target_parameters", None, "verl default: none")
    experts = [name for p in (params if isinstance(params, (list, tuple)) else [])
               for suffix, name in EXPERT_PARAMETERS.items() if str(p).endswith(suffix)]
    settings["lora_targets"] = ",".join([str(targets)[:4096], *dict.fromkeys(experts)])
    _micro_batches(settings, keys, given, n_gpus_of(keys), experts=bool(experts))


def _actor_settings(keys: KeyReader, given: dict[str, Any]) -> dict[str, Any]:
    """The recipe settings of verl's actor (batch, G, passes, KL, LoRA, checkpointing, model);
    a batch size, G or model neither in the log nor given is refused in one line."""
    src = keys.where
    settings: dict[str, Any] = {"engine": "verl"}
    for key, flag, name in (("data.train_batch_size", "prompts", "prompts"),
                            (R + "n", "group-size", "group_size")):
        v = keys.number(key, None, least=1)
        if v is None and name not in given:
            raise RunLogError(f"{src}: {key}: not in the log's config; pass --{flag}")
        if v is not None:
            settings[name] = v
    batch = settings.get("prompts")
    settings["update_passes"] = float(keys.number(A + "ppo_epochs", 1, "verl default", least=1))
    mini = keys.number(A + "ppo_mini_batch_size", batch, "verl: the whole batch", least=1)
    if mini:
        settings["minibatches"] = max(1, (batch or mini) // mini)
    silent = not keys.has(A + "use_kl_loss") and not keys.has("algorithm.use_kl_in_reward")
    kl_loss = keys.flag(A + "use_kl_loss", False, "verl default", other=OtherReading(
        "True, kl_loss_coef 0.001 (a reference pass)", {"beta": 0.001}) if silent else None)
    kl_reward = keys.flag("algorithm.use_kl_in_reward", False, "verl default")
    coef = keys.number(A + "kl_loss_coef", 0.001, "verl default", least=0, whole=False) if kl_loss \
        else keys.number("algorithm.kl_ctrl.kl_coef", 0.001, "verl default", least=0, whole=False) \
        if kl_reward else 0.0
    settings["beta"] = coef if (kl_loss or kl_reward) and coef > 0 else 0.0
    _lora(settings, keys, given)
    settings["gradient_checkpointing"] = keys.flag(
        M + "enable_gradient_checkpointing", True, "verl default",
        other=OtherReading("False", {"gradient_checkpointing": False}))
    if keys.flag(M + "use_remove_padding", True, "verl GRPO examples") is False:
        keys.notes.assume("padding", "use_remove_padding=False: the verl engine counts packed rows; "
                          "executed padding to max_prompt/response_length is not included")
    model = keys.text(M + "path")
    if model:
        settings["model"] = model
    elif "model" not in given:
        raise RunLogError(f"{src}: {M}path: not in the log; pass --model")
    return settings


def _uses_critic(keys: KeyReader, settings: dict[str, Any], given: dict[str, Any]) -> bool:
    """Whether verl trained a critic: ``critic.enable`` when set, else
    ``algorithm.adv_estimator == "gae"`` (verl's ``need_critic``; verl's default estimator is
    ``gae``). ``--critic`` decides when given. Refused in one line: ReMax (its greedy baseline
    rollouts are not priced), a group of one without a critic, and a log that names neither
    its estimator nor a critic at ``n = 1``."""
    src, G = keys.where, given.get("group_size", settings.get("group_size"))
    estimator = keys.text("algorithm.adv_estimator")
    if estimator == "remax":
        raise RunLogError(f"{src}: algorithm.adv_estimator='remax': ReMax's greedy baseline "
                          "rollouts are not priced; allowed: gae, grpo and the other estimators "
                          "that generate n rollouts per prompt")
    if "critic" in given:
        return bool(given["critic"])
    if keys.has("critic.enable"):
        return keys.flag("critic.enable", False)
    if estimator is None:
        if keys.has("critic.model.path"):
            keys.notes.assume("algorithm.adv_estimator", "'gae' (not in the log; verl's default, "
                              "and the log names a critic)")
            return True
        if G == 1:
            raise RunLogError(f"{src}: {R}n=1 and no algorithm.adv_estimator in the log: verl's "
                              "default 'gae' trains a critic, which the log does not name "
                              "(critic.model.path); pass --critic MODEL")
        keys.notes.assume("algorithm.adv_estimator", "'grpo' (not in the log; verl's default "
                          "'gae' would train a critic)", OtherReading(
                              "'gae', a critic of the policy's model",
                              {"critic": settings.get("model", given.get("model"))}))
        return False
    if estimator != "gae" and G == 1:
        raise RunLogError(f"{src}: {R}n=1 with algorithm.adv_estimator={estimator!r}: a group of "
                          "one completion has no baseline; allowed: n >= 2, or a PPO run "
                          "(adv_estimator=gae, with its critic)")
    return estimator == "gae"


def _critic_settings(keys: KeyReader, settings: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The critic verl trained, as recipe settings (``critic``, its passes and checkpointing),
    from the log's ``critic`` block or ``--critic``; ``{}`` without one. A critic the log does
    not name, or one with LoRA (priced fully fine-tuned), is refused in one line."""
    if not _uses_critic(keys, settings, given):
        return {}
    src = keys.where
    path = given.get("critic") or keys.text("critic.model.path")
    if not path:
        raise RunLogError(f"{src}: algorithm.adv_estimator='gae': verl trains a critic, and the "
                          "log does not name it (critic.model.path); pass --critic MODEL")
    if keys.number("critic.model.lora_rank", 0, least=0):
        raise RunLogError(f"{src}: critic.model.lora_rank={keys.config['critic.model.lora_rank']!r}: "
                          "a critic with LoRA is not priced (critics are priced fully fine-tuned); "
                          "allowed: 0")
    out: dict[str, Any] = {"critic": str(path)}
    actor = given.get("update_passes", settings["update_passes"])
    passes = keys.number("critic.ppo_epochs", int(actor) if float(actor).is_integer() else actor,
                         "verl: the actor's ppo_epochs", least=1, whole=False)
    if passes != actor:
        out["critic_update_passes"] = float(passes)
    out["critic_gradient_checkpointing"] = keys.flag(
        "critic.model.enable_gradient_checkpointing", True, "verl default",
        other=OtherReading("False", {"critic_gradient_checkpointing": False}))
    return out


def _generation_batch(keys: KeyReader, settings: dict[str, Any], train: list[tuple[int, dict]],
                      given: dict[str, Any]) -> int | None:
    """Prompts per generation batch of verl's DAPO trainer (``data.gen_batch_size``) when it
    filters groups (``algorithm.filter_groups.enable``), else ``None``. Each step then draws
    ``train/num_gen_batches`` such batches (logged per step); a filtering log that records no
    such count is refused in one line. Without filtering the DAPO trainer trains every prompt
    of its one generation batch (``prompts`` becomes ``data.gen_batch_size``)."""
    src = keys.where
    filtering = keys.has("algorithm.filter_groups.enable") and keys.flag("algorithm.filter_groups.enable", False)
    gen = keys.number("data.gen_batch_size", None, least=1)
    if "generated_per_trained" in given:
        return None
    if not filtering:
        if gen is not None and "prompts" not in given:
            settings["prompts"] = gen
        return None
    if gen is None:
        gen = settings["prompts"]
        keys.notes.assume("data.gen_batch_size", f"{gen} (the DAPO recipe's default: train_batch_size)")
    if not any("train/num_gen_batches" in m for _, m in train):
        raise RunLogError(f"{src}: algorithm.filter_groups.enable=True: no step logs "
                          "train/num_gen_batches, so the groups generated per step are not in the "
                          "log; allowed: a log with train/num_gen_batches per step (verl's DAPO "
                          "trainer writes it)")
    return gen


def _logged_steps(train: list[tuple[int, dict]], src: str, prompts: int, gen_batch: int | None,
                  warmup: int) -> StepLog:
    """The training steps as :class:`LoggedStep` (lengths; with dynamic sampling, the prompts
    generated per prompt trained from each step's ``train/num_gen_batches``; before
    ``trainer.critic_warmup``, no actor update), their timers summed."""
    log = StepLog(STEP_TIMERS)
    for s, m in train:
        where = f"{src}: step {s}"
        if "prompt_length/mean" not in m:
            raise RunLogError(f"{where}: prompt_length/mean: missing")
        rmax = m.get("response_length/max")
        generated = 1.0
        if gen_batch is not None:
            if "train/num_gen_batches" not in m:
                raise RunLogError(f"{where}: train/num_gen_batches: missing (other steps log it)")
            n = check_number(where, "train/num_gen_batches", m["train/num_gen_batches"], least=1,
                             most=10**6)
            if n * gen_batch < prompts:
                raise RunLogError(f"{where}: train/num_gen_batches={n} x data.gen_batch_size="
                                  f"{gen_batch} prompts is fewer than the {prompts} trained")
            generated = n * gen_batch / prompts
        log.add(where, m, LoggedStep(
            as_number(where, "prompt_length/mean", m["prompt_length/mean"]),
            as_number(where, "response_length/mean", m["response_length/mean"]),
            None if rmax is None else as_number(where, "response_length/max", rmax), 1.0,
            generated, actor_update=s >= warmup))
    return log


def import_verl(path: str | Path, **overrides: Any) -> ImportedRun:
    """Account the verl run whose console log (or JSON-lines metrics file) is ``path``.

    Args:
        path: the log file.
        overrides: :data:`~allocopt.plan.recipe.RECIPE_KEYS` that win over the log (``model``
            when ``actor_rollout_ref.model.path`` is not a preset or a local folder; ``critic``
            for a PPO log that does not name its critic).

    Returns:
        :class:`ImportedRun` over the training steps in the log (``step:0`` validation-only
        lines are skipped), with phase timings when the log has ``timing_s/*``: the actor,
        the critic where verl trained one (``algorithm.adv_estimator=gae`` or
        ``critic.enable``), and DAPO's generation batches per step.

    Raises:
        RunLogError: unreadable log, no training step, a missing batch size, group size, model
            or critic, a filtering log without per-step generation counts (one line each).
    """
    src = f"from_verl={str(path)!r}"
    given = check_overrides(src, overrides)
    config, steps = parse_verl_log(Path(path))
    notes = Provenance()
    notes.given(given)
    keys = KeyReader(config, src, "config", notes)
    train = [(s, m) for s, m in steps if "response_length/mean" in m]
    if not train:
        raise RunLogError(f"{src}: no training step with response_length/mean "
                          "(expected lines 'step:N - … - response_length/mean:…')")
    settings = _actor_settings(keys, given)
    settings.update(_critic_settings(keys, settings, given))
    gen_batch = _generation_batch(keys, settings, train, given)
    warmup = keys.number("trainer.critic_warmup", 0, least=0)
    n_gpus = keys.number("trainer.n_gpus_per_node", None, least=1)
    devices = n_gpus * keys.number("trainer.nnodes", 1, "verl default", least=1) if n_gpus else None
    settings.update(given)
    log = _logged_steps(train, src, settings["prompts"], gen_batch, warmup)
    if gen_batch is not None:
        notes.read["generated per step"] = "per step: train/num_gen_batches x data.gen_batch_size"
        notes.assume("dropped groups' lengths", "those of the trained groups (the log has no others)")
    tokens = sum(as_number(f"{src}: step {s}", "perf/total_num_tokens", m.get("perf/total_num_tokens", 0))
                 for s, m in train)
    if tokens:
        notes.read["perf/total_num_tokens"] = f"{tokens:.0f} over the run (cross-check)"
    pricing = log.pricing(
        src, settings, notes,
        lengths="per step: prompt_length/mean, response_length/mean, response_length/max",
        rows="", per_row=("prompts all at the mean; responses one row at the logged max, the rest "
                          "equal (the logged mean kept)"),
        timers=("timing_s/gen -> search; timing_s/reward -> reward; timing_s/old_log_prob + ref "
                "+ values + update_critic + update_actor -> learning"))
    return imported(pricing, notes, given, steps=len(log.steps), engine=str(settings["engine"]),
                    phase_seconds=log.phase_seconds, num_devices=devices, source=str(path))
