"""Account a NeMo-RL GRPO run (``nemo_rl/algorithms/grpo.py``, ``grpo_train``) from its
TensorBoard logs.

What NeMo-RL writes (``nemo_rl/utils/logger.py``: ``TensorboardLogger.log_metrics`` adds
every metric as ``{prefix}/{name}`` at the step; ``log_hyperparams`` writes the whole config,
flattened with ``.`` by ``flatten_dict``, through ``SummaryWriter.add_hparams``; the folder is
``<logger.log_dir>/tensorboard``). Per step, from ``grpo_train``:

* ``train/mean_prompt_length``, ``train/mean_gen_tokens_per_sample``,
  ``train/max_gen_tokens_per_sample`` (rollout metrics, ``nemo_rl/experience/rollouts.py``),
  ``train/total_num_tokens`` (sum of the trained rows' prompt + response lengths: the rows
  trained = total / (prompt + response means));
* ``timing/train/generation`` (search), ``timing/train/reward_calculation`` (reward),
  ``timing/train/policy_and_reference_logprobs`` + ``timing/train/policy_training``
  (learning);
* ``performance/train_flops_per_gpu``: NeMo-RL's own training TFLOP/s per GPU
  (``nemo_rl/algorithms/utils.py`` ``print_performance_metrics``: the policy worker's
  ``total_flops`` over its training seconds), logged when sequence packing is off.

From the config (the hparams, or ``overrides``): ``grpo.num_prompts_per_step``,
``grpo.num_generations_per_prompt``, ``policy.model_name``, ``policy.train_global_batch_size``
(rows per optimizer step), ``loss_fn.reference_policy_kl_penalty``,
``policy.dtensor_cfg.activation_checkpointing``, ``policy.dtensor_cfg.lora_cfg.enabled`` /
``dim``, ``cluster.num_nodes × cluster.gpus_per_node``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from allocopt.runlogs.common import (ImportedRun, LoggedStep, RunLogError, StepLog, as_number,
                                     check_overrides, imported, no_critic, run_path)
from allocopt.runlogs.keys import KeyReader, OtherReading, Provenance, check_number
from allocopt.runlogs.scalars import MAX_EVENT_BYTES, event_files, read_events

PHASE_TIMERS = {"timing/train/generation": "search", "timing/train/reward_calculation": "reward",
                "timing/train/policy_and_reference_logprobs": "learning",
                "timing/train/policy_training": "learning"}
# examples/configs/grpo_math_1B.yaml, where the log does not say
DEFAULTS = {"policy.dtensor_cfg.activation_checkpointing": False,
            "policy.dtensor_cfg.lora_cfg.enabled": False, "cluster.num_nodes": 1,
            "cluster.gpus_per_node": 1, "loss_fn.reference_policy_kl_penalty": 0.01}


def _settings(keys: KeyReader, given: dict[str, Any]) -> dict[str, Any]:
    """The recipe settings of the hparams (``grpo_math_1B.yaml``'s defaults where silent); a
    batch size, G or model neither logged nor given, or a group of one, refused in one line."""
    src, d = keys.where, "grpo_math_1B.yaml"
    settings: dict[str, Any] = {"engine": "verl", "update_passes": 1.0}
    for key, name, least in (("grpo.num_prompts_per_step", "prompts", 1),
                             ("grpo.num_generations_per_prompt", "group_size", 2)):
        v = keys.number(key, None, least=1, most=65536)
        if v is None and name not in given:
            raise RunLogError(f"{src}: {key}: not in the log's hparams; pass --{name.replace('_', '-')}")
        if v is not None:
            settings[name] = v
        if given.get(name, v) is not None and given.get(name, v) < least:  # no critic: no G = 1
            raise RunLogError(f"{src}: {name if name in given else key}={given.get(name, v)}: "
                              "GRPO's baseline needs >= 2 completions per prompt; allowed: >= 2")
    model = keys.text("policy.model_name")
    if model is None and "model" not in given:
        raise RunLogError(f"{src}: policy.model_name: not in the log's hparams; pass --model")
    if model is not None:
        settings["model"] = model
    rows = given.get("prompts", settings.get("prompts")) * given.get("group_size", settings.get("group_size"))
    gbs = keys.number("policy.train_global_batch_size", None, least=1)
    if gbs:
        settings["minibatches"] = max(1, rows // gbs)
    penalty = DEFAULTS["loss_fn.reference_policy_kl_penalty"]
    coef = keys.number("loss_fn.reference_policy_kl_penalty", penalty, d, least=0, whole=False,
                       other=OtherReading("0 (no reference pass)", {"beta": 0.0}))
    settings["beta"] = coef if coef > 0 else 0.0
    if coef <= 0:
        keys.notes.assume("reference pass", "not counted (reference_policy_kl_penalty 0; NeMo-RL "
                          "skips it with grpo.skip_reference_policy_logprobs_calculation)")
    ac = DEFAULTS["policy.dtensor_cfg.activation_checkpointing"]
    settings["gradient_checkpointing"] = keys.flag(
        "policy.dtensor_cfg.activation_checkpointing", ac, d,
        other=OtherReading(str(not ac), {"gradient_checkpointing": not ac}))
    lora = keys.flag("policy.dtensor_cfg.lora_cfg.enabled", DEFAULTS["policy.dtensor_cfg.lora_cfg.enabled"], d)
    settings["lora_rank"] = keys.number("policy.dtensor_cfg.lora_cfg.dim", 8, "NeMo-RL default",
                                        least=1, most=65536) if lora else 0
    keys.notes.assume("engine", "'verl' (vLLM rollouts, packed rows, old log-probs every step: "
                      "policy_and_reference_logprobs)")
    return settings


def import_nemo_rl(path: str | Path, **overrides: Any) -> ImportedRun:
    """Account the NeMo-RL run whose TensorBoard folder (or event file) is ``path``.

    Returns:
        :class:`ImportedRun` over the logged training steps, with phase timings;
        ``fields_read["performance/train_flops_per_gpu"]`` compares NeMo-RL's own training
        FLOP/s with allocopt's when the log has it.

    Raises:
        RunLogError: no event files, tensorboard not installed, no step with
        ``train/mean_gen_tokens_per_sample``, a missing batch size or model, a count that is
        not a whole number in range.
    """
    p = run_path(path, MAX_EVENT_BYTES, "from_nemo_rl")
    src = f"from_nemo_rl={str(path)!r}"
    given = check_overrides(src, overrides)
    no_critic(src, given, "NeMo-RL's GRPO")
    files = event_files(p, src)
    if not files:
        raise RunLogError(f"{src}: no TensorBoard event files (events.out.tfevents.*); NeMo-RL "
                          "writes them under <logger.log_dir>/tensorboard when "
                          "logger.tensorboard_enabled is true")
    steps, hparams = read_events(files, src)
    notes = Provenance()
    notes.given(given)
    keys = KeyReader(hparams, src, "hparams", notes)
    train = sorted((s, m) for s, m in steps.items() if "train/mean_gen_tokens_per_sample" in m)
    if not train:
        raise RunLogError(f"{src}: no step with train/mean_gen_tokens_per_sample")
    settings = _settings(keys, given)
    devices = keys.number("cluster.num_nodes", DEFAULTS["cluster.num_nodes"], "grpo_math_1B.yaml", least=1) \
        * keys.number("cluster.gpus_per_node", DEFAULTS["cluster.gpus_per_node"], "grpo_math_1B.yaml", least=1)
    settings.update(given)
    log, nemo_rate = _steps(train, src, settings["prompts"] * settings["group_size"])
    pricing = log.pricing(
        src, settings, notes,
        lengths=("per step: train/mean_prompt_length, train/mean_gen_tokens_per_sample, "
                 "train/max_gen_tokens_per_sample"),
        rows="per step: train/total_num_tokens / (prompt + response means)", rows_tolerance=0.01,
        per_row="prompts all at the mean; responses one row at the logged max, the rest equal (the "
                "logged mean kept)",
        timers=("timing/train/generation -> search; reward_calculation -> reward; "
                "policy_and_reference_logprobs + policy_training -> learning"))
    run = imported(pricing, notes, given, steps=len(log.steps), engine="verl",
                   phase_seconds=log.phase_seconds, num_devices=devices, source=str(path))
    if nemo_rate:
        run.fields_read["performance/train_flops_per_gpu"] = _compare(nemo_rate, run, devices)
    return run


def _steps(train: list[tuple[int, dict[str, float]]], src: str,
           rows: int) -> tuple[StepLog, list[tuple[float, float]]]:
    """The logged steps (rows trained from ``train/total_num_tokens``) and NeMo-RL's own
    training rate per step: ``(TFLOP/s per GPU, policy_training seconds)``."""
    log = StepLog(PHASE_TIMERS)
    nemo_rate: list[tuple[float, float]] = []
    for s, m in train:
        where = f"{src}: step {s}"
        gen = as_number(where, "train/mean_gen_tokens_per_sample", m["train/mean_gen_tokens_per_sample"])
        if "train/mean_prompt_length" not in m:
            raise RunLogError(f"{where}: train/mean_prompt_length: missing")
        prompt = as_number(where, "train/mean_prompt_length", m["train/mean_prompt_length"])
        gmax = m.get("train/max_gen_tokens_per_sample")
        if gmax is not None and gmax + 1e-6 < gen:
            raise RunLogError(f"{where}: train/max_gen_tokens_per_sample={gmax:g} is below the "
                              f"mean {gen:g}")
        weight = 1.0
        if "train/total_num_tokens" in m and prompt + gen > 0:
            tokens = check_number(where, "train/total_num_tokens", m["train/total_num_tokens"],
                                  least=0, most=2**31 * (prompt + gen), whole=False)
            weight = tokens / (prompt + gen) / rows  # rows trained: at most 2**31
        log.add(where, m, LoggedStep(prompt, gen, gmax, weight))
        if "performance/train_flops_per_gpu" in m and "timing/train/policy_training" in m:
            nemo_rate.append((m["performance/train_flops_per_gpu"], m["timing/train/policy_training"]))
    return log, nemo_rate


def _compare(nemo_rate: list[tuple[float, float]], run: ImportedRun, devices: int) -> str:
    """NeMo-RL's training TFLOP/s per GPU (time-weighted) beside allocopt's update FLOPs over
    the same seconds."""
    secs = sum(t for _, t in nemo_rate)
    theirs = sum(r * t for r, t in nemo_rate) / secs if secs else 0.0
    ln = run.account.executed.learning
    update = sum(v for k, v in ln.items() if k in ("forward", "backward", "recompute", "head_recompute"))
    ours = update / secs / devices / 1e12 if secs else 0.0
    change = f"{ours / theirs - 1:+.1%}" if theirs else "n/a"
    return (f"NeMo-RL {theirs:.3g} TFLOP/s per GPU in policy_training; allocopt's update "
            f"(forward + backward{' + recompute' if ln.get('recompute') else ''}) over the "
            f"same seconds {ours:.3g} ({change})")
