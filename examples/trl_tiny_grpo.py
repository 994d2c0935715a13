"""A GRPO run launched outside allocopt: TRL's GRPOTrainer on the tiny world, from an ask config.

    allocopt ask --study S --format trl --out asked          # reserves trial N, writes asked/trial-N/
    python examples/trl_tiny_grpo.py asked/trial-N --out runs/trial-N
    allocopt tell --study S --trial N --metrics runs/trial-N/metrics.json --from-trl runs/trial-N

This script is what a user's own training job would be: it reads ``grpo_config.json`` (the
GRPOConfig fields ``allocopt ask`` wrote) and ``ask.json`` (the reward system the trial runs and
the study's targets), trains the tiny world's shipped policy (``objectives/tiny/world/``) with
TRL + LoRA on the CPU, with no allocopt budget meter, saves TRL's own output
(``trainer_state.json``, ``training_args.bin``, the adapter), scores the result on the tiny
world's held-out problems and writes ``metrics.json`` with the targets. ``allocopt tell
--from-trl`` then accounts the compute from TRL's logs. Data, reward systems and scoring come
from the tiny world (``objectives``).

The tiny world trains with its own reward systems (sparse, structured, dense, proxy_prm, prm)
and measures native_reward, pass@1 and judge. A study that declares its own names (a study
file's ``[rewards]`` and ``[targets]`` tables) is served by mapping them onto these::

    python examples/trl_tiny_grpo.py asked/trial-N --reward rule=sparse --target acc=pass@1

trains with ``sparse`` where the study asks for ``rule`` and reports the measured ``pass@1`` as
``acc``. ``metrics.json`` holds exactly the study's targets, under the names it declared; a
study target the job neither measures nor maps is refused in one line before any training.

Besides the tiny world's targets the job measures what its training cost, a target a study
would minimize: ``train_seconds``, the wall seconds of ``trainer.train()``, and, priced with
``--usd-per-gpu-hour X`` (X > 0), ``usd`` = train_seconds / 3600 × X × the devices it trained
on (1 on the CPU)::

    python examples/trl_tiny_grpo.py asked/trial-N --target cost_usd=usd --usd-per-gpu-hour 2.5

``metrics.json`` also keeps everything measured, by key (``measured``), the devices and the
price. A job given no study targets (an ``ask.json`` that names none) reports the tiny world's
three targets by key, not the costs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REWARDS = ("sparse", "structured", "dense", "proxy_prm", "prm")
"""The reward systems the tiny world trains with."""
QUALITY = ("native_reward", "pass@1", "judge")
"""The targets the tiny world measures by scoring the trained policy."""
MEASURED = (*QUALITY, "train_seconds", "usd")
"""Every value the job measures: the tiny world's targets, the training's wall seconds and, with
``--usd-per-gpu-hour``, its price in USD."""


def pairs(values: list[str], flag: str) -> dict[str, str]:
    """``NAME=VALUE`` flags as a dict; exits in one line for a malformed one."""
    out = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name.strip() or not value.strip():
            sys.exit(f"error: {flag} {v!r}: give NAME=VALUE (e.g. {flag} "
                     f"{'rule=sparse' if flag == '--reward' else 'acc=pass@1'})")
        out[name.strip()] = value.strip()
    return out


def reward_to_train(asked: str, mapping: dict[str, str]) -> str:
    """The tiny world's reward system that stands for the study's ``asked`` one."""
    unknown = sorted(set(mapping.values()) - set(REWARDS))
    if unknown:
        sys.exit(f"error: --reward ...={unknown[0]}: the tiny world trains with {', '.join(REWARDS)}")
    name = mapping.get(asked, asked)
    if name not in REWARDS:
        sys.exit(f"error: reward={asked!r}: the tiny world trains with {', '.join(REWARDS)}; "
                 f"map it with --reward {asked}=sparse (or another)")
    return name


def reported_targets(measured: dict[str, float], declared: dict[str, Any],
                     mapping: dict[str, str]) -> dict[str, float]:
    """The study's targets, each under its declared name, from what the job ``measured`` (by
    key: ``pass_at_1``). Without declared targets (an ``ask.json`` that names none), every
    measured target by its key."""
    from allocopt.vocabulary import metric_key

    stray = sorted(set(mapping) - set(declared))
    if declared and stray:
        sys.exit(f"error: --target {stray[0]}=...: the study's targets are {', '.join(declared)}")
    if not declared:
        return {metric_key(k): measured[metric_key(k)] for k in QUALITY}
    out = {}
    for name in declared:
        source = mapping.get(name, name)
        if metric_key(source) == "usd" and "usd" not in measured:
            sys.exit(f"error: target {name!r} maps to usd: give --usd-per-gpu-hour X, the price of one "
                     "device-hour in USD")
        if metric_key(source) not in measured:
            sys.exit(f"error: target {name!r}: the tiny job measures {', '.join(MEASURED)}; map it "
                     f"with --target {name}=pass@1 (or another)")
        out[name] = measured[metric_key(source)]
    return out


def price(value: str | None) -> float | None:
    """``--usd-per-gpu-hour`` as a number > 0 (``None`` when not given); anything else exits 2
    in one line."""
    if value is None:
        return None
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x <= 0:
        print(f"error: --usd-per-gpu-hour {value!r}: give the price of one device-hour in USD, a "
              "number > 0 (e.g. 2.5)", file=sys.stderr)
        sys.exit(2)
    return x


def costs(seconds: float, devices: int, usd_per_hour: float | None) -> dict[str, float]:
    """What training cost, by key: ``train_seconds`` and, priced, ``usd`` (device-hours × price)."""
    out = {"train_seconds": seconds}
    if usd_per_hour is not None:
        out["usd"] = seconds / 3600 * usd_per_hour * devices
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("asked", type=Path, help="asked/trial-N folder written by `allocopt ask --format trl`")
    ap.add_argument("--out", type=Path, default=None, help="TRL output_dir (trainer_state.json, adapter, metrics.json); default: the asked folder")
    ap.add_argument("--eval-problems", type=int, default=200, help="held-out problems per split")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--reward", action="append", default=[], metavar="NAME=BUILTIN",
                    help=f"train with the tiny world's BUILTIN reward system ({', '.join(REWARDS)}) "
                         "where the study asks for NAME; repeatable")
    ap.add_argument("--target", action="append", default=[], metavar="NAME=MEASURED",
                    help=f"report the measured value MEASURED ({', '.join(MEASURED)}) as the study's "
                         "target NAME; repeatable")
    ap.add_argument("--usd-per-gpu-hour", default=None, metavar="X",
                    help="price of one device-hour in USD (> 0): the job then measures usd = "
                         "train_seconds / 3600 * X * devices")
    a = ap.parse_args()
    a.out = a.out or a.asked
    usd_per_hour = price(a.usd_per_gpu_hour)
    info = json.loads((a.asked / "ask.json").read_text())
    fields = json.loads((a.asked / "grpo_config.json").read_text())
    reward_name = reward_to_train(info["reward"], pairs(a.reward, "--reward"))
    target_map, declared = pairs(a.target, "--target"), info.get("targets") or {}
    measurable = dict.fromkeys(("native_reward", "pass_at_1", "judge"), 0.0) | costs(0.0, 1, usd_per_hour)
    reported_targets(measurable, declared, target_map)  # a target it cannot report: refused before training
    trainer, world, tok, reward, seconds = train(a, info, fields, reward_name)
    measured, eval_flops = world.evaluate(trainer.model, tok, reward)
    devices = max(1, trainer.args.world_size)
    measured = {**measured, **costs(seconds, devices, usd_per_hour)}
    targets = reported_targets(measured, declared, target_map)
    priced = {"usd_per_gpu_hour": usd_per_hour} if usd_per_hour is not None else {}
    (a.out / "metrics.json").write_text(json.dumps({"targets": targets, "eval_flops": eval_flops,
                                                    "measured": measured, "devices": devices, **priced},
                                                   indent=2))
    print(json.dumps({"trial": info["trial"], "targets": targets, "measured": measured}))


def train(a: argparse.Namespace, info: dict[str, Any], fields: dict[str, Any], reward_name: str) -> tuple:
    """TRL GRPO + LoRA of the tiny world's policy with the asked config; TRL's output saved.
    Returns the trainer, the tiny world, its tokenizer, the reward and the wall seconds of
    ``trainer.train()``."""
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from objectives.tiny.objective import TinyObjective, TinySettings
    from objectives.tiny.tasks import make_split

    world = TinyObjective(TinySettings.from_flat(eval_problems=a.eval_problems, lora_rank=a.lora_rank))
    tok = world._tokenizer()
    model = AutoModelForCausalLM.from_pretrained(str(world.world().policy))
    torch.manual_seed(fields.get("seed", 0))
    rows = [{"prompt": x.prompt, "answer": x.answer}
            for x in make_split("train", 5000, fields.get("seed", 0))]
    reward = world.reward(reward_name)
    reward.__name__ = info["reward"]
    # what `allocopt ask` wrote wins (gradient_checkpointing as the plan priced it); off when absent
    args = GRPOConfig(output_dir=str(a.out), use_cpu=True, bf16=False, report_to=[],
                      disable_tqdm=True, **{"gradient_checkpointing": False, **fields})
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tok,
                          peft_config=LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank,
                                                 target_modules="all-linear", lora_dropout=0.0,
                                                 task_type="CAUSAL_LM"))
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model()   # adapter_config.json (base model), training_args.bin
    trainer.save_state()   # trainer_state.json: per-step lengths and batch sizes
    return trainer, world, tok, reward, seconds


if __name__ == "__main__":
    main()
