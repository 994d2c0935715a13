"""Scoring a trained ``qwen`` policy; outside the budget, its FLOPs logged as ``eval_flops``.

Targets (greedy completions, ``max_completion_length`` tokens at most, the same chat template
and instruction as training):

* ``native_reward``: mean reward of the trial's own reward system on the held-out Polaris slice;
* ``pass_at_1_gsm8k``, ``pass_at_1_math500``: share of final answers equal to the gold
  (``\\boxed{}`` or ``####`` answer, checked with math-verify: :func:`objectives.step_parsing.is_correct`)
  on the first ``eval_problems`` of each set; ``pass_at_1`` over both sets pooled;
* ``judge``: the common judge's mean step score (:class:`objectives.prm.CardPRM`, aggregate
  ``mean``) on the downstream completions, averaged; the same judge model for every trial.

``eval_flops`` = generation (padded batches as executed by transformers ``generate``:
:func:`allocopt.flops.generation_flops` with ``full`` attention over the padded prompt) +
the reward and judge models' executed FLOPs on the evaluation outputs.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from allocopt.flops import ModelShape, generation_flops


def evaluate(objective: Any, model: Any, tokenizer: Any, reward: Any,
             heldout: Sequence[Any]) -> tuple[dict[str, float], int]:
    """``(targets, eval_flops)`` of a trained policy (LoRA adapters merged first)."""
    from objectives.mathdata import load_gsm8k, load_math500
    from objectives.polaris import render_prompt
    from objectives.prm import load_prm
    from objectives.step_parsing import is_correct

    s = objective.settings
    if hasattr(model, "merge_and_unload"):  # the same function, fewer matmuls
        model = model.merge_and_unload()
    max_new = objective.setup().max_completion_length
    gsm = load_gsm8k(s.gsm8k if s.gsm8k != "hub" else None, limit=s.eval_problems)
    math = load_math500(s.math500 if s.math500 != "hub" else None, limit=s.eval_problems)
    flops = 0
    native_out, f = generate(model, tokenizer, [render_prompt(tokenizer, r.problem) for r in heldout],
                             max_new, s.eval_batch_size)
    flops += f
    down = [(p.question, p.answer) for p in gsm] + [(p.question, p.answer) for p in math]
    down_out, f = generate(model, tokenizer, [render_prompt(tokenizer, q) for q, _ in down],
                           max_new, s.eval_batch_size)
    flops += f
    if hasattr(reward, "consume_usage"):
        reward.consume_usage()  # the trial's last training call was already charged
    native = reward(prompts=[r.problem for r in heldout], completions=native_out,
                    answer=[r.answer for r in heldout], problem=[r.problem for r in heldout])
    if hasattr(reward, "consume_usage"):
        flops += reward.consume_usage().executed_flops
    correct = [is_correct(c, gold) for c, (_, gold) in zip(down_out, down)]
    judge = load_prm(s.judge_model, reward="prm", aggregate="mean", field="judge_model")
    scores = judge(prompts=[q for q, _ in down], completions=down_out, problem=[q for q, _ in down])
    flops += judge.consume_usage().executed_flops
    n = len(gsm)
    targets = {
        "native_reward": statistics.fmean(native),
        "pass_at_1": statistics.fmean(correct),
        "pass_at_1_gsm8k": statistics.fmean(correct[:n]),
        "pass_at_1_math500": statistics.fmean(correct[n:]),
        "judge": statistics.fmean(scores),
    }
    return targets, flops


def generate(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int,
             batch_size: int) -> tuple[list[str], int]:
    """Greedy completions (special tokens dropped) and their executed FLOPs: every row of a
    left-padded batch runs prefill over the padded prompt and one decode step per generated
    position, finished rows included (transformers ``generate``)."""
    import torch

    shape = ModelShape.from_config(model.config.to_dict())
    outs: list[str] = []
    flops = 0
    model.eval()
    device = next(model.parameters()).device
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i:i + batch_size]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            gen = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        new = gen[:, enc["input_ids"].shape[1]:]
        outs.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
        flops += len(batch) * generation_flops(shape, enc["input_ids"].shape[1], new.shape[1],
                                               attention="full")["total"]
    return outs, flops


__all__ = ["evaluate", "generate"]
