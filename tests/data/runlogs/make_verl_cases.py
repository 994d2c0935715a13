"""Write the verl logs of a PPO run with a critic, a GAE run with several samples per prompt
and a DAPO run that over-generates, and ``verl_cases.json`` with the values they hold.

Run from the repository root: ``python tests/data/runlogs/make_verl_cases.py`` (standard
library only; deterministic). No public log of these recipes was found, so the files are
written in verl's own console format, as ``verl_r1_qwen25_3b_lora.log`` is (see README.md):
``pprint`` of the resolved config behind Ray's ``(TaskRunner pid=…)`` prefix
(``verl/trainer/main_ppo.py``), or the ``key=value`` override lines of the launch script the
run echoed, then ``step:N - key:value - …`` lines (``verl/utils/tracking.py``, console
backend).

* ``verl_ppo_critic.log``: ``examples/ppo_trainer`` style PPO (``algorithm.adv_estimator=gae``,
  ``rollout.n=1``), full fine-tuning of Qwen2.5-1.5B-Instruct; override lines only, and they
  do not name the critic (``critic.model.path``): the critic is given with ``--critic``.
* ``verl_gae_n4.log``: GAE with ``rollout.n=4``, LoRA r=32 on Qwen2.5-3B-Instruct, a
  Qwen2.5-0.5B-Instruct critic (``critic.model.path``) with ``critic.ppo_epochs=2`` beside the
  actor's one, and the critic's timers (``timing_s/values``, ``timing_s/update_critic``:
  ``verl/trainer/ppo/ray_trainer.py``).
* ``verl_dapo.log``: ``recipe/dapo`` (``data.gen_batch_size=96`` of ``train_batch_size=32``,
  ``algorithm.filter_groups.enable=True``): each step logs ``train/num_gen_batches``, the
  generation batches it drew until 32 groups were kept (``recipe/dapo/dapo_ray_trainer.py``:
  ``metrics["train/num_gen_batches"] = num_gen_batches``), 1 to 3 here, and the length
  metrics of the 32 × 8 rows it trained (``compute_data_metrics`` of the aligned batch).

Per step: ``response_length/mean``, ``response_length/max``, ``prompt_length/mean``,
``perf/total_num_tokens`` (= round((prompt mean + response mean) × trained rows)) and the
timers; the values come from a seeded generator and are kept in ``verl_cases.json``, which the
tests read to price each step independently of the importer's parser.
"""

from __future__ import annotations

import json
import pprint
import random
from pathlib import Path

HERE = Path(__file__).parent
PREFIX = "(TaskRunner pid=40417) "


def _steps(seed: int, n: int, prompt: float, response: float, limit: int,
           gen_batches: list[int] | None = None) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        mean = round(response * rng.uniform(0.8, 1.25), 3)
        step = {"step": i + 1, "prompt_length/mean": round(prompt * rng.uniform(0.97, 1.03), 3),
                "response_length/mean": mean,
                "response_length/max": float(min(limit, round(mean * rng.uniform(2.0, 3.5))))}
        if gen_batches is not None:
            step["train/num_gen_batches"] = gen_batches[i]
        out.append(step)
    return out


def _line(step: dict, rows: int, critic: bool) -> str:
    tokens = round((step["prompt_length/mean"] + step["response_length/mean"]) * rows)
    parts = [f"response_length/mean:{step['response_length/mean']:.3f}",
             f"response_length/max:{step['response_length/max']:.3f}",
             "response_length/clip_ratio:0.000",
             f"prompt_length/mean:{step['prompt_length/mean']:.3f}"]
    if "train/num_gen_batches" in step:
        parts.append(f"train/num_gen_batches:{step['train/num_gen_batches']}")
    parts += [f"perf/total_num_tokens:{tokens}", "timing_s/gen:61.204", "timing_s/reward:1.733",
              "timing_s/old_log_prob:4.118", "timing_s/ref:3.902"]
    if critic:
        parts += ["timing_s/values:3.377", "timing_s/update_critic:12.845"]
    parts += ["timing_s/update_actor:15.606", "timing_s/step:103.117"]
    return PREFIX + f"step:{step['step']} - " + " - ".join(parts)


def _dump(config: dict) -> list[str]:
    return [PREFIX + ln for ln in pprint.pformat(config, width=100).splitlines()]


def ppo_critic() -> dict:
    settings = {"model": "Qwen/Qwen2.5-1.5B-Instruct", "prompts": 256, "group_size": 1,
                "update_passes": 1.0, "minibatches": 4, "beta": 0.0, "lora_rank": 0,
                "gradient_checkpointing": True, "critic": "Qwen/Qwen2.5-1.5B-Instruct"}
    overrides = ["algorithm.adv_estimator=gae", "data.train_batch_size=256",
                 "data.max_prompt_length=512", "data.max_response_length=1024",
                 "actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                 "actor_rollout_ref.actor.use_kl_loss=False",
                 "actor_rollout_ref.model.enable_gradient_checkpointing=True",
                 "actor_rollout_ref.model.use_remove_padding=True",
                 "actor_rollout_ref.rollout.n=1", "algorithm.use_kl_in_reward=False",
                 "critic.optim.lr=1e-5", "critic.ppo_micro_batch_size_per_gpu=8",
                 "trainer.n_gpus_per_node=8", "trainer.nnodes=1"]
    steps = _steps(11, 5, 118.0, 402.0, 1024)
    lines = ["+ python3 -m verl.trainer.main_ppo \\"] + [f"    {o} \\" for o in overrides]
    lines[-1] = lines[-1][:-2]
    lines += [_line(s, 256, True) for s in steps]
    return {"log": "verl_ppo_critic.log", "lines": lines, "settings": settings, "steps": steps,
            "critic_given": True}


def gae_n4() -> dict:
    config = {
        "actor_rollout_ref": {
            "actor": {"ppo_epochs": 1, "ppo_mini_batch_size": 32, "ppo_micro_batch_size_per_gpu": 8,
                      "use_kl_loss": True, "kl_loss_coef": 0.001, "use_dynamic_bsz": False,
                      "strategy": "fsdp"},
            "model": {"path": "Qwen/Qwen2.5-3B-Instruct", "lora_rank": 32, "lora_alpha": 32,
                      "target_modules": "all-linear", "enable_gradient_checkpointing": True,
                      "use_remove_padding": True},
            "rollout": {"n": 4, "name": "vllm", "log_prob_micro_batch_size_per_gpu": 16,
                        "temperature": 1.0}},
        "algorithm": {"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0, "use_kl_in_reward": False,
                      "kl_ctrl": {"kl_coef": 0.001, "type": "fixed"}},
        "critic": {"enable": None, "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct",
                                             "enable_gradient_checkpointing": True,
                                             "use_remove_padding": True},
                   "ppo_epochs": 2, "ppo_mini_batch_size": 32, "ppo_micro_batch_size_per_gpu": 8,
                   "optim": {"lr": 1e-05}, "strategy": "fsdp"},
        "data": {"train_batch_size": 128, "max_prompt_length": 512, "max_response_length": 2048},
        "trainer": {"critic_warmup": 0, "n_gpus_per_node": 8, "nnodes": 1, "total_epochs": 1}}
    settings = {"model": "Qwen/Qwen2.5-3B-Instruct", "prompts": 128, "group_size": 4,
                "update_passes": 1.0, "minibatches": 4, "beta": 0.001, "lora_rank": 32,
                "lora_targets": "all-linear", "gradient_checkpointing": True,
                "critic": "Qwen/Qwen2.5-0.5B-Instruct", "critic_update_passes": 2.0}
    steps = _steps(23, 5, 131.0, 655.0, 2048)
    lines = _dump(config) + [_line(s, 512, True) for s in steps]
    return {"log": "verl_gae_n4.log", "lines": lines, "settings": settings, "steps": steps,
            "critic_given": False}


def dapo() -> dict:
    config = {
        "actor_rollout_ref": {
            "actor": {"ppo_epochs": 1, "ppo_mini_batch_size": 16, "ppo_micro_batch_size_per_gpu": 4,
                      "use_kl_loss": False, "kl_loss_coef": 0.0, "use_dynamic_bsz": False},
            "model": {"path": "Qwen/Qwen2.5-1.5B-Instruct", "enable_gradient_checkpointing": True,
                      "use_remove_padding": True},
            "rollout": {"n": 8, "name": "vllm", "log_prob_micro_batch_size_per_gpu": 8}},
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False,
                      "filter_groups": {"enable": True, "metric": "acc", "max_num_gen_batches": 10},
                      "kl_ctrl": {"kl_coef": 0.0}},
        "data": {"gen_batch_size": 96, "train_batch_size": 32, "max_prompt_length": 1024,
                 "max_response_length": 4096},
        "trainer": {"critic_warmup": 0, "n_gpus_per_node": 8, "nnodes": 1}}
    settings = {"model": "Qwen/Qwen2.5-1.5B-Instruct", "prompts": 32, "group_size": 8,
                "update_passes": 1.0, "minibatches": 2, "beta": 0.0, "lora_rank": 0,
                "gradient_checkpointing": True, "gen_batch_size": 96}
    steps = _steps(37, 6, 164.0, 1210.0, 4096, gen_batches=[1, 3, 2, 2, 1, 3])
    lines = _dump(config) + [_line(s, 256, False) for s in steps]
    return {"log": "verl_dapo.log", "lines": lines, "settings": settings, "steps": steps,
            "critic_given": False}


def main() -> None:
    cases = {}
    for make in (ppo_critic, gae_n4, dapo):
        case = make()
        (HERE / case["log"]).write_text("\n".join(case.pop("lines")) + "\n")
        cases[make.__name__] = case
    (HERE / "verl_cases.json").write_text(json.dumps(cases, indent=1) + "\n")
    print("wrote", ", ".join(c["log"] for c in cases.values()), "and verl_cases.json")


if __name__ == "__main__":
    main()
