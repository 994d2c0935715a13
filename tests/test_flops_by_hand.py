"""GRPO step FLOPs of a toy shape, computed by hand line by line (an independent check)."""

from allocopt.flops import ModelShape
from allocopt.flops.grpo import GRPOStep, grpo_step_flops

# d=4, L=1, h=2, h_kv=1, d_h=2, f=8, V=10
TOY = ModelShape("toy", hidden_size=4, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=2,
                 intermediate_size=8, vocab_size=10)
# layer weights: q 4*4=16, k 4*2=8, v 8, o 16, MLP 3*4*8=96  -> 144; LM head 4*10 = 40
# attention per (query, key): 4*h*d_h*L = 16


def test_toy_weights():
    assert TOY.layer_matmul_params == 144
    assert TOY.head_matmul_params == 40


def test_grpo_step_by_hand_full_finetuning():
    step = GRPOStep(prompt_tokens=(3,), completion_tokens=(2, 2), group_size=2)
    acct = grpo_step_flops(TOY, step, lora=None, engine_name="trl-vllm")
    # generation of one completion (prompt 3, completion 2 tokens):
    #   prefill: 2*144*3 = 864 linear + 16*(3*4/2 = 6 keys) = 96 attention + 2*40 logits = 80 -> 1040
    #   1 decode step: 2*144 + 2*40 = 368 per token, + 16 * (3 + 1 keys) = 64 -> 432
    assert acct.useful.search == {"prefill": 2 * 1040, "decode": 2 * 432}
    # vLLM prefix caching prefills the shared prompt once
    assert acct.executed.search == {"prefill": 1040, "decode": 2 * 432}
    # training one row (5 tokens, logits on the 2 completion tokens), full fine-tuning:
    #   forward: 2*144*5 = 1440 + 16*15 = 240 + 2*40*2 = 160 -> 1840; backward 2x -> 3680
    # TRL + vLLM with its importance-sampling correction (the default) runs the old-policy
    # pass, a no-grad forward of each row: 1840 per row
    assert acct.useful.learning == {"old_logprobs": 2 * 1840, "ref_logprobs": 0,
                                    "forward": 2 * 1840, "backward": 2 * 3680, "recompute": 0,
                                    "head_recompute": 0}
    off = grpo_step_flops(TOY, GRPOStep(prompt_tokens=(3,), completion_tokens=(2, 2), group_size=2,
                                        importance_sampling_correction=False),
                          lora=None, engine_name="trl-vllm")
    assert off.useful.learning["old_logprobs"] == 0
    # the fused LM head recomputes its logits tile in backward: +160 per row, on a line of
    # its own (checkpointing is off: the checkpoint's recompute line stays 0)
    assert acct.executed.learning["head_recompute"] == 2 * 160
    assert acct.executed.learning["recompute"] == 0
    # executed backward: the fused SDPA kernel also recomputes the scores QKᵀ, so attention
    # backward is 2.5x its forward: 2*1440 + 2.5*240 + 2*160 = 3800 per row
    assert acct.executed.learning["backward"] == 2 * 3800
    assert acct.useful.reward_flops == 0
    assert acct.useful.rho == (2 * 1840 + 2 * 5520) / (2 * 1840 + 2 * 5520 + 2 * 1472)
    executed_learning = 2 * 1840 + 2 * 1840 + 2 * 3800 + 320
    assert acct.executed.rho == executed_learning / (executed_learning + 1040 + 864)


def test_grpo_step_by_hand_two_passes_reference_and_padding():
    # completions of 2 and 4 tokens; trl-cpu pads to the longest and scores every position
    step = GRPOStep(prompt_tokens=(3,), completion_tokens=(2, 4), group_size=2,
                    update_passes=2, reference=True)
    acct = grpo_step_flops(TOY, step, lora=None, engine_name="trl-cpu")
    # executed generation: both rows prefill 3 and decode 3 steps (the longest row has 4 tokens)
    #   prefill (full attention: 3*3 = 9 keys): 864 + 16*9 + 80 = 1088
    #   decode steps j=1..3 see 4, 5, 6 keys: 3*368 + 16*15 = 1344
    assert acct.executed.search == {"prefill": 2 * 1088, "decode": 2 * 1344}
    # executed log-prob pass per row: 7 tokens, full attention 49 keys, logits on 6 positions
    fwd7 = 2 * 144 * 7 + 16 * 49 + 2 * 40 * 6
    assert acct.executed.learning["old_logprobs"] == 2 * fwd7
    assert acct.executed.learning["ref_logprobs"] == 2 * fwd7
    # two passes of forward + backward + head recompute; backward: linear and head 2x, fused
    # SDPA attention 2.5x (scores recomputed): 2*2016 + 2.5*784 + 2*480 = 6952 per row
    assert acct.executed.learning["forward"] == 2 * 2 * fwd7
    assert acct.executed.learning["backward"] == 2 * 2 * (2 * 2016 + 1960 + 2 * 480)
    assert acct.executed.learning["head_recompute"] == 2 * 2 * (2 * 40 * 6)
    assert acct.executed.learning["recompute"] == 0  # no checkpointing
