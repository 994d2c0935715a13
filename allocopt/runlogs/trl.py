"""Account a TRL ``GRPOTrainer`` run from its output folder (or one of its checkpoints).

What TRL 1.16 writes and this reads (``trl/trainer/grpo_trainer.py``,
``_generate_and_score_completions`` and ``log``; ``transformers.Trainer``):

* ``trainer_state.json`` ``log_history``: one record per logging step with ``step``,
  ``num_tokens`` (prompt + completion tokens of all training rollouts so far, cumulative),
  ``completions/mean_length`` and ``completions/max_length`` (averaged over the rollout
  batches generated since the previous record); the last record holds ``train_runtime``;
* ``training_args.bin``: the ``GRPOConfig`` (``num_generations``, ``num_iterations``,
  ``beta``, ``gradient_checkpointing``, ``per_device_train_batch_size``,
  ``gradient_accumulation_steps``, ``steps_per_generation``, ``use_vllm``,
  ``vllm_importance_sampling_correction``, ``use_cpu``), read without torch
  (:mod:`allocopt.runlogs.argsfile`);
* ``adapter_config.json`` (peft): LoRA ``r``, ``target_modules``, ``base_model_name_or_path``.

Files may sit in the folder itself or in its last ``checkpoint-*`` folder. One rollout batch
is ``per_device_train_batch_size × steps_per_generation × world size`` completions, generated
every ``steps_per_generation × num_iterations`` micro-steps, i.e. every ``num_iterations ×
steps_per_generation / gradient_accumulation_steps`` optimizer steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from allocopt.flops.grpo import ENGINES
from allocopt.runlogs.argsfile import read_training_args
from allocopt.runlogs.common import (ImportedRun, LoggedStep, RunLogError, account_steps,
                                     as_number, check_overrides)
from allocopt.plan.setup import RUNNERS

MODULE_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _find(folder: Path, name: str) -> Path | None:
    if (folder / name).is_file():
        return folder / name
    ckpts = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1])
                   if p.name.split("-")[-1].isdigit() else -1)
    for c in reversed(ckpts):
        if (c / name).is_file():
            return c / name
    return None


def import_trl(path: str | Path, **overrides: Any) -> ImportedRun:
    """Account the TRL GRPO run whose output folder is ``path``.

    Args:
        path: a TRL ``output_dir`` or one ``checkpoint-*`` folder in it.
        overrides: :data:`~allocopt.plan.recipe.RECIPE_KEYS` that win over the folder (``model``
            is needed when the folder names no base model; ``world_size`` is not a field:
            pass ``prompts`` for a multi-process run).

    Returns:
        :class:`ImportedRun` over the rollout batches the log covers.

    Raises:
        RunLogError: no ``trainer_state.json``, malformed files, a missing field (named).
    """
    folder = Path(path)
    src = str(path)
    if not folder.is_dir():
        raise RunLogError(f"from_trl={src!r}: not a folder (a TRL output_dir is expected)")
    given = check_overrides(f"from_trl={src!r}", overrides)
    read: dict[str, str] = {k: "given" for k in given}
    assumed: dict[str, str] = {}
    state_file = _find(folder, "trainer_state.json")
    if state_file is None:
        raise RunLogError(f"from_trl={src!r}: no trainer_state.json in the folder or its checkpoints")
    try:
        history = json.loads(state_file.read_text(encoding="utf-8"))["log_history"]
        if not isinstance(history, list):
            raise TypeError
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunLogError(f"{state_file}: not valid JSON") from None
    except (KeyError, TypeError):
        raise RunLogError(f"{state_file}: log_history: missing or not a list") from None

    args: dict[str, Any] = {}
    args_file = _find(folder, "training_args.bin")
    if args_file is not None:
        try:
            args = read_training_args(args_file)
        except ValueError as e:
            raise RunLogError(f"{args_file}: {e}") from None

    def arg(key: str, default: Any, why: str) -> Any:
        if key in args and args[key] is not None:
            read[key] = f"{args[key]!r} ({args_file.name if args_file else 'args'})"
            return args[key]
        assumed[key] = f"{default!r} ({why})"
        return default

    settings: dict[str, Any] = {}
    G = int(arg("num_generations", 8, "GRPOConfig default"))
    mu = float(arg("num_iterations", 1, "GRPOConfig default"))
    beta = float(arg("beta", 0.0, "GRPOConfig default"))
    trl = RUNNERS["trl"]  # GRPOConfig's defaults, where training_args.bin does not say
    gc = bool(arg("gradient_checkpointing", trl["gradient_checkpointing"], "GRPOConfig default"))
    per_device = int(arg("per_device_train_batch_size", 8, "TrainingArguments default"))
    ga = int(arg("gradient_accumulation_steps", 1, "TrainingArguments default"))
    spg = int(arg("steps_per_generation", None, "GRPOConfig: gradient_accumulation_steps") or ga)
    use_vllm = bool(arg("use_vllm", False, "GRPOConfig default"))
    isc = bool(arg("vllm_importance_sampling_correction", trl["importance_sampling_correction"],
                   "GRPOConfig default"))
    use_cpu = bool(arg("use_cpu", False, "TrainingArguments default"))
    settings.update(runner="trl", group_size=G, update_passes=mu, beta=beta, gradient_checkpointing=gc,
                    minibatches=max(1, spg // max(1, ga)), importance_sampling_correction=isc,
                    engine=("trl-vllm-cpu" if use_cpu else "trl-vllm") if use_vllm
                    else ("trl-cpu" if use_cpu else "trl-gpu"))
    read["engine"] = "use_vllm / use_cpu" if args else "assumed"
    if not args:
        assumed["engine"] = f"{settings['engine']!r} (no training_args.bin)"
        del read["engine"]
    rows = per_device * spg
    if "prompts" not in given:
        if rows % G:
            raise RunLogError(f"{args_file}: per_device_train_batch_size x steps_per_generation = "
                              f"{rows} is not a multiple of num_generations={G}")
        settings["prompts"] = rows // G
        assumed["world_size"] = "1 (a multi-process run: pass prompts = rollout batch / G)"

    adapter = _find(folder, "adapter_config.json")
    base_model = None
    if adapter is not None:
        try:
            a = json.loads(adapter.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RunLogError(f"{adapter}: not valid JSON") from None
        settings["lora_rank"] = int(a.get("r") or 8)
        read["lora_rank"] = f"{settings['lora_rank']} ({adapter.name}: r)"
        targets = a.get("target_modules")
        if isinstance(targets, str):
            targets = MODULE_NAMES if targets == "all-linear" else [targets]
        if targets:  # names or module paths ("model.layers.0.self_attn.q_proj")
            names = {str(t).rsplit(".", 1)[-1] for t in targets}
            settings["lora_targets"] = ",".join(t for t in MODULE_NAMES if t in names) \
                or "all-linear"
            read["lora_targets"] = f"{adapter.name}: target_modules"
        base_model = a.get("base_model_name_or_path")
        if base_model:
            read["model"] = f"{base_model!r} ({adapter.name}: base_model_name_or_path)"
    else:
        settings["lora_rank"] = 0
        assumed["lora_rank"] = "0 (no adapter_config.json: full fine-tuning)"
    if base_model:
        settings["model"] = base_model
    elif "model" not in given:
        why = "adapter_config.json has no base_model_name_or_path" if adapter else \
            "no adapter_config.json"
        raise RunLogError(f"from_trl={src!r}: model: the folder names no base model ({why}); "
                          "pass --model")
    settings.update(given)
    if "prompts" in given:
        assumed.pop("world_size", None)

    # one rollout batch every generate_every optimizer steps
    per_gen_steps = mu * spg / max(1, ga)
    logged: list[LoggedStep] = []
    tokens_total, completion_total, batches_total, last_step = 0.0, 0.0, 0.0, 0
    runtime = None
    rollout_rows = settings["prompts"] * settings["group_size"]
    for rec in history:
        if not isinstance(rec, dict):
            continue
        if "train_runtime" in rec:
            runtime = as_number(str(state_file), "train_runtime", rec["train_runtime"])
        if "completions/mean_length" not in rec:
            continue
        step = int(as_number(str(state_file), "step", rec.get("step", last_step + 1)))
        batches = max(1.0, (step - last_step) / per_gen_steps)
        last_step = step
        cmean = as_number(str(state_file), "completions/mean_length", rec["completions/mean_length"])
        cmax = rec.get("completions/max_length")
        cmax = None if cmax is None else as_number(str(state_file), "completions/max_length", cmax)
        logged.append(LoggedStep(0.0, cmean, cmax, batches))
        completion_total += cmean * rollout_rows * batches
        batches_total += batches
        if "num_tokens" in rec:
            tokens_total = as_number(str(state_file), "num_tokens", rec["num_tokens"])
    if not logged:
        raise RunLogError(f"{state_file}: log_history: no record with completions/mean_length")
    read["completion lengths"] = f"{state_file.name}: completions/mean_length, completions/max_length"
    if tokens_total and "prompt_tokens" not in overrides:
        prompt_mean = (tokens_total - completion_total) / (rollout_rows * batches_total)
        read["prompt_tokens"] = (f"{state_file.name}: (num_tokens - completion tokens) / rows = "
                                 f"{prompt_mean:.2f}")
    else:
        prompt_mean = float(overrides.get("prompt_tokens") or 103.0)
        if "prompt_tokens" not in overrides:
            assumed["prompt_tokens"] = f"{prompt_mean:g} (no num_tokens in the log)"
    if prompt_mean < 1:
        raise RunLogError(f"{state_file}: num_tokens={tokens_total:g}: fewer tokens than the "
                          "logged completions; are G and the batch size right?")
    logged = [LoggedStep(prompt_mean, s.completion_mean, s.completion_max, s.weight) for s in logged]
    assumed["per-row lengths"] = ("prompts all at the mean; completions one row at the logged "
                                  "max, the rest equal (the logged mean kept)")
    if settings["engine"] not in ENGINES:
        raise RunLogError(f"from_trl={src!r}: engine={settings['engine']!r}: allowed: {', '.join(ENGINES)}")
    acct = account_steps(f"from_trl={src!r}", settings, logged)
    if runtime is not None:
        read["train_runtime"] = f"{state_file.name}: {runtime:g} s (not split by phase)"
    return ImportedRun(account=acct, steps=round(batches_total), engine=settings["engine"],
                       fields_read=read, fields_assumed=assumed, phase_seconds=None,
                       num_devices=None, source=src, settings=settings)
