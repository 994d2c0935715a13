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

Limits (:mod:`allocopt.limits`): ``trainer_state.json`` at most 64 MiB, ``adapter_config.json``
at most 4 MiB, both nested at most 64 deep; ``training_args.bin`` as
:mod:`allocopt.runlogs.argsfile` says (16 MiB, 100,000 values). Numbers must be numbers (not
strings), finite and in range (``num_generations`` >= 2, batch sizes and steps >= 1,
``beta`` >= 0); else one line naming the file and the field.

Files may sit in the folder itself or in its last ``checkpoint-*`` folder. One rollout batch
is ``generation_batch_size = per_device_train_batch_size × steps_per_generation × world size``
completions over all processes (the process count: ``distributed_state.num_processes`` of
``training_args.bin``, else the ranks of the checkpoints' ``rng_state*.pth``, else refused:
never assumed; ``num_tokens`` and the lengths are gathered over processes), generated every
``steps_per_generation × num_iterations`` micro-steps, i.e. every ``num_iterations ×
steps_per_generation / gradient_accumulation_steps`` optimizer steps. The old-policy log-prob
pass runs as TRL decides it (:func:`old_logprobs_run`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocopt.flops.grpo import ENGINES
from allocopt.flops.shapes import EXPERT_MODULES, MLA_MODULES, MODULES
from allocopt.runlogs.argsfile import read_training_args
from allocopt.runlogs.common import (ImportedRun, LoggedStep, RunLogError, StepLog, as_number,
                                     check_overrides, imported, no_critic)
from allocopt.runlogs.keys import KeyReader, OtherReading, Provenance, check_number
from allocopt.limits import (MAX_CONFIG_BYTES, MAX_STATE_BYTES, RepeatCounter, read_json,
                             safe_pattern)
from allocopt.plan.setup import RUNNERS

MODULE_NAMES = MODULES
"""The seven projections ``all-linear`` names on a dense model (:data:`~allocopt.flops.shapes.MODULES`)."""

_PARAM_SUFFIXES: dict[str, str] = {"gate_up_proj": "experts.gate_up_proj",
                                   "down_proj": "experts.down_proj", "gate.weight": "router"}
"""peft ``target_parameters`` (matched, as peft does, by the parameter path's suffix) ->
allocopt's :data:`~allocopt.flops.shapes.EXPERT_MODULES` names: the fused routed experts
(``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``; peft's conversion writes the bare
``gate_up_proj``, ``down_proj``) and the router (``mlp.gate.weight``)."""

MAX_CHECKPOINTS = 10_000
"""Checkpoint folders looked at in one output folder."""

_ATTENTION_SETS = (frozenset(MODULES[:4]), frozenset(("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                                                     "kv_b_proj", "o_proj")))
"""The attention projections ``all-linear`` adapts: standard, and multi-head latent attention."""


def adapter_targets(adapter: dict[str, Any], r: int, aname: str = "adapter_config.json") -> str:
    """The ``lora_targets`` (:class:`~allocopt.flops.shapes.LoRASpec`) of a saved peft
    ``adapter_config.json`` at rank ``r``: what peft adapts for it equals what
    :meth:`LoRASpec.ranks <allocopt.flops.shapes.LoRASpec.ranks>` counts.

    peft 0.21 under transformers 5 saves the config after converting a mixture-of-experts
    model's MLP names in place (``peft/utils/transformers_weight_conversion.py``): ``all-linear``
    on Qwen3-MoE, Mixtral or DeepSeek-V3 is saved as the attention projections in
    ``target_modules``, ``["gate_up_proj", "down_proj", "gate.weight"]`` in
    ``target_parameters`` and ``rank_pattern={".*\\.gate_up_proj": 2r}`` (gate and up fused);
    the written-out ``gate_proj, up_proj, down_proj`` as the same without ``gate.weight``;
    on Qwen2-MoE ``all-linear`` as module paths (the shared expert's, ``shared_expert_gate``).
    So: ``gate_up_proj`` at ``2r`` (the conversion) reads as ``gate_proj,up_proj``; at ``r``
    as ``experts.gate_up_proj``; ``down_proj`` as ``experts.down_proj``; ``gate.weight`` as
    ``router``; all attention projections with the converted experts and the router, or with
    ``shared_expert_gate``, as ``all-linear``. ``alpha_pattern`` scales, it costs nothing.

    Returns:
        a ``lora_targets`` string (comma separated, or ``all-linear``).

    Raises:
        RunLogError: one line naming the field and value, for what cannot be counted: a target
            module or parameter that is none of allocopt's names, a ``rank_pattern`` other
            than the fused ``gate_up_proj`` at ``2r``, ``layers_to_transform`` /
            ``layers_pattern`` / ``exclude_modules`` (adapters on some layers only),
            ``modules_to_save`` (modules trained whole) or ``use_dora``.
    """
    _refuse_uncounted_settings(adapter, aname)
    targets, params = _target_lists(adapter, aname)
    if isinstance(targets, str) and targets in ("all-linear", "all"):
        if params:
            raise RunLogError(f"{aname}: target_parameters={params!r} with target_modules="
                              f"{targets!r}: peft saves all-linear converted; not counted")
        return "all-linear"
    names = _module_names(targets, aname)
    experts = _expert_names(params, aname)
    fused = _fused_gate_up(adapter, r, experts, aname)
    uniq = set(names)
    if fused:  # peft converted gate_proj + up_proj (written out or all-linear)
        experts = [e for e in experts if e != "experts.gate_up_proj"]
        if any(a <= uniq for a in _ATTENTION_SETS) and uniq <= set(MODULES) | set(MLA_MODULES) \
                and {"experts.down_proj", "router"} <= set(experts):
            return "all-linear"
        names += ["gate_proj", "up_proj"]
        if "down_proj" in params:  # converted from the MLP name, as the user wrote it
            experts.remove("experts.down_proj")
            names.append("down_proj")
    if "shared_expert_gate" in uniq:  # Qwen2-MoE: peft adds it only for all-linear
        if uniq == set(MODULES) | {"shared_expert_gate"} and not experts:
            return "all-linear"
        raise RunLogError(f"{aname}: target_modules: 'shared_expert_gate' with "
                          f"{sorted(uniq - {'shared_expert_gate'})}: not counted; allowed: with "
                          "all seven projections (all-linear)")
    order = MODULES + MLA_MODULES + EXPERT_MODULES
    out = [m for m in order if m in set(names) | set(experts)]  # duplicates (module paths) once
    if not out:
        raise RunLogError(f"{aname}: target_modules={targets!r}, target_parameters={params!r}: "
                          "no adapter named; allowed: " + ", ".join(order) + ", all-linear")
    return ",".join(out)


def _refuse_uncounted_settings(adapter: dict[str, Any], aname: str) -> None:
    """Raise for adapter settings the LoRA count has no term for (some layers, DoRA, ...)."""
    for key in ("layers_to_transform", "layers_pattern", "exclude_modules"):
        if adapter.get(key) not in (None, [], ""):
            raise RunLogError(f"{aname}: {key}={adapter[key]!r}: adapters on some layers or "
                              "modules only are not counted; allowed: null")
    # modules trained whole beside the adapter (e.g. lm_head) and DoRA's magnitude vectors cost
    # FLOPs the LoRA count has no term for: refused rather than left out
    if adapter.get("modules_to_save") not in (None, [], ""):
        raise RunLogError(f"{aname}: modules_to_save={adapter['modules_to_save']!r}: modules trained "
                          "whole beside the adapter are not counted; allowed: null")
    if adapter.get("use_dora") not in (None, False):
        raise RunLogError(f"{aname}: use_dora={adapter['use_dora']!r}: DoRA is not counted; allowed: false")


def _target_lists(adapter: dict[str, Any], aname: str) -> tuple[Any, list[Any]]:
    """``target_modules`` (a string, a list or None) and ``target_parameters`` (a list), checked."""
    targets = adapter.get("target_modules")
    params = adapter.get("target_parameters") or []
    if isinstance(targets, (set, frozenset, tuple)):  # a live peft config's (not from JSON)
        targets = sorted(targets)
    if isinstance(params, (set, frozenset, tuple)):
        params = sorted(params)
    if targets is not None and not isinstance(targets, (str, list)):
        raise RunLogError(f"{aname}: target_modules={targets!r}: must be a string or a list")
    if not isinstance(params, list):
        raise RunLogError(f"{aname}: target_parameters={params!r}: must be a list")
    return targets, params


def _module_names(targets: Any, aname: str) -> list[str]:
    """The module name each ``target_modules`` entry (a name or a module path) ends in."""
    names: list[str] = []
    for t in ([targets] if isinstance(targets, str) else targets or []):
        parts = str(t).split(".")  # a name, or a module path "model.layers.0.mlp.shared_expert.up_proj"
        if parts[-1] not in MODULES + MLA_MODULES + ("shared_expert_gate",):
            raise RunLogError(f"{aname}: target_modules: {str(t)!r}: not counted; allowed: "
                              f"{', '.join(MODULES + MLA_MODULES)}, shared_expert_gate (or module "
                              "paths ending in one), all-linear")
        names.append(parts[-1])
    return names


def _expert_names(params: list[Any], aname: str) -> list[str]:
    """The :data:`~allocopt.flops.shapes.EXPERT_MODULES` name of each ``target_parameters`` entry."""
    experts: list[str] = []
    for p in params:
        name = next((v for k, v in _PARAM_SUFFIXES.items()
                     if str(p) == k or str(p).endswith("." + k)), None)
        if name is None:
            raise RunLogError(f"{aname}: target_parameters: {str(p)!r}: not counted; allowed: "
                              "parameter paths ending in " + ", ".join(_PARAM_SUFFIXES))
        experts.append(name)
    return experts


def _fused_gate_up(adapter: dict[str, Any], r: int, experts: list[str], aname: str) -> bool:
    """Whether ``rank_pattern`` is peft's fused ``gate_up_proj`` at ``2r`` (any other: refused)."""
    pattern = adapter.get("rank_pattern") or {}
    if not isinstance(pattern, dict):
        raise RunLogError(f"{aname}: rank_pattern={pattern!r}: must be an object")
    fused = False
    for key, rank in pattern.items():
        hits_fused = safe_pattern(f"(.*\\.)?({key})", f"{aname}: rank_pattern", RunLogError).fullmatch(
            "model.layers.0.mlp.experts.gate_up_proj")
        if hits_fused and rank == 2 * r and "experts.gate_up_proj" in experts:
            fused = True
            continue
        raise RunLogError(f"{aname}: rank_pattern: {key!r}: {rank!r}: per-module ranks are not "
                          f"counted; allowed: peft's fused gate_up_proj at 2r = {2 * r}")
    return fused


def _checkpoints(folder: Path) -> list[Path]:
    """The ``checkpoint-N`` folders of ``folder``, last first (at most
    :data:`MAX_CHECKPOINTS` looked at)."""
    found = []
    for i, c in enumerate(folder.glob("checkpoint-*")):
        if i >= MAX_CHECKPOINTS:
            break
        tail = c.name.rsplit("-", 1)[-1]
        found.append((int(tail) if tail.isascii() and tail.isdigit() and len(tail) < 10 else -1, c))
    return [c for _, c in sorted(found, key=lambda t: t[0], reverse=True)]


def _find(folder: Path, name: str) -> Path | None:
    """``folder/name``, else the file of that name in the last checkpoint that has one. Any
    entry counts (a FIFO or a folder of that name is then refused by the reading layer)."""
    if os.path.lexists(folder / name):
        return folder / name
    for c in _checkpoints(folder):
        if os.path.lexists(c / name):
            return c / name
    return None


_RNG = re.compile(r"rng_state(?:_(\d{1,6}))?\.pth", re.ASCII)


def processes_in_folder(folder: Path) -> tuple[int, str] | None:
    """The process count the folder's checkpoints hold, and where: transformers' ``Trainer``
    saves ``rng_state.pth`` from one process and ``rng_state_<rank>.pth`` from each of several
    (``Trainer._save_rng_state``), so the ranks of the last checkpoint that has them count the
    processes. ``None`` without such files.

    Raises:
        RunLogError: the ranks are not 0 to N - 1 (one node's files of several, or a mix).
    """
    for c in [folder, *_checkpoints(folder)]:
        try:
            names = [e.name for _, e in zip(range(100_000), os.scandir(c))]
        except OSError:
            continue
        ranks = {m.group(1) for m in map(_RNG.fullmatch, names) if m}
        if not ranks:
            continue
        if ranks == {None}:
            return 1, f"{c.name}/rng_state.pth (one process)"
        ids = {int(r) for r in ranks if r is not None}
        if None in ranks or ids != set(range(len(ids))):
            raise RunLogError(f"{c}: rng_state files of ranks {sorted(ids)[:8]}{' and none' if None in ranks else ''}"
                              ": not one run's processes 0 to N - 1 (a node's files of several?); "
                              "pass --prompts (prompts per rollout batch over all processes)")
        return len(ids), f"{c.name}/rng_state_0..{len(ids) - 1}.pth (one per process)"
    return None


def _world_and_rows(keys: KeyReader, per_device: int, spg: int, folder: Path | None) -> int:
    """Completions per rollout batch over all processes.

    TRL gathers every process's completions before it logs (``accelerator.gather`` of the
    prompt and completion lengths in ``_generate_and_score_completions``): ``num_tokens`` is
    the sum over processes and ``completions/*_length`` are over the gathered batch. The batch
    is ``GRPOConfig.generation_batch_size`` (set in ``__post_init__`` to
    ``per_device_train_batch_size × world_size × steps_per_generation``); the process count is
    accelerate's ``PartialState.num_processes``, pickled with the config as
    ``distributed_state`` (both in TRL >= 0.18's ``training_args.bin``; the two must agree), or
    else the ranks of the checkpoints' RNG states (:func:`processes_in_folder`).

    Raises:
        RunLogError: neither says the process count (pass ``--prompts``), or they disagree.
    """
    args, where, notes = keys.config, keys.where, keys.notes
    name = keys.origin
    state = args.get("distributed_state")
    world = state.get("num_processes") if isinstance(state, dict) else None
    if world is not None:
        world = check_number(where, "distributed_state.num_processes", world, least=1)
    gbs = keys.number("generation_batch_size", None, least=1)
    if world is not None and gbs is not None and gbs != per_device * world * spg:
        raise RunLogError(f"{where}: generation_batch_size={gbs} is not per_device_train_batch_"
                          f"size x num_processes x steps_per_generation = {per_device} x {world} "
                          f"x {spg}; the file is not one run's")
    if world is not None:
        notes.read["world_size"] = f"{world} ({name}: distributed_state.num_processes)"
    if gbs is not None:
        notes.read["rollout batch"] = f"{gbs} ({name}: generation_batch_size, all processes)"
        if world is None:
            notes.read["world_size"] = (f"{max(1, gbs // max(1, per_device * spg))} ({name}: "
                                        "generation_batch_size / per_device_train_batch_size / "
                                        "steps_per_generation)")
        return gbs
    if world is not None:
        return per_device * world * spg
    found = processes_in_folder(folder) if folder is not None else None
    if found is None:
        raise RunLogError(f"{where}: the process count is not in {name} (no distributed_state."
                          "num_processes or generation_batch_size) nor in the folder (no "
                          "checkpoint-*/rng_state*.pth); pass --prompts (prompts per rollout "
                          "batch over all processes)")
    notes.read["world_size"] = f"{found[0]} ({found[1]})"
    return per_device * found[0] * spg


def _check_lengths(state_file: Path, step: int, cmean: float, cmax: float | None,
                   limit: Any) -> None:
    """The logged completion lengths are one batch's: mean <= max <= max_completion_length."""
    where = f"{state_file}: step {step}"
    if cmean < 0:
        raise RunLogError(f"{where}: completions/mean_length={cmean:g}: must be >= 0")
    if cmax is not None and cmax + 1e-6 < cmean:
        raise RunLogError(f"{where}: completions/max_length={cmax:g} is below completions/mean_"
                          f"length={cmean:g}; the log is not TRL's")
    if isinstance(limit, (int, float)) and limit and cmax is not None and cmax > limit:
        raise RunLogError(f"{where}: completions/max_length={cmax:g} is above max_completion_"
                          f"length={limit} of training_args.bin; the folder mixes two runs")


def import_trl(path: str | Path, **overrides: Any) -> ImportedRun:
    """Account the TRL GRPO run whose output folder is ``path``.

    Args:
        path: a TRL ``output_dir`` or one ``checkpoint-*`` folder in it.
        overrides: :data:`~allocopt.plan.recipe.RECIPE_KEYS` that win over the folder (``model``
            is needed when the folder names no base model; ``prompts`` is read from the
            rollout batch over all processes, pass it only for files that do not say).

    Returns:
        :class:`ImportedRun` over the rollout batches the log covers.

    Raises:
        RunLogError: no ``trainer_state.json``, malformed files, a missing field (named).
    """
    folder = Path(path)
    src = str(path)
    if not folder.is_dir():
        raise RunLogError(f"from_trl={src!r}: not a folder (a TRL output_dir is expected)")
    check_overrides(f"from_trl={src!r}", overrides)
    state_file = _find(folder, "trainer_state.json")
    if state_file is None:
        raise RunLogError(f"from_trl={src!r}: no trainer_state.json in the folder or its checkpoints")
    state = read_json(state_file, MAX_STATE_BYTES, "trainer_state", RunLogError)
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise RunLogError(f"{state_file}: log_history: missing or not a list")

    args: dict[str, Any] = {}
    args_file = _find(folder, "training_args.bin")
    if args_file is not None:
        try:
            args = read_training_args(args_file)
        except ValueError as e:
            raise RunLogError(f"{args_file}: {e}") from None
    adapter_file = _find(folder, "adapter_config.json")
    adapter: dict[str, Any] | None = None
    if adapter_file is not None:
        adapter = read_json(adapter_file, MAX_CONFIG_BYTES, "adapter_config", RunLogError)
        if not isinstance(adapter, dict):
            raise RunLogError(f"{adapter_file}: not a JSON object")
    return account_trl_log(history, args, adapter, source=src, state_file=state_file,
                           args_file=args_file, adapter_file=adapter_file, folder=folder,
                           **overrides)


def account_trl_log(history: list[Any], args: dict[str, Any], adapter: dict[str, Any] | None, *,
                    source: str, state_file: Path, args_file: Path | None = None,
                    adapter_file: Path | None = None, folder: Path | None = None,
                    **overrides: Any) -> ImportedRun:
    """The account of a TRL run from what its files hold, already read: ``history`` is
    ``trainer_state.json``'s ``log_history``, ``args`` the ``GRPOConfig`` fields (as
    :func:`~allocopt.runlogs.argsfile.read_training_args` gives them), ``adapter`` peft's
    ``adapter_config.json`` (``None``: full fine-tuning). :func:`import_trl` reads the files;
    :mod:`allocopt.runlogs.live` passes a running trainer's own objects. The paths only name
    the sources in messages; ``folder`` (the output folder) is where the process count is
    looked for when ``args`` does not say it. Raises :class:`RunLogError` as :func:`import_trl`.

    In order: the set-up from ``GRPOConfig`` (:func:`_config_settings`), LoRA and the model from
    the adapter (:func:`_adapter_settings`), the rollout batch over all processes
    (:func:`_world_and_rows`), the overrides on top, the logged rollout batches
    (:func:`_logged_batches`), the mean prompt from ``num_tokens`` (:func:`_prompt_mean`), and
    the account of those batches with TRL's old-policy rule (:func:`old_logprobs_run`).
    """
    src = source
    given = check_overrides(f"from_trl={src!r}", overrides)
    no_critic(f"from_trl={src!r}", given, "TRL's GRPOTrainer")
    notes = Provenance()
    notes.given(given)
    keys = KeyReader(args, str(args_file) if args_file else "training_args.bin",
                     args_file.name if args_file else "training_args.bin", notes)
    settings, reuse = _config_settings(keys, given)
    settings.update(_adapter_settings(adapter, adapter_file, given, src, notes))
    from_folder = False
    if "prompts" not in given:  # else the rollout batch over all processes is given
        rows = _world_and_rows(keys, reuse["per_device"], reuse["spg"], folder)
        from_folder = "rng_state" in notes.read.get("world_size", "")
        if rows % settings["group_size"]:
            raise RunLogError(f"{keys.where}: rollout batch = {rows} completions is not a "
                              f"multiple of num_generations={settings['group_size']}")
        settings["prompts"] = rows // settings["group_size"]
    settings.update(given)
    if adapter is not None and "lora_targets" not in given and settings.get("lora_rank"):
        _check_path_layers(adapter, settings["model"], adapter_file, src)
    rows = settings["prompts"] * settings["group_size"]
    log = _logged_batches(history, state_file, rows, reuse["batches_every"],
                          args.get("max_completion_length"), check_whole=from_folder)
    notes.read["completion lengths"] = f"{state_file.name}: completions/mean_length, completions/max_length"
    prompt_mean = _prompt_mean(log, overrides, args, state_file, rows, notes)
    steps = StepLog({})
    for b in log.steps:
        steps.add(src, {}, LoggedStep(prompt_mean, b.completion_mean, b.completion_max, b.weight))
    if settings["engine"] not in ENGINES:
        raise RunLogError(f"from_trl={src!r}: engine={settings['engine']!r}: allowed: {', '.join(ENGINES)}")
    old = old_logprobs_run(settings, reuse, given, notes)
    pricing = steps.pricing(
        f"from_trl={src!r}", settings, notes,
        lengths=f"{state_file.name}: (num_tokens - completion tokens) / rows; completions/mean_length, "
                "completions/max_length",
        rows="", per_row=("prompts all at the mean; completions one row at the logged max, the "
                          "rest equal (the logged mean kept)"), timers="", old_logprobs=old)
    if log.runtime is not None:
        notes.read["train_runtime"] = f"{state_file.name}: {log.runtime:g} s (not split by phase)"
    return imported(pricing, notes, given, steps=round(log.batches), engine=settings["engine"],
                    phase_seconds=None, num_devices=None, source=src)


def old_logprobs_run(settings: dict[str, Any], reuse: dict[str, Any], given: dict[str, Any],
                     notes: Provenance) -> bool | None:
    """Whether TRL 1.16 runs the old-policy log-prob pass on each rollout batch, as
    ``GRPOTrainer._generate_and_score_completions`` decides it::

        generate_every = steps_per_generation * num_iterations
        if gradient_accumulation_steps % generate_every != 0 or (
                use_vllm and vllm_importance_sampling_correction): ...compute old_per_token_logps

    (the batch feeds more than one optimizer step only when a generation does not fall at the
    end of one; vLLM's sampling mismatch is corrected on every step). ``None`` (the engine's
    own rule) when ``update_passes`` or ``minibatches`` are given: the given set-up is priced
    as given."""
    if "update_passes" in given or "minibatches" in given:
        return None
    generate_every = reuse["spg"] * int(settings["update_passes"])
    misaligned = reuse["ga"] % generate_every != 0
    vllm = settings["engine"] in ("trl-vllm", "trl-vllm-cpu")
    run = misaligned or (vllm and bool(settings.get("importance_sampling_correction")))
    notes.read["old-policy log-prob pass"] = (
        f"{'runs' if run else 'skipped'} (TRL: gradient_accumulation_steps {reuse['ga']} % "
        f"(steps_per_generation {reuse['spg']} x num_iterations {int(settings['update_passes'])}) "
        f"= {reuse['ga'] % generate_every}" + (", vLLM importance-sampling correction" if vllm else "")
        + ")")
    return run


def _check_path_layers(adapter: dict[str, Any], model: str, adapter_file: Path | None, src: str) -> None:
    """``target_modules`` given as module paths (``model.layers.3.self_attn.q_proj``, as peft
    saves ``all-linear`` where names repeat) are counted on every layer
    (:func:`adapter_targets`); so each name must be on every layer of ``model`` (an MLP name of
    a mixture-of-experts model: on every dense layer at least, the routed ones having none).
    Raises :class:`RunLogError` in one line for paths on some layers only."""
    from allocopt.flops import ConfigError
    from allocopt.plan.hub import model_shape

    targets = adapter.get("target_modules")
    layers: dict[str, set[int]] = {}
    for t in targets if isinstance(targets, (list, tuple, set, frozenset)) else []:
        m = re.search(r"(?:^|\.)layers\.(\d{1,9})\.", str(t))
        if m:
            layers.setdefault(str(t).rsplit(".", 1)[-1], set()).add(int(m.group(1)))
    if not layers:
        return
    try:
        shape = model_shape(model)
    except ConfigError as e:
        raise RunLogError(f"from_trl={src!r}: {e}") from None
    every = set(range(shape.num_layers))
    moe = set(shape.moe_layers or ())
    aname = adapter_file.name if adapter_file else "adapter_config.json"
    for name, seen in sorted(layers.items()):
        need = every - moe if moe and name in ("gate_proj", "up_proj", "down_proj") else \
            moe if name == "shared_expert_gate" else every
        if not need <= seen <= every:
            raise RunLogError(f"{aname}: target_modules: {name} on layers {sorted(seen)} of "
                              f"{shape.num_layers}: adapters on some layers only are not counted; "
                              "allowed: the name on every layer")


def _config_settings(keys: KeyReader, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recipe settings ``GRPOConfig`` says (G, mu, beta, checkpointing, minibatches, IS
    correction, engine), TRL's defaults where it is silent; and how batches are reused:
    ``per_device``, ``ga`` (gradient accumulation), ``spg`` (steps per generation) and
    ``batches_every`` (optimizer steps between two rollout batches, ``num_iterations ×
    steps_per_generation / gradient_accumulation_steps``)."""
    G = keys.number("num_generations", 8, "GRPOConfig default", least=1, most=65536)
    if given.get("group_size", G) < 2:  # TRL's GRPO has no critic: no G = 1 run to price
        what = "group_size" if "group_size" in given else "num_generations"
        raise RunLogError(f"{keys.where}: {what}={given.get('group_size', G)}: GRPO's baseline "
                          "needs >= 2 completions per prompt; allowed: >= 2")
    mu = float(keys.number("num_iterations", 1, "GRPOConfig default", least=1))
    beta = keys.number("beta", 0.0, "GRPOConfig default", least=0, whole=False)
    trl = RUNNERS["trl"]  # GRPOConfig's defaults, where training_args.bin does not say
    gc = keys.flag("gradient_checkpointing", trl["gradient_checkpointing"], "GRPOConfig default",
                   other=OtherReading(str(not trl["gradient_checkpointing"]),
                                      {"gradient_checkpointing": not trl["gradient_checkpointing"]}))
    per_device = keys.number("per_device_train_batch_size", 8, "TrainingArguments default", least=1)
    ga = keys.number("gradient_accumulation_steps", 1, "TrainingArguments default", least=1)
    spg = keys.number("steps_per_generation", None, "GRPOConfig: gradient_accumulation_steps", least=1) or ga
    use_vllm = keys.flag("use_vllm", False, "GRPOConfig default")
    isc = keys.flag("vllm_importance_sampling_correction", trl["importance_sampling_correction"],
                    "GRPOConfig default", other=OtherReading(
                        "False", {"importance_sampling_correction": False}) if use_vllm else None)
    use_cpu = keys.flag("use_cpu", False, "TrainingArguments default")
    settings: dict[str, Any] = dict(
        runner="trl", group_size=G, update_passes=mu, beta=beta, gradient_checkpointing=gc,
        minibatches=max(1, spg // max(1, ga)), importance_sampling_correction=isc,
        # rows per forward call of the loss and the old/ref log-prob passes (TRL chunks both
        # by per_device_train_batch_size): LoRA on MoE experts folds once per call
        micro_batch_size=per_device,
        engine=("trl-vllm-cpu" if use_cpu else "trl-vllm") if use_vllm else ("trl-cpu" if use_cpu else "trl-gpu"))
    if keys.config:
        keys.notes.read["engine"] = "use_vllm / use_cpu"
    else:
        keys.notes.assume("engine", f"{settings['engine']!r} (no training_args.bin)")
    return settings, {"per_device": per_device, "ga": ga, "spg": spg,
                      "batches_every": mu * spg / max(1, ga)}


def _adapter_settings(adapter: dict[str, Any] | None, adapter_file: Path | None, given: dict[str, Any],
                      src: str, notes: Provenance) -> dict[str, Any]:
    """``lora_rank``, ``lora_targets`` and ``model`` from peft's ``adapter_config.json`` (no
    adapter: full fine-tuning). Raises :class:`RunLogError` for a bad ``r`` or base model name,
    or when neither the adapter nor ``given`` names the model."""
    settings: dict[str, Any] = {}
    base_model = None
    aname = adapter_file.name if adapter_file else "adapter_config.json"
    if adapter is not None:
        r = adapter.get("r") or 8
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 65536:
            raise RunLogError(f"{aname}: r={r!r}: must be a whole number from 1 to 65536")
        settings["lora_rank"] = r
        notes.read["lora_rank"] = f"{settings['lora_rank']} ({aname}: r)"
        settings["lora_targets"] = adapter_targets(adapter, r, aname)
        notes.read["lora_targets"] = (f"{settings['lora_targets']} ({aname}: target_modules, "
                                "target_parameters, rank_pattern)")
        base_model = adapter.get("base_model_name_or_path")
        if base_model is not None and not isinstance(base_model, str):
            raise RunLogError(f"{aname}: base_model_name_or_path={base_model!r}: must be a string")
        if base_model:
            notes.read["model"] = f"{base_model!r} ({aname}: base_model_name_or_path)"
    else:
        settings["lora_rank"] = 0
        notes.assume("lora_rank", "0 (no adapter_config.json: full fine-tuning)")
    if base_model:
        settings["model"] = base_model
    elif "model" not in given:
        why = "adapter_config.json has no base_model_name_or_path" if adapter else \
            "no adapter_config.json"
        raise RunLogError(f"from_trl={src!r}: model: the folder names no base model ({why}); "
                          "pass --model")
    return settings


@dataclass
class _Log:
    """The rollout batches ``log_history`` covers (prompt lengths not yet known: 0)."""

    steps: list[LoggedStep]
    tokens: float
    """The last ``num_tokens`` logged (prompt + completion tokens so far; 0 when never logged)."""
    completion_tokens: float
    """Completion tokens of all logged batches (mean length × rows × batches)."""
    batches: float
    """Rollout batches the log covers."""
    runtime: float | None
    """``train_runtime`` in seconds, when logged."""


def _logged_batches(history: list[Any], state_file: Path, rows: int, batches_every: float, limit: Any,
                    *, check_whole: bool) -> _Log:
    """The records of ``history`` with ``completions/mean_length``, as rollout batches of
    ``rows`` completions, one every ``batches_every`` optimizer steps. ``check_whole``: the
    process count was inferred from the folder, so each one-batch record's mean × rows must be
    whole tokens.
    Raises :class:`RunLogError` for bad numbers or no such record."""
    log = _Log([], 0.0, 0.0, 0.0, None)
    last_step = 0
    repeats = RepeatCounter()
    for rec in history:
        if not isinstance(rec, dict):
            continue
        if "train_runtime" in rec:
            log.runtime = as_number(str(state_file), "train_runtime", rec["train_runtime"])
        if "completions/mean_length" not in rec:
            continue
        step_v = as_number(str(state_file), "step", rec.get("step", last_step + 1))
        if not 0 <= step_v <= 2**31:
            raise RunLogError(f"{state_file}: step={rec.get('step')!r}: must be from 0 to 2**31")
        step = int(step_v)
        repeats.add(step, str(state_file), f"log_history: step {step}", RunLogError)
        batches = max(1.0, (step - last_step) / batches_every)
        last_step = step
        cmean = as_number(str(state_file), "completions/mean_length", rec["completions/mean_length"])
        cmax = rec.get("completions/max_length")
        cmax = None if cmax is None else as_number(str(state_file), "completions/max_length", cmax)
        _check_lengths(state_file, step, cmean, cmax, limit)
        if check_whole and batches == 1:
            _check_whole_tokens(state_file, step, cmean, rows)
        log.steps.append(LoggedStep(0.0, cmean, cmax, batches))
        log.completion_tokens += cmean * rows * batches
        log.batches += batches
        if "num_tokens" in rec:
            log.tokens = as_number(str(state_file), "num_tokens", rec["num_tokens"])
    if not log.steps:
        raise RunLogError(f"{state_file}: log_history: no record with completions/mean_length")
    return log


def _check_whole_tokens(state_file: Path, step: int, cmean: float, rows: int) -> None:
    """A batch's mean completion length × its rows is a sum of whole lengths; else the batch is
    not ``rows`` completions (the process count was assumed wrong): :class:`RunLogError`."""
    total_len = cmean * rows  # a sum of whole lengths over the gathered rows
    if abs(total_len - round(total_len)) > 1e-3 * max(1.0, total_len) ** 0.5:
        raise RunLogError(
            f"{state_file}: step {step}: completions/mean_length={cmean:g} x {rows} "
            "rows is not a whole number of tokens, so the rollout batch is not "
            f"{rows} completions (TRL averages over all processes); the process count of the "
            "folder's rng_state files is not the run's: pass --prompts = prompts per rollout "
            "batch over all processes")


def _prompt_mean(log: _Log, overrides: dict[str, Any], args: dict[str, Any], state_file: Path,
                 rows: int, notes: Provenance) -> float:
    """Mean prompt tokens: ``(num_tokens - completion tokens) / rows`` over the logged batches,
    else the ``prompt_tokens`` override, else 103 (assumed). Raises :class:`RunLogError` when
    that is below 1 or above ``vllm_max_model_length`` (wrong G, batch or process count)."""
    if log.tokens and "prompt_tokens" not in overrides:
        prompt_mean = (log.tokens - log.completion_tokens) / (rows * log.batches)
        notes.read["prompt_tokens"] = (f"{state_file.name}: (num_tokens - completion tokens) / rows = "
                                 f"{prompt_mean:.2f}")
    else:
        prompt_mean = float(overrides.get("prompt_tokens") or 103.0)
        if "prompt_tokens" not in overrides:
            notes.assume("prompt_tokens", f"{prompt_mean:g} (no num_tokens in the log)")
    if prompt_mean < 1:
        raise RunLogError(f"{state_file}: num_tokens={log.tokens:g}: fewer tokens than the "
                          f"logged completions of {rows} rows per rollout batch; are G, "
                          "the batch size and the process count right?")
    vmax = args.get("vllm_max_model_length")
    if isinstance(vmax, (int, float)) and vmax and prompt_mean > vmax:
        raise RunLogError(f"{state_file}: num_tokens={log.tokens:g} gives a mean prompt of "
                          f"{prompt_mean:.1f} tokens, above vllm_max_model_length={vmax}: the "
                          f"tokens cannot come from {rows} rows per rollout batch; pass "
                          "--prompts (prompts per rollout batch over all processes)")
    return prompt_mean
