"""A GRPO run launched outside allocopt: TRL's GRPOTrainer on the tiny world, from an ask config.

    allocopt ask --study S --format trl --out asked          # reserves trial N, writes asked/trial-N/
    python examples/trl_tiny_grpo.py asked/trial-N --out runs/trial-N
    allocopt tell --study S --trial N --metrics runs/trial-N/metrics.json --from-trl runs/trial-N

This script is what a user's own training job would be: it reads ``grpo_config.json`` (the
GRPOConfig fields ``allocopt ask`` wrote) and ``ask.json`` (the reward system), trains the tiny
world's shipped policy (``objectives/tiny/world/``) with TRL + LoRA on the CPU, with no
allocopt budget meter, saves TRL's own output (``trainer_state.json``, ``training_args.bin``,
the adapter), scores the result on the tiny world's held-out problems and writes
``metrics.json`` with the targets. ``allocopt tell --from-trl`` then accounts the compute from
TRL's logs. Data, reward systems and scoring come from the tiny world (``objectives``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("asked", type=Path, help="asked/trial-N folder written by `allocopt ask --format trl`")
    ap.add_argument("--out", type=Path, default=None, help="TRL output_dir (trainer_state.json, adapter, metrics.json); default: the asked folder")
    ap.add_argument("--eval-problems", type=int, default=200, help="held-out problems per split")
    ap.add_argument("--lora-rank", type=int, default=8)
    a = ap.parse_args()
    a.out = a.out or a.asked
    info = json.loads((a.asked / "ask.json").read_text())
    fields = json.loads((a.asked / "grpo_config.json").read_text())

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
    reward = world.reward(info["reward"])
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
    trainer.train()
    trainer.save_model()   # adapter_config.json (base model), training_args.bin
    trainer.save_state()   # trainer_state.json: per-step lengths and batch sizes
    targets, eval_flops = world.evaluate(trainer.model, tok, reward)
    (a.out / "metrics.json").write_text(json.dumps({"targets": targets, "eval_flops": eval_flops}, indent=2))
    print(json.dumps({"trial": info["trial"], "targets": targets}))


if __name__ == "__main__":
    main()
