"""Mixture-of-experts, multi-head latent attention and per-layer sliding windows.

* transformers' own ``Qwen3MoeForCausalLM``, ``Qwen2MoeForCausalLM`` (gated shared expert),
  ``MixtralForCausalLM`` and ``DeepseekV3ForCausalLM`` (MLA, dense first layer, shared
  expert), built from shrunk configs on the meta device, measured with ``FlopCounterMode``:
  forward, full fine-tuning with non-reentrant gradient checkpointing, LoRA on the attention
  projections. The routed experts run transformers' ``batched_mm`` implementation (every
  token through its top-k experts: what a grouped GEMM computes; the default loop over
  experts asks for data on the meta device). Eager attention (the full rectangle).
* LoRA on the routed experts and the router: a real peft adapter (``target_parameters``, folded
  per call) on small real weights against ``FlopCounterMode``; the per-token path by hand.
* the shipped ``config.json`` of Qwen3-30B-A3B, Mixtral-8x7B and DeepSeek-V3 read into the
  fields each family uses, and their active parameters per token against the published ones.
* sliding windows per layer against a brute-force count; rope-scaled contexts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from allocopt.flops import ConfigError, LoRASpec, ModelShape, forward_flops, training_flops
from allocopt.flops.formulas import attention_keys, generation_flops

CONFIGS = Path(__file__).parent / "data" / "configs"
N = 10  # tokens of the measured sequence


def _families():
    from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, MixtralConfig,
                              MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM)

    small = dict(vocab_size=97, hidden_size=64, num_attention_heads=4, max_position_embeddings=512)
    attn = ["q_proj", "k_proj", "v_proj", "o_proj"]
    return {
        # layer 1 dense (mlp_only_layers), 8 experts of width 24, top-2, head_dim 16
        "qwen3-moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(
            **small, intermediate_size=96, moe_intermediate_size=24, num_experts=8,
            num_experts_per_tok=2, num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
            mlp_only_layers=[1]), attn),
        # a shared expert of width 40 behind a sigmoid gate
        "qwen2-moe": (Qwen2MoeForCausalLM, Qwen2MoeConfig(
            **small, intermediate_size=96, moe_intermediate_size=24,
            shared_expert_intermediate_size=40, num_experts=8, num_experts_per_tok=2,
            num_hidden_layers=2, num_key_value_heads=2), attn),
        # 4 experts of width intermediate_size = 40, top-2, every layer
        "mixtral": (MixtralForCausalLM, MixtralConfig(
            **small, intermediate_size=40, num_local_experts=4, num_experts_per_tok=2,
            num_hidden_layers=2, num_key_value_heads=2), attn),
        # MLA (q rank 32, kv rank 16, nope 12 + rope 4, v 10), first layer dense, 1 shared expert
        "deepseek-v3": (DeepseekV3ForCausalLM, DeepseekV3Config(
            **small, intermediate_size=96, moe_intermediate_size=24, n_routed_experts=8,
            n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
            first_k_dense_replace=1, num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=32,
            kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=4, v_head_dim=10),
            ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]),
    }


@pytest.fixture
def meta_masks(monkeypatch):
    """transformers' mask builder asks whether position ids are packed (a data-dependent
    check that cannot run on the meta device); nothing here is packed."""
    import transformers.masking_utils as mu

    monkeypatch.setattr(mu, "find_packed_sequence_indices", lambda *a, **k: None)


@pytest.mark.parametrize("family", ["qwen3-moe", "qwen2-moe", "mixtral", "deepseek-v3"])
def test_moe_matches_flop_counter_on_meta(family, meta_masks):
    torch = pytest.importorskip("torch")
    from tests.flop_utils import count_flops, lora

    cls, cfg, attn_targets = _families()[family]
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "batched_mm"
    s = ModelShape.from_config(cfg.to_dict())
    assert s.moe_layers and s.num_experts_per_tok == 2
    ids = torch.zeros((1, N), dtype=torch.long, device="meta")
    with torch.device("meta"):
        m = cls(cfg)
    with torch.no_grad():
        measured, _ = count_flops(lambda: m(input_ids=ids, use_cache=False))
    assert measured == forward_flops(s, N, num_logits=N, attention="full")

    m.train()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    measured, _ = count_flops(lambda: m(input_ids=ids, use_cache=False).logits.float().sum().backward())
    assert measured == training_flops(s, N, num_logits=N, attention="full", fused_attention=False,
                                      gradient_checkpointing=True)["total"]

    with torch.device("meta"):
        pm = lora(cls(cfg), attn_targets, rank=4)
    pm.train()
    measured, _ = count_flops(lambda: pm(input_ids=ids, use_cache=False).logits.float().sum().backward())
    assert measured == training_flops(s, N, num_logits=N, attention="full", fused_attention=False,
                                      lora=LoRASpec(4, tuple(attn_targets)))["total"]


def _active(s: ModelShape) -> int:
    """Active parameters per token as the model cards count them: every layer's matmul
    weights a token meets, the LM head and the embedding."""
    return s.matmul_params_per_token + 2 * s.hidden_size * s.vocab_size


def test_shipped_configs_read_each_familys_fields():
    q = ModelShape.from_pretrained(str(CONFIGS / "Qwen3-30B-A3B"))
    assert (q.num_experts, q.num_experts_per_tok, q.moe_intermediate_size, q.moe_layers,
            q.shared_expert_intermediate_size, q.head_dim) == (128, 8, 768, tuple(range(48)), 0, 128)
    m = ModelShape.from_pretrained(str(CONFIGS / "Mixtral-8x7B-v0.1"))
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.moe_layers) == \
        (8, 2, 14336, tuple(range(32)))
    d = ModelShape.from_pretrained(str(CONFIGS / "DeepSeek-V3"))
    assert (d.num_experts, d.num_experts_per_tok, d.moe_intermediate_size, d.moe_layers,
            d.shared_expert_intermediate_size, d.shared_expert_gate) == \
        (256, 8, 2048, tuple(range(3, 61)), 2048, False)
    assert (d.q_lora_rank, d.kv_lora_rank, d.head_dim, d.qk_rope_head_dim, d.v_dim) == \
        (1536, 512, 192, 64, 128)
    assert d.max_position_embeddings == 163840  # yarn factor 40 x 4096
    # the model cards: Qwen3-30B-A3B "3.3B activated", Mixtral "12.9B active", DeepSeek-V3
    # "37B activated" (the card's count leaves out its multi-token-prediction module); the
    # cards round and do not say what they include (norms, embedding): within 2%
    assert _active(q) / 1e9 == pytest.approx(3.3, rel=0.02)
    assert _active(m) / 1e9 == pytest.approx(12.9, rel=0.02)
    assert _active(d) / 1e9 == pytest.approx(37, rel=0.02)


def test_moe_by_hand_qwen3_30b_a3b():
    """One token's forward FLOPs of Qwen3-30B-A3B written out: per layer q 2048x4096,
    k and v 2048x512, o 4096x2048, router 2048x128, 8 experts x 3 x 2048x768; 48 layers;
    LM head 2048x151936 at that token."""
    s = ModelShape.from_pretrained(str(CONFIGS / "Qwen3-30B-A3B"))
    layer = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2048 * 128 + 8 * 3 * 2048 * 768
    attn_one_key = 4 * 32 * 128
    assert forward_flops(s, 1, num_logits=1) == 48 * (2 * layer + attn_one_key) + 2 * 2048 * 151936


def test_lora_on_moe_mlp_names_refused_in_one_line():
    """The MLP names on a MoE model whose model_type is not mapped (here: none given) are
    refused, naming the explicit targets."""
    s = dataclasses.replace(ModelShape.from_pretrained(str(CONFIGS / "Mixtral-8x7B-v0.1")),
                            model_type=None)
    with pytest.raises(ConfigError, match=r"^lora_targets=all-linear: down_proj on a "
                                          r"mixture-of-experts model of model_type=None is not "
                                          r"counted .*experts.gate_up_proj,experts.down_proj"):
        forward_flops(s, 4, lora=LoRASpec(8))
    assert forward_flops(s, 4, lora=LoRASpec(8, ("q_proj", "v_proj"))) > forward_flops(s, 4)
    dense = ModelShape.from_pretrained(str(CONFIGS / "Qwen2.5-32B"))
    with pytest.raises(ConfigError, match=r"^lora_targets=q_proj,experts.gate_up_proj,"
                                          r"experts.down_proj: experts.down_proj: .* has no "
                                          r"mixture-of-experts layers"):
        forward_flops(dense, 4, lora=LoRASpec(8, "q_proj,experts"))


# peft target_parameters -> allocopt's names (transformers 5: Qwen3MoeExperts, MixtralExperts,
# Qwen2MoeExperts, DeepseekV3NaiveMoe hold the experts as 3-D gate_up_proj / down_proj)
_EXPERT_PARAMS = {"experts.gate_up_proj": "mlp.experts.gate_up_proj",
                  "experts.down_proj": "mlp.experts.down_proj", "router": "mlp.gate.weight"}


@pytest.mark.parametrize("family,targets", [
    ("qwen3-moe", ("experts.gate_up_proj", "experts.down_proj", "router")),
    ("qwen2-moe", ("experts.down_proj", "router")),
    ("mixtral", ("experts.gate_up_proj", "experts.down_proj")),
    ("deepseek-v3", ("experts.gate_up_proj", "experts.down_proj", "router"))])
def test_lora_on_experts_matches_flop_counter(family, targets):
    """A real peft 0.21 adapter (``target_parameters``: peft's ``ParamWrapper`` folds
    ``W + s·A_e B_e`` into each expert stack on every call) on small real weights (peft's
    fold disables autocast, which the meta device refuses): a no-grad forward, a training
    pass, and one with non-reentrant checkpointing, with and without an attention adapter;
    then two rows in one call share the call's folds."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from tests.flop_utils import count_flops

    cls, cfg, attn_targets = _families()[family]
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "batched_mm"
    s = ModelShape.from_config(cfg.to_dict())
    ids = torch.randint(0, 97, (1, N), generator=torch.Generator().manual_seed(0))
    for attn in (attn_targets[:1], []):
        torch.manual_seed(0)
        pm = get_peft_model(cls(cfg), LoraConfig(
            r=4, lora_alpha=8, target_modules=list(attn),
            target_parameters=[_EXPERT_PARAMS[t] for t in targets]))
        spec = LoRASpec(4, tuple(attn) + targets)
        kw = dict(num_logits=N, attention="full", lora=spec, expert_folds=1)
        with torch.no_grad():
            measured, _ = count_flops(lambda: pm(input_ids=ids, use_cache=False))
        assert measured == forward_flops(s, N, **kw)
        pm.train()
        train = lambda x: pm(input_ids=x, use_cache=False).logits.float().sum().backward()  # noqa: E731
        measured, _ = count_flops(lambda: train(ids))
        assert measured == training_flops(s, N, fused_attention=False, **kw)["total"]
        pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        measured, _ = count_flops(lambda: train(ids))
        gc = training_flops(s, N, fused_attention=False, gradient_checkpointing=True, **kw)["total"]
        assert measured == gc
    # two rows in one call: twice the tokens, one call's folds
    measured, _ = count_flops(lambda: train(ids.repeat(2, 1)))
    per_call = training_flops(s, N, fused_attention=False, gradient_checkpointing=True,
                              **{**kw, "expert_folds": 2})["total"] - gc
    assert per_call > 0 and measured == 2 * gc - per_call


def test_lora_on_experts_per_token_by_hand():
    """Qwen3-30B-A3B, rank 32 on the experts and the router, one token, the per-token path
    (vLLM's fused-MoE LoRA; the useful count): each of the 8 routed experts' ``A_e``, ``B_e``
    of gate_up (2048 -> 32 -> 1536) and down (768 -> 32 -> 2048), the router's (2048 -> 32 ->
    128), 48 layers; folded (peft) instead: per call, the 128 experts' stacks twice and the
    router once, nothing per token."""
    s = ModelShape.from_pretrained(str(CONFIGS / "Qwen3-30B-A3B"))
    spec = LoRASpec(32, "experts,router")
    r = 32
    per_token = 48 * (8 * 2 * r * (2048 + 1536) + 8 * 2 * r * (768 + 2048) + 2 * r * (2048 + 128))
    assert forward_flops(s, 1, lora=spec) - forward_flops(s, 1) == per_token
    fold = 48 * (2 * 2 * 128 * 2048 * 1536 * r + 2 * 2 * 128 * 768 * 2048 * r + 2 * 2048 * 128 * r)
    assert forward_flops(s, 1, lora=spec, expert_folds=1) - forward_flops(s, 1) == fold
    assert forward_flops(s, 5, lora=spec, expert_folds=3) - forward_flops(s, 5) == 3 * fold


def test_account_prices_lora_on_experts(cli, tmp_path):
    """The recipe and --lora-targets accept the expert names; verl (vLLM serves the adapters
    per token in rollouts; peft folds them per micro-batch in the actor) and trl-vllm
    (merged for rollouts) price them."""
    import json

    from allocopt.plan.recipe import price

    model = str(CONFIGS / "Qwen3-30B-A3B")
    kw = dict(model=model, lora_rank=32, engine="verl", prompts=4, group_size=8)
    attn = price(**kw, lora_targets="q_proj,k_proj,v_proj,o_proj").executed
    both = price(**kw, lora_targets="q_proj,k_proj,v_proj,o_proj,experts,router").executed
    assert both.search_flops > attn.search_flops and both.learning_flops > attn.learning_flops
    args_all = ("account", "--model", model, "--engine", "verl", "--lora-rank", "32", "--prompts",
                "4", "-G", "8")
    r = cli(*args_all, "--lora-targets", "q_proj,k_proj,v_proj,o_proj,experts,router", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total_flops"] == both.total_flops
    # all-linear: peft adapts the experts (gate_up at 2r), the router and attention
    r = cli(*args_all, "--lora-targets", "all-linear", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total_flops"] == price(**kw, lora_targets="all-linear").executed.total_flops
    # a MoE config whose model_type is not mapped: one line, naming the explicit targets
    cfg = json.loads((CONFIGS / "Qwen3-30B-A3B" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "olmoe"}))
    r = cli("account", "--model", str(tmp_path), "--lora-rank", "32", "--lora-targets", "all-linear")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "model_type='olmoe'" in r.stderr and "experts.gate_up_proj,experts.down_proj" in r.stderr


def test_account_prices_a_moe_model(tmp_path):
    from allocopt.plan.recipe import price

    a = price(model=str(CONFIGS / "Qwen3-30B-A3B"), lora_rank=0, engine="verl", prompts=4,
              group_size=4).executed
    dense_equivalent = dataclasses.replace(
        ModelShape.from_pretrained(str(CONFIGS / "Qwen3-30B-A3B")), moe_layers=())
    assert a.total_flops > 0 and a.learning_flops > a.search_flops
    # the dense reading (intermediate_size 6144 in every layer) would be a different count
    assert forward_flops(dense_equivalent, 100) != forward_flops(
        ModelShape.from_pretrained(str(CONFIGS / "Qwen3-30B-A3B")), 100)


# ------------------------------------------------------------------- sliding windows
@pytest.mark.parametrize("n,c,w", [(10, 0, 4), (5, 3, 4), (1, 9, 4), (7, 0, 10), (3, 20, 5), (6, 2, 1)])
def test_windowed_keys_brute_force(n, c, w):
    assert attention_keys(n, c, "causal", w) == sum(min(t + 1, w) for t in range(c, c + n))
    assert attention_keys(n, c, "full", w) == (n * (c + n) if n > 1 else min(c + 1, w))


def test_partial_sliding_window_counted_per_layer():
    """Qwen2 with use_sliding_window: layers >= max_window_layers use the window; Gemma-style
    layer_types name each layer. A 300-token prefill, window 100, 4 layers of which 1 or 2 are
    windowed: attention keys by brute force per layer."""
    base = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 97,
            "max_position_embeddings": 4096}
    qwen2 = ModelShape.from_config({**base, "use_sliding_window": True, "sliding_window": 100,
                                    "max_window_layers": 3})
    gemma = ModelShape.from_config({**base, "sliding_window": 100, "layer_types": [
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"]})
    plain = ModelShape.from_config(base)
    assert qwen2.window_layers == (3,) and gemma.window_layers == (0, 2)
    n = 300
    full_keys = n * (n + 1) // 2
    win_keys = sum(min(t + 1, 100) for t in range(n))
    per_key = 4 * 4 * 16  # 4·h·d_h
    linear = 2 * plain.layer_matmul_params * 4 * n
    assert forward_flops(qwen2, n) == linear + per_key * (3 * full_keys + 1 * win_keys)
    assert forward_flops(gemma, n) == linear + per_key * (2 * full_keys + 2 * win_keys)
    # decoding 50 tokens after a 300-token prompt: step j sees min(300 + j, 100) keys when windowed
    g = generation_flops(qwen2, 300, 51)
    g_plain = generation_flops(plain, 300, 51)
    saved = per_key * sum(300 + j - 100 for j in range(1, 51))  # one windowed layer
    assert g_plain["decode"] - g["decode"] == saved
    # longer than the window: counted, not refused
    qwen2.check_length(2000)


def test_rope_scaling_extends_the_context():
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 96, "vocab_size": 97, "max_position_embeddings": 32768}
    yarn = ModelShape.from_config({**base, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 32768}})
    assert yarn.max_position_embeddings == 131072
    yarn.check_length(100_000)
    with pytest.raises(ConfigError, match="max_position_embeddings=131072"):
        yarn.check_length(131073)
    # transformers 5 writes rope_parameters; the default rope adds nothing
    v5 = ModelShape.from_config({**base, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}})
    assert v5.max_position_embeddings == 65536
    assert ModelShape.from_config({**base, "rope_parameters": {"rope_type": "default"}}) \
        .max_position_embeddings == 32768
    # Llama 3.1: the context is already the scaled one (factor 8 x original 8192 = 65536 < 131072)
    llama = ModelShape.from_config({**base, "max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}})
    assert llama.max_position_embeddings == 131072
    json.dumps(dataclasses.asdict(yarn))  # still a plain, loggable shape


def test_grpo_step_folds_once_per_forward_call():
    """The executed count folds the expert adapters once per forward call of
    ``rows_per_forward`` trained rows: 8 rows in 2 calls pay 6 fewer folds per pass than 8
    calls, in the old-policy pass and in the training pass (forward, backward, recompute);
    the useful count (per token) does not move."""
    from allocopt.flops.grpo import GRPOStep, grpo_step_flops

    s = ModelShape.from_pretrained(str(CONFIGS / "Qwen3-30B-A3B"))
    spec = LoRASpec(8, "q_proj,experts,router")
    kw = dict(prompt_tokens=(20, 30), completion_tokens=(5, 6, 7, 8, 9, 10, 11, 12), group_size=4,
              update_passes=2)
    one, four = (grpo_step_flops(s, GRPOStep(**kw, rows_per_forward=b), lora=spec,
                                 gradient_checkpointing=True, engine_name="verl")
                 for b in (1, 4))
    assert one.useful == four.useful
    fold = spec.fold_flops(s)  # one call's forward folds
    bwd = 2 * 48 * sum(spec.fold_parts(s).values())  # their factor gradients
    saved = 6 * fold + 2 * 6 * (fold + bwd + fold)  # old pass; 2 passes x (fwd, bwd, recompute)
    assert one.executed.learning_flops - four.executed.learning_flops == saved
    assert one.executed.search == four.executed.search


def test_split_micro_batches_match_flop_counter():
    """verl's micro-batch split, run for real: a peft adapter on the experts and router of a
    shrunk Qwen3-MoE; 6 trained rows of 10 tokens; the old-policy pass in no-grad calls of
    ``log_prob_micro_batch_size`` rows, then mu = 2 update passes with checkpointing in calls
    of ``micro_batch_size`` rows (verl 0.9.1 ``prepare_micro_batches``: ``len / mb`` chunks).
    What the split (3 rows a log-prob call, 2 an update call) saves against one row a call,
    measured with ``FlopCounterMode``, equals what the count saves (folds only: the tokens are
    the same)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from allocopt.flops.grpo import GRPOStep, grpo_step_flops
    from tests.flop_utils import count_flops

    cls, cfg, _ = _families()["qwen3-moe"]
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "batched_mm"
    s = ModelShape.from_config(cfg.to_dict())
    torch.manual_seed(0)
    pm = get_peft_model(cls(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"],
                                             target_parameters=list(_EXPERT_PARAMS.values())))
    pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 97, (6, N), generator=torch.Generator().manual_seed(0))

    def run(log_prob_mb: int, mb: int) -> None:
        with torch.no_grad():
            for chunk in ids.split(log_prob_mb):
                pm(input_ids=chunk, use_cache=False)
        for _ in range(2):
            for chunk in ids.split(mb):
                pm(input_ids=chunk, use_cache=False).logits.float().sum().backward()

    (per_row, _), (split, _) = (count_flops(lambda: run(*b)) for b in ((1, 1), (3, 2)))
    spec = LoRASpec(4, "q_proj,experts,router")
    kw = dict(prompt_tokens=(4, 4, 4), completion_tokens=(6,) * 6, group_size=2, update_passes=2)
    one, two = (grpo_step_flops(s, GRPOStep(**kw, rows_per_forward=b, logprob_rows_per_forward=lp),
                                lora=spec, gradient_checkpointing=True, engine_name="verl").executed
                for lp, b in ((1, 1), (3, 2)))
    assert one.learning["old_logprobs"] > 0
    # the reference pass (verl with LoRA: the actor under peft's disable_adapter) folds nothing
    with torch.no_grad(), pm.disable_adapter():
        ref, _ = count_flops(lambda: [pm(input_ids=c, use_cache=False) for c in ids.split(3)])
    assert ref == 6 * forward_flops(s, N, num_logits=N, attention="full")
    assert per_row - split == one.learning_flops - two.learning_flops > 0
    # by hand: the old pass 6 -> 2 calls, each update pass 6 -> 3 calls (forward, backward
    # of the factors, recompute)
    fold, bwd = spec.fold_flops(s), _fold_backward(spec, s)
    assert one.learning_flops - two.learning_flops == 4 * fold + 2 * 3 * (fold + bwd + fold)


def _fold_backward(spec: LoRASpec, s: ModelShape) -> int:
    """The factor gradients of one call's folds: the gradients of ``A`` and ``B`` of each
    adapted expert stack / router product, twice its forward product, per MoE layer."""
    return 2 * s.num_moe_layers * sum(spec.fold_parts(s).values())


def test_account_reads_micro_batches(cli, tmp_path):
    """--micro-batch-size / --log-prob-micro-batch-size and the recipe keys price the folds
    per call; a verl log's micro-batch sizes are read; dynamic batch size with LoRA on
    experts is refused in one line unless the rows per call are given."""
    import json

    from allocopt.plan.recipe import price
    from allocopt.runlogs import RunLogError, import_verl

    model = str(CONFIGS / "Qwen3-30B-A3B")
    kw = dict(model=model, lora_rank=8, engine="verl", prompts=4, group_size=8, update_passes=2,
              lora_targets="q_proj,experts,router", gradient_checkpointing=True)
    base = price(**kw).executed
    split = price(**kw, micro_batch_size=4, log_prob_micro_batch_size=8).executed
    spec, s = LoRASpec(8, "q_proj,experts,router"), ModelShape.from_pretrained(model)
    fold = spec.fold_flops(s)
    assert base.search == split.search
    # 32 rows: old pass 32 -> 4 calls; each of 2 update passes 32 -> 8 calls
    assert base.learning_flops - split.learning_flops == 28 * fold + 2 * 24 * (
        2 * fold + _fold_backward(spec, s))
    (tmp_path / "r.toml").write_text("micro_batch_size = 4\nlog_prob_micro_batch_size = 8\n")
    args = ["account", "--model", model, "--engine", "verl", "--lora-rank", "8", "--prompts", "4",
            "-G", "8", "--update-passes", "2", "--lora-targets", "q_proj,experts,router",
            "--gradient-checkpointing", "--json"]
    for extra in (["--micro-batch-size", "4", "--log-prob-micro-batch-size", "8"],
                  ["--recipe", str(tmp_path / "r.toml")]):
        r = cli(*args, *extra)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["total_flops"] == split.total_flops
    r = cli(*args[:-1], "--micro-batch-size", "0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "micro_batch_size" in r.stderr
    # a verl log with LoRA on experts: micro-batches read from the config
    cfg = "\n".join(f"{k}={v} \\" for k, v in {
        "data.train_batch_size": 4, "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.ppo_epochs": 2, "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.target_modules": "q_proj",
        "actor_rollout_ref.model.enable_gradient_checkpointing": "True",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8}.items())
    steps = "step:1 - response_length/mean:300 - response_length/max:300 - prompt_length/mean:100\n"
    log = tmp_path / "v.log"
    # target_parameters as verl's pprint shows a list
    log.write_text(cfg + "\n" + "{'actor_rollout_ref': {'model': {'target_parameters': "
                   "['mlp.experts.gate_up_proj', 'mlp.experts.down_proj', 'mlp.gate.weight']}}}\n" + steps)
    run = import_verl(log)
    assert run.settings["lora_targets"] == "q_proj,experts.gate_up_proj,experts.down_proj,router"
    assert (run.settings["micro_batch_size"], run.settings["log_prob_micro_batch_size"]) == (4, 8)
    same = price(**{**kw, "lora_targets": run.settings["lora_targets"]}, prompt_tokens=100,
                 completion_tokens=300, micro_batch_size=4, log_prob_micro_batch_size=8)
    assert run.account == same
    log.write_text(log.read_text().replace("8 \\\n", "8 \\\nactor_rollout_ref.actor.use_dynamic_bsz=True \\\n", 1))
    with pytest.raises(RunLogError, match="use_dynamic_bsz=True.*--micro-batch-size") as e:
        import_verl(log)
    assert "\n" not in str(e.value)
    assert import_verl(log, micro_batch_size=4, log_prob_micro_batch_size=8).account == same


# ------------------------------------------- the MLP names on a MoE model, as peft maps them
def _peft_adapted(pm) -> dict[tuple[bool, str], int]:
    """What a real peft model carries: ``(in a MoE layer?, allocopt's module name) → rank``,
    read from peft's own layers (``LoraLayer.r``; a ``ParamWrapper``'s ``parameter_name``)."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import ParamWrapper

    out: dict[tuple[bool, str], int] = {}
    for name, mod in pm.named_modules():
        if not isinstance(mod, LoraLayer) or "default" not in mod.r:
            continue
        path = name.split(".layers.", 1)[1].split(".")  # "2.mlp.experts.base_layer" -> parts
        layer = pm.base_model.model.model.layers[int(path[0])]
        moe = hasattr(layer.mlp, "experts")
        if isinstance(mod, ParamWrapper):
            key = "router" if mod.parameter_name == "weight" else f"experts.{mod.parameter_name}"
        elif path[1] == "self_attn":
            key = path[2]
        elif path[2] == "shared_expert":
            key = f"shared.{path[3]}"
        else:  # mlp.gate_proj of a dense layer, mlp.shared_expert_gate
            key = path[2]
        out[(moe, key)] = mod.r["default"]
    return out


def _allocopt_adapted(spec: LoRASpec, s: ModelShape) -> dict[tuple[bool, str], int]:
    ranks = spec.ranks(s)
    out = {}
    for moe in ({True, False} if s.num_moe_layers < s.num_layers else {True}):
        names = {**s.attention_modules(), **s.mlp_modules(moe)}
        out.update({(moe, m): r for m, r in ranks.items() if m in names})
    return out


_MLP = ["gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("family,targets,adapted", [
    # experts (gate_up at 2r) and the router; layer 1's dense MLP loses its adapters
    ("qwen3-moe", "all-linear", "attention,experts.gate_up_proj@2r,experts.down_proj,router"),
    ("qwen3-moe", _MLP, "experts.gate_up_proj@2r,experts.down_proj"),
    ("qwen3-moe", ["q_proj", "v_proj"] + _MLP, "q_proj,v_proj,experts.gate_up_proj@2r,experts.down_proj"),
    # no conversion: the shared expert's Linear modules (and its gate under all-linear), and
    # the dense layer 1's MLP
    ("qwen2-moe", "all-linear", "attention,shared.*,shared_expert_gate,dense MLP"),
    ("qwen2-moe", _MLP, "shared.*,dense MLP"),
    ("mixtral", "all-linear", "attention,experts.gate_up_proj@2r,experts.down_proj,router"),
    ("mixtral", ["q_proj", "v_proj"] + _MLP, "q_proj,v_proj"),
    # the shared expert and the dense layer 0 lose their adapters
    ("deepseek-v3", "all-linear", "MLA attention,experts.gate_up_proj@2r,experts.down_proj,router"),
    ("deepseek-v3", _MLP, "experts.gate_up_proj@2r,experts.down_proj")])
def test_lora_mlp_names_on_moe_as_peft_maps_them(family, targets, adapted):
    """A real peft 0.21.2 ``LoraConfig(target_modules=...)`` under transformers 5 on each shrunk
    family: the modules it adapts and their ranks are what :meth:`LoRASpec.ranks` says (by
    ``config.json``'s ``model_type``), and its forward (no grad) and training pass cost what
    ``forward_flops`` / ``training_flops`` count (and with non-reentrant checkpointing),
    measured with ``FlopCounterMode``. (The
    third column says in words what peft adapts, for the reader; the assertions compare
    peft's own layers.)"""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from tests.flop_utils import count_flops

    cls, cfg, _ = _families()[family]
    if family == "qwen2-moe":  # a dense layer too (mlp_only_layers), to see it keep its adapters
        d = {k: v for k, v in cfg.to_dict().items() if k != "layer_types"}
        cfg = type(cfg)(**{**d, "num_hidden_layers": 3, "mlp_only_layers": [1]})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "batched_mm"
    s = ModelShape.from_config(cfg.to_dict())
    assert s.model_type == cfg.model_type
    spec = LoRASpec(4, targets if isinstance(targets, str) else ",".join(targets))
    torch.manual_seed(0)
    pm = get_peft_model(cls(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    assert _peft_adapted(pm) == _allocopt_adapted(spec, s)
    ids = torch.randint(0, 97, (1, N), generator=torch.Generator().manual_seed(0))
    kw = dict(num_logits=N, attention="full", lora=spec, expert_folds=1)
    with torch.no_grad():
        measured, _ = count_flops(lambda: pm(input_ids=ids, use_cache=False))
    assert measured == forward_flops(s, N, **kw)
    pm.train()
    train = lambda: pm(input_ids=ids, use_cache=False).logits.float().sum().backward()  # noqa: E731
    measured, _ = count_flops(train)
    assert measured == training_flops(s, N, fused_attention=False, **kw)["total"]
    pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    measured, _ = count_flops(train)
    assert measured == training_flops(s, N, fused_attention=False, gradient_checkpointing=True,
                                      **kw)["total"]


def test_lora_mlp_names_on_moe_by_hand():
    """Qwen3-30B-A3B, ``all-linear`` at rank 8, one token's forward, the per-token path: peft
    adapts q, k, v, o (rank 8), the fused experts' gate_up (rank 16: gate and up fused) and
    down (rank 8) of the 8 routed experts, and the router (rank 8), in all 48 layers."""
    s = ModelShape.from_pretrained(str(CONFIGS / "Qwen3-30B-A3B"))
    attn = 2 * 8 * ((2048 + 4096) + 2 * (2048 + 512) + (4096 + 2048))
    experts = 8 * (2 * 16 * (2048 + 1536) + 2 * 8 * (768 + 2048))
    router = 2 * 8 * (2048 + 128)
    assert forward_flops(s, 1, lora=LoRASpec(8, "all-linear")) - forward_flops(s, 1) == \
        48 * (attn + experts + router)


def test_lora_mlp_names_refused_where_peft_refuses_or_unknown():
    mixtral = ModelShape.from_pretrained(str(CONFIGS / "Mixtral-8x7B-v0.1"))
    with pytest.raises(ConfigError, match=r"^lora_targets=gate_proj,up_proj,down_proj: "
                                          r"model_type='mixtral' has no module named"):
        forward_flops(mixtral, 4, lora=LoRASpec(8, "gate_proj,up_proj,down_proj"))
    qwen3 = ModelShape.from_pretrained(str(CONFIGS / "Qwen3-30B-A3B"))
    with pytest.raises(ConfigError, match=r"gate_proj without up_proj: peft refuses"):
        forward_flops(qwen3, 4, lora=LoRASpec(8, "q_proj,gate_proj"))
    unknown = dataclasses.replace(qwen3, model_type="olmoe")
    with pytest.raises(ConfigError, match=r"^lora_targets=all-linear: down_proj on a mixture-of-"
                                          r"experts model of model_type='olmoe' is not counted .*"
                                          r"experts.gate_up_proj,experts.down_proj"):
        forward_flops(unknown, 4, lora=LoRASpec(8))
