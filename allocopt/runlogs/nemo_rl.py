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

from allocopt.runlogs.common import (ImportedRun, LoggedStep, RunLogError, StepLog,
                                     as_number, check_overrides)
from allocopt.runlogs.scalars import event_files, read_event_hparams, read_event_scalars

PHASE_TIMERS = {"timing/train/generation": "search", "timing/train/reward_calculation": "reward",
                "timing/train/policy_and_reference_logprobs": "learning",
                "timing/train/policy_training": "learning"}
# examples/configs/grpo_math_1B.yaml, where the log does not say
DEFAULTS = {"policy.dtensor_cfg.activation_checkpointing": False,
            "policy.dtensor_cfg.lora_cfg.enabled": False, "cluster.num_nodes": 1,
            "cluster.gpus_per_node": 1, "loss_fn.reference_policy_kl_penalty": 0.01}


def import_nemo_rl(path: str | Path, **overrides: Any) -> ImportedRun:
    """Account the NeMo-RL run whose TensorBoard folder (or event file) is ``path``.

    Returns:
        :class:`ImportedRun` over the logged training steps, with phase timings;
        ``fields_read["performance/train_flops_per_gpu"]`` compares NeMo-RL's own training
        FLOP/s with allocopt's when the log has it.

    Raises:
        RunLogError: no event files, tensorboard not installed, no step with
        ``train/mean_gen_tokens_per_sample``, a missing batch size or model.
    """
    p = Path(path)
    src = f"from_nemo_rl={str(path)!r}"
    if not p.exists():
        raise RunLogError(f"{src}: no such file or folder")
    given = check_overrides(src, overrides)
    files = event_files(p)
    if not files:
        raise RunLogError(f"{src}: no TensorBoard event files (events.out.tfevents.*); NeMo-RL "
                          "writes them under <logger.log_dir>/tensorboard when "
                          "logger.tensorboard_enabled is true")
    steps = read_event_scalars(files, src)
    config = read_event_hparams(files, src)
    read: dict[str, str] = {k: "given" for k in given}
    assumed: dict[str, str] = {}

    def cfg(key: str, required: str | None = None) -> Any:
        if config.get(key) is not None:
            read[key] = f"{config[key]!r} (hparams)"
            return config[key]
        if required and required not in given:
            raise RunLogError(f"{src}: {key}: not in the log's hparams; pass --"
                              f"{required.replace('_', '-')}")
        if key in DEFAULTS:
            assumed[key] = f"{DEFAULTS[key]!r} (grpo_math_1B.yaml)"
        return DEFAULTS.get(key)

    train = sorted((s, m) for s, m in steps.items() if "train/mean_gen_tokens_per_sample" in m)
    if not train:
        raise RunLogError(f"{src}: no step with train/mean_gen_tokens_per_sample")
    settings: dict[str, Any] = {"engine": "verl", "update_passes": 1.0}
    prompts = cfg("grpo.num_prompts_per_step", "prompts")
    G = cfg("grpo.num_generations_per_prompt", "group_size")
    model = cfg("policy.model_name", "model")
    if prompts is not None:
        settings["prompts"] = int(prompts)
    if G is not None:
        settings["group_size"] = int(G)
    if model is not None:
        settings["model"] = str(model)
    rows = int(given.get("prompts") or prompts) * int(given.get("group_size") or G)
    gbs = config.get("policy.train_global_batch_size")
    if gbs:
        read["policy.train_global_batch_size"] = f"{gbs!r} (hparams)"
        settings["minibatches"] = max(1, rows // int(gbs))
    coef = float(cfg("loss_fn.reference_policy_kl_penalty"))
    settings["beta"] = coef if coef > 0 else 0.0
    if coef <= 0:
        assumed["reference pass"] = ("not counted (reference_policy_kl_penalty 0; NeMo-RL skips it "
                                     "with grpo.skip_reference_policy_logprobs_calculation)")
    settings["gradient_checkpointing"] = bool(cfg("policy.dtensor_cfg.activation_checkpointing"))
    if cfg("policy.dtensor_cfg.lora_cfg.enabled"):
        settings["lora_rank"] = int(config.get("policy.dtensor_cfg.lora_cfg.dim") or 8)
    else:
        settings["lora_rank"] = 0
    assumed["engine"] = ("'verl' (vLLM rollouts, packed rows, old log-probs every step: "
                         "policy_and_reference_logprobs)")
    devices = int(cfg("cluster.num_nodes")) * int(cfg("cluster.gpus_per_node"))
    settings.update(given)

    log = StepLog(PHASE_TIMERS)
    nemo_rate: list[tuple[float, float]] = []  # (TFLOP/s per GPU, policy_training seconds)
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
            trained = as_number(where, "train/total_num_tokens", m["train/total_num_tokens"]) / (prompt + gen)
            weight = trained / rows
        log.add(where, m, LoggedStep(prompt, gen, gmax, weight))
        if "performance/train_flops_per_gpu" in m and "timing/train/policy_training" in m:
            nemo_rate.append((m["performance/train_flops_per_gpu"], m["timing/train/policy_training"]))
    acct = log.account(
        src, settings, read, assumed,
        lengths=("per step: train/mean_prompt_length, train/mean_gen_tokens_per_sample, "
                 "train/max_gen_tokens_per_sample"),
        rows="per step: train/total_num_tokens / (prompt + response means)", rows_tolerance=0.01,
        per_row="prompts all at the mean; responses one row at the logged max, the rest equal (the "
                "logged mean kept)",
        timers=("timing/train/generation -> search; reward_calculation -> reward; "
                "policy_and_reference_logprobs + policy_training -> learning"))
    if nemo_rate:
        secs = sum(t for _, t in nemo_rate)
        theirs = sum(r * t for r, t in nemo_rate) / secs  # TFLOP/s per GPU, time-weighted
        ln = acct.executed.learning
        update = sum(v for k, v in ln.items() if k in ("forward", "backward", "recompute", "head_recompute"))
        ours = update / secs / devices / 1e12
        read["performance/train_flops_per_gpu"] = (
            f"NeMo-RL {theirs:.3g} TFLOP/s per GPU in policy_training; allocopt's update "
            f"(forward + backward{' + recompute' if ln.get('recompute') else ''}) over the "
            f"same seconds {ours:.3g} ({ours / theirs - 1:+.1%})")
    return ImportedRun(account=acct, steps=len(log.steps), engine="verl", fields_read=read,
                       fields_assumed=assumed, phase_seconds=log.phase_seconds,
                       num_devices=devices, source=str(path), settings=settings)
