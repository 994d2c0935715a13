"""Write the OpenRLHF and NeMo-RL fixtures of ``tests/data/runlogs/`` (see its README).

Run from the repository root: ``PYTHONPATH=$PWD python tests/data/runlogs/make_engine_fixtures.py``
(needs torch and tensorboard). The files are written by the writers those tools use, called as
they call them: ``torch.utils.tensorboard.SummaryWriter.add_scalar`` / ``add_text`` /
``add_hparams``, and the console lines of ``print(args)`` and ``logger.info``. The values are
R1-shaped numbers chosen for the tests (no public log of these recipes was found); NeMo-RL's
per-row lengths are written out and its ``performance/train_flops_per_gpu`` is what NeMo-RL's
own formula gives for them (:func:`nemo_rl_qwen2_flops`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).parent

OPENRLHF_ARGS = {  # openrlhf/cli/train_ppo_ray.py flags (a subset; the rest at their defaults)
    "actor.model_name_or_path": "Qwen/Qwen2.5-3B-Instruct", "actor.num_nodes": 1,
    "actor.num_gpus_per_node": 8, "actor.gradient_checkpointing_enable": True,
    "rollout.batch_size": 32, "rollout.n_samples_per_prompt": 8, "rollout.max_new_tokens": 1024,
    "train.max_epochs": 1, "train.batch_size": 128, "train.micro_batch_size": 4,
    "algo.advantage.estimator": "group_norm", "algo.kl.use_loss": True,
    "algo.kl.init_coef": 0.001, "algo.kl.estimator": "k3", "ds.lora.rank": 0,
    "ds.lora.target_modules": "all-linear", "ds.packing_samples": True,
    "reward.remote_url": "http://localhost:5000/get_reward", "reward.model_name_or_path": None,
    "logger.tensorboard_dir": "logs/tb", "logger.logging_steps": 1,
}
OPENRLHF_STEPS = [  # per global step: status of PPOTrainer.train_step + fit
    {"policy_loss": 0.012, "actor_lr": 5e-7, "actor_grad_norm": 0.21, "kl": 0.0004,
     "response_length": 512.25, "total_length": 611.75, "reward": 0.31,
     "rollout/reward_mean": 0.31, "rollout/reward_std": 0.46, "rollout/response_length_mean": 512.25,
     "rollout/truncated_rate": 0.04, "rollout/num_samples": 256.0,
     "timing/make_experience": 21.4, "timing/ppo_train": 48.9, "timing/broadcast": 3.1,
     "timing/generation": 96.2},
    {"policy_loss": 0.009, "actor_lr": 1e-6, "actor_grad_norm": 0.19, "kl": 0.0011,
     "response_length": 547.5, "total_length": 649.0, "reward": 0.36,
     "rollout/reward_mean": 0.36, "rollout/reward_std": 0.48, "rollout/response_length_mean": 547.5,
     "rollout/truncated_rate": 0.05, "rollout/num_samples": 256.0,
     "timing/make_experience": 22.0, "timing/ppo_train": 50.3, "timing/broadcast": 3.0,
     "timing/generation": 101.7},
    {"policy_loss": -0.004, "actor_lr": 1e-6, "actor_grad_norm": 0.23, "kl": 0.0019,
     "response_length": 590.0, "total_length": 690.5, "reward": 0.41,
     "rollout/reward_mean": 0.41, "rollout/reward_std": 0.49, "rollout/response_length_mean": 590.0,
     "rollout/truncated_rate": 0.07, "rollout/num_samples": 256.0,
     "timing/make_experience": 23.1, "timing/ppo_train": 52.8, "timing/broadcast": 3.2,
     "timing/generation": 110.4},
]

NEMO_CONFIG = {  # examples/configs/grpo_math_1B.yaml, the fields the importer reads (+ a few)
    "grpo": {"num_prompts_per_step": 32, "num_generations_per_prompt": 16, "max_num_epochs": 1,
             "use_leave_one_out_baseline": True},
    "loss_fn": {"reference_policy_kl_penalty": 0.01},
    "policy": {"model_name": "Qwen/Qwen2.5-1.5B", "train_global_batch_size": 512,
               "train_micro_batch_size": 4, "max_total_sequence_length": 512,
               "dtensor_cfg": {"enabled": True, "activation_checkpointing": False,
                               "lora_cfg": {"enabled": False, "dim": 8}}},
    "cluster": {"gpus_per_node": 8, "num_nodes": 1},
    "logger": {"log_dir": "logs", "tensorboard_enabled": True},
}
QWEN25_15B = dict(hs=1536, layers=28, ffn_hs=8960, vocab_size=151936)
"""Qwen/Qwen2.5-1.5B's config.json fields NeMo-RL's FLOP formula reads
(``nemo_rl/utils/flops_tracker.py`` lines 47-53: ``Qwen2Config`` -> ``qwen2``)."""


def nemo_rl_qwen2_flops(seq_len: int, hs: int, layers: int, ffn_hs: int, vocab_size: int) -> float:
    """NeMo-RL's training FLOPs of one sequence of ``seq_len`` tokens, as written in
    NVIDIA-NeMo/RL at 7ea279a, ``nemo_rl/utils/flops_formulas.py`` lines 127-167 (``qwen2``,
    ``gbs=1``: ``FLOPTracker.track_batch`` calls it once per row with that row's
    ``input_lengths``, ``nemo_rl/utils/flops_tracker.py`` lines 161-183). Its own
    assumptions, kept: 3 x the forward (forward + backward), q, k, v each ``d x d`` (no GQA),
    causal attention at half the square, the LM head at every position."""
    causal_self_attn = True
    gated_linear_multiplier = 2
    attention_flops = 3 * 2 * 1 * layers * seq_len * hs * hs * (
        (2 + 1) + (seq_len / hs * 2 * (0.5 if causal_self_attn else 1)) + 1)
    mlp_flops = 3 * 2 * 1 * layers * seq_len * hs * (1 + gated_linear_multiplier) * ffn_hs
    vocab_flops = 3 * 2 * 1 * seq_len * hs * vocab_size
    return attention_flops + mlp_flops + vocab_flops


def _nemo_rows(step: int) -> list[tuple[int, int]]:
    """(prompt, response) tokens of each of the 32 x 16 rows of a step (deterministic)."""
    prompts = [96 + (7 * i + 5 * step) % 45 for i in range(32)]
    return [(prompts[r // 16], 180 + (53 * r + 31 * step) % 215) for r in range(512)]


_NEMO_TIMING = [  # timing/train/* of grpo_train (seconds), and the rest of its train/* scalars
    {"train/loss": 0.021, "train/reward": 0.42, "timing/train/generation": 14.2,
     "timing/train/reward_calculation": 0.6, "timing/train/policy_and_reference_logprobs": 3.9,
     "timing/train/policy_training": 9.8, "timing/train/total_step_time": 29.1},
    {"train/loss": 0.017, "train/reward": 0.47, "timing/train/generation": 13.6,
     "timing/train/reward_calculation": 0.6, "timing/train/policy_and_reference_logprobs": 3.8,
     "timing/train/policy_training": 9.5, "timing/train/total_step_time": 28.0},
]


def _nemo_step(step: int, timing: dict) -> dict:
    """One step's scalars from its rows: the length metrics, and
    ``performance/train_flops_per_gpu`` as NeMo-RL computes it
    (``nemo_rl/algorithms/utils.py`` lines 861-874: ``total_flops / policy_training seconds /
    1e12 / num_ranks``, ``total_flops`` the ``FLOPTracker``'s sum over the step's rows,
    ``nemo_rl/models/policy/lm_policy.py`` lines 786-790 and 834-836)."""
    rows = _nemo_rows(step)
    gpus = NEMO_CONFIG["cluster"]["gpus_per_node"] * NEMO_CONFIG["cluster"]["num_nodes"]
    total_flops = sum(nemo_rl_qwen2_flops(p + c, **QWEN25_15B) for p, c in rows)
    return {**timing,
            "train/mean_prompt_length": sum(p for p, _ in rows) / len(rows),
            "train/mean_gen_tokens_per_sample": sum(c for _, c in rows) / len(rows),
            "train/max_gen_tokens_per_sample": float(max(c for _, c in rows)),
            "train/total_num_tokens": float(sum(p + c for p, c in rows)),
            "train/global_valid_seqs": float(len(rows)),
            "performance/train_flops_per_gpu":
                total_flops / timing["timing/train/policy_training"] / 1e12 / gpus}


NEMO_STEPS = [_nemo_step(i, t) for i, t in enumerate(_NEMO_TIMING, start=1)]


def _hierarchize(flat: dict) -> SimpleNamespace:  # openrlhf/utils/config.py hierarchize
    root: dict = {}
    for k, v in flat.items():
        node = root
        *parents, last = k.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v

    def build(x):
        return SimpleNamespace(**{k: build(v) for k, v in x.items()}) if isinstance(x, dict) else x

    return build(root)


def _flatten(d: dict, prefix: str = "") -> dict:  # nemo_rl/utils/logger.py flatten_dict
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def main() -> None:
    from torch.utils.tensorboard import SummaryWriter

    # OpenRLHF: console (strategy.print(args); logger.info per step) and TensorBoard
    lines = ["[2026-02-11 09:12:03,114] [INFO] [real_accelerator.py:260:get_accelerator] "
             "Setting ds_accelerator to cuda (auto detect)",
             repr(_hierarchize(OPENRLHF_ARGS))]
    for i, st in enumerate(OPENRLHF_STEPS, start=1):
        lines.append(f"INFO 02-11 09:{14 + 3 * i:02d}:07 ppo_trainer.py:550] ✨ Global step {i}: {st}")
    (HERE / "openrlhf_grpo_qwen25_3b.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tb = HERE / "openrlhf_tb"
    shutil.rmtree(tb, ignore_errors=True)
    w = SummaryWriter(log_dir=str(tb / "qwen25_3b_grpo"))  # tensorboard_dir / wandb.run_name
    for i, st in enumerate(OPENRLHF_STEPS, start=1):
        w.add_text("train/generated_samples", "Sample:\\n2+2=4\\n\\nReward: 1.0000", i)
        for k, v in st.items():
            w.add_scalar(f"train/{k}", v, i)
    w.close()
    # NeMo-RL: <log_dir>/tensorboard, hparams then per-step metrics
    nemo = HERE / "nemo_rl_tb"
    shutil.rmtree(nemo, ignore_errors=True)
    w = SummaryWriter(log_dir=str(nemo / "tensorboard"))
    w.add_hparams(_flatten(NEMO_CONFIG), {})
    for i, st in enumerate(NEMO_STEPS, start=1):
        for k, v in st.items():
            w.add_scalar(k, v, i)
    w.close()
    (HERE / "engine_fixture_values.json").write_text(json.dumps(
        {"openrlhf": {"args": OPENRLHF_ARGS, "steps": OPENRLHF_STEPS},
         "nemo_rl": {"config": NEMO_CONFIG, "steps": NEMO_STEPS,
                     "rows": [_nemo_rows(i) for i in range(1, len(NEMO_STEPS) + 1)]}},
        indent=None) + "\n")
    print("wrote", HERE)


if __name__ == "__main__":
    main()
