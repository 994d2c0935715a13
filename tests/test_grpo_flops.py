"""One whole GRPO step of TRL's ``GRPOTrainer`` on CPU under ``FlopCounterMode`` against
``grpo_step_flops(..., engine_name="trl-cpu")``.

What TRL 1.16 does on CPU, and what the ``trl-cpu`` engine therefore counts:

* generation: one ``model.generate`` over the whole rollout batch, prompts left-padded to the
  longest (``P_max``); rows that ended keep decoding until the longest completion ends
  (``C_max``): every row pays ``generation_flops(P_max, C_max)``, adapters unmerged;
* completions are cut after their first EOS and right-padded to the longest, so the log-prob
  and loss passes run on ``P_max + C_max`` tokens per row, with full attention;
* the fused LM head (``add_fused_lm_head``, ``trl/kernels/chunked_logprob.py``) has no Triton
  on CPU and scores every position but the last (``P_max + C_max - 1``), and in backward
  recomputes each logits tile before its gradient GEMMs;
* old-policy log-probs run when ``gradient_accumulation_steps % (steps_per_generation ×
  num_iterations) != 0``, i.e. ``num_iterations > 1`` here; the reference pass (``β > 0``)
  is the same model with adapters disabled;
* ``GRPOConfig`` turns gradient checkpointing on by default: torch's non-reentrant
  checkpoint, plus ``enable_input_require_grads`` for peft models.

Every phase is measured separately (``generate``; no-grad log-prob passes; the loss forward;
the rest = backward + recompute) and must equal the formula exactly.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass

import pytest
import torch

from allocopt.flops import ConfigError, LoRASpec
from allocopt.flops.grpo import ENGINES, Engine, GRPOStep, engine, grpo_step_flops
from flop_utils import FlopMeter, char_tokenizer, shape_of, tiny_causal_lm

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
aten = torch.ops.aten

PROMPTS = ["1+1=", "12+30=?", "7="]
G = 3
MAX_COMPLETION = 8
RANK = 4


@dataclass
class Run:
    """What one measured GRPO iteration left behind."""

    step: GRPOStep
    phases: dict[str, int]
    total: int
    by_op: dict[str, int]
    generate_width: tuple[int, int]  # (P_max fed to generate, tokens generate added)
    calls: dict[str, int]
    shape: object


def run_grpo(tmp_path, *, update_passes: int, beta: float, attn: str = "sdpa",
             with_lora: bool = True, gradient_checkpointing: bool = True) -> Run:
    """Train ``update_passes`` optimizer steps of TRL's GRPOTrainer (= one rollout batch used
    μ times: ``gradient_accumulation_steps=1``, generation every ``num_iterations`` steps)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    tok = char_tokenizer(tmp_path / "tok")
    model = tiny_causal_lm(attn, vocab_size=len(tok))
    seen: dict[str, list] = {"completion_tokens": []}

    def reward(prompts, completions, completion_ids, **kwargs):  # rule-based: 0 FLOPs
        seen["completion_tokens"].append([len(c) for c in completion_ids])
        return [float(len(c)) for c in completion_ids]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[],
        max_steps=update_passes, num_iterations=update_passes, beta=beta,
        per_device_train_batch_size=len(PROMPTS) * G, num_generations=G,
        max_completion_length=MAX_COMPLETION, gradient_checkpointing=gradient_checkpointing,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    peft_config = (LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0,
                              target_modules="all-linear", task_type="CAUSAL_LM")
                   if with_lora else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tok,
                              train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                              peft_config=peft_config)

    meter = FlopMeter()
    calls = {"generate": 0, "logprobs_nograd": 0, "loss_forward": 0}
    policy = trainer.model  # what unwrap_model_for_generation hands back on one CPU process
    generate = policy.generate

    def measured_generate(*a, **kw):
        calls["generate"] += 1
        seen["prompt_tokens"] = kw["attention_mask"].sum(1).tolist()
        with meter.phase("generate"):
            out = generate(*a, **kw)
        seen["width"] = (kw["input_ids"].shape[1], out.shape[1] - kw["input_ids"].shape[1])
        return out

    policy.generate = measured_generate
    logps = trainer._get_per_token_logps_and_entropies

    def measured_logps(*a, **kw):
        name = "loss_forward" if torch.is_grad_enabled() else "logprobs_nograd"
        calls[name] += 1
        with meter.phase(name):
            return logps(*a, **kw)

    trainer._get_per_token_logps_and_entropies = measured_logps
    with warnings.catch_warnings(), meter:
        warnings.simplefilter("ignore")
        trainer.train()

    prompt_rows = seen["prompt_tokens"]
    assert all(prompt_rows[i] == prompt_rows[i - i % G] for i in range(len(prompt_rows)))
    step = GRPOStep(prompt_tokens=tuple(prompt_rows[::G]),
                    completion_tokens=tuple(seen["completion_tokens"][0]), group_size=G,
                    update_passes=update_passes, reference=beta > 0)
    by_op = {str(k): v for k, v in meter.mode.get_flop_counts()["Global"].items()}
    return Run(step, meter.phases, meter.total, by_op, seen["width"], calls, shape_of(model))


CASES = {
    # TRL defaults: SDPA attention, gradient checkpointing, LoRA
    "mu1-beta0-sdpa-gc": dict(update_passes=1, beta=0.0),
    "mu2-beta0.04-sdpa-gc": dict(update_passes=2, beta=0.04),
    "mu1-beta0.04-eager": dict(update_passes=1, beta=0.04, attn="eager", gradient_checkpointing=False),
    "mu2-beta0-full-ft": dict(update_passes=2, beta=0.0, with_lora=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trl_grpo_step_matches_trl_cpu_engine(case, tmp_path):
    kw = CASES[case]
    run = run_grpo(tmp_path, **kw)
    step, mu = run.step, kw["update_passes"]

    # --- how TRL padded and when it ran each pass
    P_max, C_max = max(step.prompt_tokens), max(step.completion_tokens)
    assert run.generate_width == (P_max, C_max)  # left-padded prompts; generate stops at C_max
    assert min(step.completion_tokens) < C_max  # some rows ended early (EOS) and were trimmed
    assert run.calls == {"generate": 1, "loss_forward": mu,
                         "logprobs_nograd": (mu > 1) + (kw["beta"] > 0)}

    # --- the formula, with the engine that describes this run
    eng = engine("trl-cpu")
    if kw.get("attn") == "eager":  # not TRL's default: attention backward per product
        eng = dataclasses.replace(eng, fused_attention=False)
    acct = grpo_step_flops(run.shape, step, lora=LoRASpec(RANK) if kw.get("with_lora", True) else None,
                           gradient_checkpointing=kw.get("gradient_checkpointing", True),
                           engine_name=eng)
    ex = acct.executed
    learning = ex.learning
    assert run.phases["generate"] == ex.search_flops
    assert run.phases.get("logprobs_nograd", 0) == learning["old_logprobs"] + learning["ref_logprobs"]
    assert run.phases["loss_forward"] == learning["forward"]
    rest = run.total - sum(run.phases.values())
    assert rest == learning["backward"] + learning["recompute"] + learning["head_recompute"]
    assert run.total == ex.total_flops  # exact; the brief allows 0.5 %
    assert ex.reward_flops == 0

    # --- the fused head's backward GEMMs are in-place ``addmm_`` (registered in flop_utils):
    # per row and pass, the hidden-state gradient 2·d·V·(N-1) with N = P_max + C_max, plus
    # the head weight's gradient under full fine-tuning. A bare FlopCounterMode misses them.
    N = P_max + C_max
    per_row = 2 * 64 * run.shape.vocab_size * (N - 1)
    weight_grad = 1 if not kw.get("with_lora", True) else 0
    assert run.by_op["aten.addmm_"] == len(step.rows) * mu * per_row * (1 + weight_grad)

    # --- useful FLOPs are below executed ones: padding, full attention, extra logits
    assert acct.useful.total_flops < ex.total_flops


def test_engine_table_and_validation():
    assert set(ENGINES) >= {"trl-cpu", "trl-gpu", "trl-vllm"}
    cpu = engine("trl-cpu")
    assert (cpu.padded_generation, cpu.padded_training, cpu.lm_head_all_positions,
            cpu.head_recompute, cpu.attention, cpu.fused_attention) == (True, True, True, True, "full", True)
    assert engine(cpu) is cpu
    with pytest.raises(ConfigError, match="engine="):
        engine("nope")
    with pytest.raises(ConfigError, match="attention"):
        Engine("x", False, False, False, False, False, False, attention="sliding")


def test_grpo_step_validation():
    with pytest.raises(ConfigError, match="completion_tokens"):
        GRPOStep(prompt_tokens=(3,), completion_tokens=(1, 2, 3), group_size=2)
    with pytest.raises(ConfigError, match="group_size"):
        GRPOStep(prompt_tokens=(3,), completion_tokens=(1,), group_size=0)
    with pytest.raises(ConfigError, match="update_passes"):
        GRPOStep(prompt_tokens=(3,), completion_tokens=(1,), group_size=1, update_passes=-1)
    s = GRPOStep(prompt_tokens=(3, 5), completion_tokens=(1, 2, 3, 4), group_size=2, update_passes=2)
    assert s.rows == [(3, 1), (3, 2), (5, 3), (5, 4)] and s.uses_old_logprobs


def test_trl_cpu_executed_by_hand_one_row():
    """One prompt of 3 tokens, one completion of 2, LoRA-free, no checkpointing: the executed
    trl-cpu count written out for the tiny shape (d=64, L=2, h=4, d_h=16, f=96, V=97)."""
    s = shape_of(tiny_causal_lm())
    acct = grpo_step_flops(s, GRPOStep(prompt_tokens=(3,), completion_tokens=(2,), group_size=1),
                           engine_name="trl-cpu")
    lin, head, pair = 2 * 30720 * 2, 2 * 64 * 97, 4 * 4 * 16 * 2  # per token / logit / key
    # generate: prefill 3 tokens (9 key pairs, 1 logit) + 1 decode step (4 keys, 1 logit)
    assert acct.executed.search == {"prefill": 3 * lin + 9 * pair + head,
                                    "decode": lin + 4 * pair + head}
    # loss pass on 5 tokens, 25 key pairs, the head on 4 positions (all but the last)
    fwd = 5 * lin + 25 * pair + 4 * head
    assert acct.executed.learning["forward"] == fwd
    # full fine-tuning backward: 2x linear and head, SDPA attention 2.5x (recomputed scores)
    assert acct.executed.learning["backward"] == 2 * (5 * lin + 4 * head) + 25 * pair * 5 // 2
    assert acct.executed.learning["head_recompute"] == 4 * head  # the fused head's logits tile
    assert acct.executed.learning["recompute"] == 0  # no gradient checkpointing
