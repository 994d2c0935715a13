"""Write ``tests/data/runlogs/trl_tiny/``: the output folder of a real (tiny) TRL GRPO run.

Run from the repository root: ``PYTHONPATH=$PWD:tests python tests/data/runlogs/make_trl_fixture.py``
(about a minute on 2 CPU cores). It trains the tiny Qwen2 of ``tests/flop_utils.py`` with
TRL's ``GRPOTrainer`` on CPU (LoRA r=4, G=3, β=0.04, gradient checkpointing, 4 steps) under
``FlopCounterMode`` and keeps what TRL wrote (``trainer_state.json``, ``training_args.bin``,
``adapter_config.json`` of the last checkpoint), the base model's ``config.json`` under
``base/``, and ``measured.json``: the FLOPs ``FlopCounterMode`` counted over the whole run and
the per-step lengths the reward function saw.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from flop_utils import FlopMeter, char_tokenizer, tiny_causal_lm

torch.set_num_threads(1)
OUT = Path(__file__).parent / "trl_tiny"
PROMPTS = ["1+1=", "12+30=?", "7=", "99-9="]


def run_tiny_grpo(prompts: list[str], **config) -> dict:
    """Train the tiny Qwen2 with TRL's ``GRPOTrainer`` on CPU (LoRA r=4 all-linear, G=3,
    β=0.04, gradient checkpointing, 4 optimizer steps; ``config`` changes ``GRPOConfig``) under
    ``FlopCounterMode``. Returns the last checkpoint's folder, the model, the FLOPs counted, the
    completion lengths of each rollout batch and the no-grad log-prob passes TRL ran."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    tmp = Path(tempfile.mkdtemp())
    tok = char_tokenizer(tmp / "tok")
    model = tiny_causal_lm("sdpa", vocab_size=len(tok))
    seen: list[dict] = []

    def reward(prompts, completions, completion_ids, **kwargs):
        seen.append({"completion_tokens": [len(c) for c in completion_ids]})
        return [float(len(c)) for c in completion_ids]

    args = GRPOConfig(**{
        "output_dir": str(tmp / "out"), "use_cpu": True, "bf16": False, "report_to": [], "max_steps": 4,
        "num_iterations": 1, "beta": 0.04, "per_device_train_batch_size": 6, "num_generations": 3,
        "max_completion_length": 8, "gradient_checkpointing": True, "learning_rate": 1e-3,
        "logging_steps": 1, "save_strategy": "steps", "save_steps": 4, "seed": 0, "disable_tqdm": True,
        "dataloader_num_workers": 0, **config})
    peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                             task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tok,
                              train_dataset=Dataset.from_dict({"prompt": prompts}),
                              peft_config=peft_config)
        no_grad = [0]
        inner = trainer._get_per_token_logps_and_entropies

        def counted(model, *a, **kw):  # the old-policy and reference passes run without grad
            no_grad[0] += not torch.is_grad_enabled()
            return inner(model, *a, **kw)

        trainer._get_per_token_logps_and_entropies = counted
        meter = FlopMeter()
        with meter:
            trainer.train()
    return {"checkpoint": tmp / "out" / "checkpoint-4", "model": model, "flops": meter.total,
            "batches": seen, "no_grad_logprob_calls": no_grad[0]}


def main() -> None:
    run = run_tiny_grpo(PROMPTS * 4)
    ckpt = run["checkpoint"]
    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "base").mkdir(parents=True)
    for name in ("trainer_state.json", "training_args.bin", "adapter_config.json"):
        shutil.copy(ckpt / name, OUT / name)
    run["model"].config.to_json_file(OUT / "base" / "config.json")
    (OUT / "measured.json").write_text(json.dumps(
        {"flop_counter_mode_total_flops": run["flops"], "steps": run["batches"]}, indent=1) + "\n")
    print("wrote", OUT, "measured", run["flops"])


if __name__ == "__main__":
    main()
