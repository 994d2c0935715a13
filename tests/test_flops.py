"""Every formula of :mod:`allocopt.flops` against FLOPs measured by ``FlopCounterMode``.

Expected values come from ``torch.utils.flop_counter.FlopCounterMode`` running the real
transformers/peft code on tiny Qwen2 models (and on real Qwen2.5 sizes on the meta device),
or from arithmetic written out by hand below; none is copied from the formula.

Measured conventions (see ``tests/flop_utils.py``): attention counts the full ``n x n``
rectangle (masks and ``is_causal`` are ignored by torch's formulas), so the formulas are
called with ``attention="full"``; CPU SDPA needs :func:`register_cpu_sdpa_flops` or it counts 0.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from allocopt.flops import (
    MODULES,
    ComputeBreakdown,
    ConfigError,
    FlopAccount,
    LoRASpec,
    ModelShape,
    attention_keys,
    forward_flops,
    generation_flops,
    reward_model_flops,
    training_flops,
)
from flop_utils import (
    PRMModel,
    config_from_shape,
    count_flops,
    lora,
    register_cpu_sdpa_flops,
    shape_of,
    tiny_causal_lm,
    tiny_config,
)

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
aten = torch.ops.aten

ATTNS = ["eager", "sdpa"]
QV = ("q_proj", "v_proj")


def _ids(rows: int, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 97, (rows, n), generator=g)


def _train_step(model, ids: torch.Tensor, keep: int):
    """Forward with logits at the last ``keep`` positions, then backward of a scalar loss."""
    def step():
        out = model(input_ids=ids, logits_to_keep=keep)
        out.logits.float().pow(2).mean().backward()
    return step


def _by_op(fn) -> dict[str, int]:
    register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as mode:
        fn()
    return {str(k): v for k, v in mode.get_flop_counts()["Global"].items()}


# =============================================================== 1. forward
def test_forward_by_hand():
    """The tiny model's forward, multiplied out by hand, equals the measured count."""
    m = tiny_causal_lm("eager")
    n = 10
    measured, _ = count_flops(lambda: m(input_ids=_ids(1, n)))
    # per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 + MLP 3*64*96 = 30720 weights
    linear = 2 * 30720 * 2 * n          # 2 FLOPs per weight, L = 2 layers, n tokens
    attention = 4 * 4 * 16 * 2 * n * n  # 4*h*d_h per (query, key), L = 2, full n x n
    head = 2 * 64 * 97 * n              # LM head at every position (HF default)
    assert measured == linear + attention + head == 1_404_160


@pytest.mark.parametrize("attn", ATTNS)
@pytest.mark.parametrize("keep", [0, 1, 4])
def test_forward_matches_full_attention(attn, keep):
    """Eager and SDPA forwards, a batch of 2, logits on all (``keep=0``) or the last ``keep``."""
    m = tiny_causal_lm(attn)
    s = shape_of(m)
    n, rows = 12, 2
    with torch.no_grad():
        measured, _ = count_flops(lambda: m(input_ids=_ids(rows, n), logits_to_keep=keep))
    expected = rows * forward_flops(s, n, num_logits=keep or n, attention="full")
    assert measured == expected


@pytest.mark.parametrize("attn", ATTNS)
def test_causal_is_the_lower_triangle_of_the_measured_attention(attn):
    """Measured attention is the full rectangle; ``causal`` counts n(n+1)/2 of its n·n pairs."""
    m = tiny_causal_lm(attn)
    s = shape_of(m)
    n = 10
    with torch.no_grad():
        ops = _by_op(lambda: m(input_ids=_ids(1, n)))
    attn_op = "aten.bmm" if attn == "eager" else "aten._scaled_dot_product_flash_attention_for_cpu"
    measured_attn = ops[attn_op]  # eager: QKᵀ and PV as bmm; SDPA: the registered kernel
    linear_and_head = forward_flops(s, n, num_logits=n, attention="causal") - (
        4 * s.num_heads * s.head_dim * s.num_layers * attention_keys(n, attention="causal"))
    full_attn = forward_flops(s, n, num_logits=n, attention="full") - linear_and_head
    causal_attn = forward_flops(s, n, num_logits=n, attention="causal") - linear_and_head
    assert full_attn == measured_attn == 4 * 4 * 16 * 2 * n * n
    # causal / full = (n(n+1)/2) / (n·n) = 55/100 at n = 10: full counts 1.82x causal
    assert causal_attn * n * n == measured_attn * (n * (n + 1) // 2)
    assert causal_attn / measured_attn == pytest.approx(0.55)
    # at n = 128 the ratio is 129/256 = 0.504: full attention is ~2x what causal needs
    assert attention_keys(128, attention="causal") / attention_keys(128, attention="full") == 129 / 256


def test_sdpa_on_cpu_counts_zero_attention_unless_registered():
    """Why :func:`register_cpu_sdpa_flops` exists: torch 2.13's registry lacks the CPU kernel."""
    register_cpu_sdpa_flops()
    m = tiny_causal_lm("sdpa")
    s = shape_of(m)
    n = 10
    bare = FlopCounterMode(display=False)
    bare.flop_registry.pop(aten._scaled_dot_product_flash_attention_for_cpu)  # as shipped
    with torch.no_grad(), bare:
        m(input_ids=_ids(1, n))
    attention = 4 * s.num_heads * s.head_dim * s.num_layers * n * n
    assert bare.get_total_flops() == forward_flops(s, n, num_logits=n, attention="full") - attention


# ============================================================== 2. training
@pytest.mark.parametrize("attn", ATTNS)
def test_full_finetuning(attn):
    m = tiny_causal_lm(attn).train()
    s = shape_of(m)
    n, keep = 10, 4
    measured, _ = count_flops(_train_step(m, _ids(1, n), keep))
    t = training_flops(s, n, num_logits=keep, attention="full", fused_attention=attn == "sdpa")
    assert measured == t["total"]
    # by hand, eager: backward = 2 x forward; SDPA adds the recomputed scores QKᵀ,
    # i.e. half an attention forward per layer: 2 * h * d_h * n * n * L = 2*4*16*100*2
    base = 3 * forward_flops(s, n, num_logits=keep, attention="full")
    assert measured == base + (2 * 4 * 16 * n * n * 2 if attn == "sdpa" else 0)


@pytest.mark.parametrize("attn", ATTNS)
@pytest.mark.parametrize("targets", ["all-linear", QV], ids=["all", "qv"])
def test_lora_training(attn, targets):
    """LoRA on a frozen base: SDPA's fused backward (``fused_attention=True``) vs eager."""
    m = tiny_causal_lm(attn)
    s = shape_of(m)
    pm = lora(m, targets if isinstance(targets, str) else list(targets), rank=4).train()
    n, keep = 10, 3
    measured, _ = count_flops(_train_step(pm, _ids(1, n), keep))
    spec = LoRASpec(4, MODULES if targets == "all-linear" else targets)
    fused = attn == "sdpa"
    t = training_flops(s, n, num_logits=keep, attention="full", lora=spec, fused_attention=fused)
    assert measured == t["total"]
    # the other attention model is off: eager vs SDPA differ, so the flag matters
    other = training_flops(s, n, num_logits=keep, attention="full", lora=spec, fused_attention=not fused)
    assert other["total"] != measured


@pytest.mark.parametrize("attn", ATTNS)
@pytest.mark.parametrize("kind", ["full", "all", "qv"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_gradient_checkpointing(attn, kind, reentrant):
    """HF ``gradient_checkpointing_enable()`` (non-reentrant by default in transformers 5, and
    in TRL), with peft's/HF's ``enable_input_require_grads`` as transformers itself calls it.

    Non-reentrant checkpointing stops recomputing once the last saved tensor is back, so each
    layer's last matmul (``down_proj``, or its adapter's ``B``) is not rerun; reentrant reruns
    the whole layer. The head is not checkpointed.
    """
    m = tiny_causal_lm(attn)
    s = shape_of(m)
    spec = None
    if kind != "full":
        targets = list(QV) if kind == "qv" else "all-linear"
        m = lora(m, targets, rank=4)
        spec = LoRASpec(4, MODULES if kind == "all" else QV)
    m.train()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if spec is not None:
        m.enable_input_require_grads()  # what TRL's GRPOTrainer does for a peft model
    n, keep = 10, 4
    measured, _ = count_flops(_train_step(m, _ids(1, n), keep))
    t = training_flops(s, n, num_logits=keep, attention="full", lora=spec,
                       gradient_checkpointing=True, reentrant_checkpoint=reentrant,
                       fused_attention=attn == "sdpa")
    assert measured == t["total"]
    # by hand: the recompute is one forward of the layers (no head) ...
    layers_fwd = forward_flops(s, n, attention="full", lora=spec)
    if reentrant:
        assert t["recompute"] == layers_fwd
    else:  # ... less each layer's last matmul: down_proj 2*f*d per token, or B: 2*r*d
        last = 2 * 4 * 64 if kind == "all" else 2 * 96 * 64
        assert t["recompute"] == layers_fwd - 2 * last * n


def test_gradient_checkpointing_needs_input_grads_under_lora():
    """With checkpointing the embedding output requires grad, so the first layer's frozen
    modules pay their input gradient: without that term the count would be low."""
    m = tiny_causal_lm("eager")
    s = shape_of(m)
    pm = lora(m, list(QV), rank=4).train()
    pm.gradient_checkpointing_enable()
    n, keep = 10, 4
    measured, _ = count_flops(_train_step(pm, _ids(1, n), keep))
    kw = dict(num_logits=keep, attention="full", lora=LoRASpec(4, QV), gradient_checkpointing=True,
              fused_attention=False)
    assert measured == training_flops(s, n, **kw)["total"]  # default: input_requires_grad
    assert measured > training_flops(s, n, input_requires_grad=False, **kw)["total"]


# ============================================================= 3. generation
def _left_padded(lens: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    P = max(lens)
    ids = torch.zeros(len(lens), P, dtype=torch.long)
    mask = torch.zeros(len(lens), P, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    for i, n in enumerate(lens):
        ids[i, P - n:] = torch.randint(3, 97, (n,), generator=g)
        mask[i, P - n:] = 1
    return ids, mask


@pytest.mark.parametrize("attn", ATTNS)
@pytest.mark.parametrize("with_lora", [False, True], ids=["base", "lora"])
def test_generate_left_padded_batch(attn, with_lora):
    """``generate`` on 3 left-padded prompts (3, 7, 5 tokens), 6 new tokens each (forced):
    every row pays a prefill of the padded width (logits at the last position only) and 5
    decode steps over the whole padded cache, i.e. ``generation_flops(P_max, T)`` per row."""
    m = tiny_causal_lm(attn)
    s = shape_of(m)
    spec = None
    if with_lora:
        m = lora(m, "all-linear", rank=4).eval()
        spec = LoRASpec(4)
    lens, T = [3, 7, 5], 6
    ids, mask = _left_padded(lens)
    with torch.no_grad():
        measured, out = count_flops(lambda: m.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, min_new_tokens=T,
            max_new_tokens=T, pad_token_id=0, eos_token_id=1))
    assert out.shape == (3, max(lens) + T)
    g = generation_flops(s, max(lens), T, attention="full", lora=spec)
    assert measured == 3 * g["total"]
    # by hand for the base model: prefill 7 tokens -> 2*30720*2*7 + 512*49 + 2*64*97 (one logit)
    if not with_lora:
        prefill = 2 * 30720 * 2 * 7 + 512 * 49 + 2 * 64 * 97
        # decode step j = 1..5: one token, 2*30720*2 + 2*64*97, attention over 7 + j keys
        decode = 5 * (2 * 30720 * 2 + 2 * 64 * 97) + 512 * sum(7 + j for j in range(1, 6))
        assert measured == 3 * (prefill + decode)


def test_generate_keeps_computing_finished_rows():
    """A row that emits EOS early keeps being computed until the longest row ends."""
    m = tiny_causal_lm("sdpa")
    s = shape_of(m)
    lens, T = [4, 6, 5], 8
    ids, mask = _left_padded(lens, seed=3)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=T, pad_token_id=0)
    with torch.no_grad():
        free = m.generate(eos_token_id=None, **kw)[:, max(lens):]
        # make row 0's third token the EOS, so row 0 stops after 3 tokens
        eos = int(free[0, 2])
        measured, out = count_flops(lambda: m.generate(eos_token_id=eos, **kw))
    new = out[:, max(lens):]
    lengths = [int((row == eos).nonzero()[0]) + 1 if (row == eos).any() else new.shape[1] for row in new]
    assert lengths[0] <= 3 < new.shape[1]  # row 0 finished early, the batch went on
    assert measured == 3 * generation_flops(s, max(lens), new.shape[1], attention="full")["total"]


# ============================================================ 4. reward models
@pytest.mark.parametrize("attn", ATTNS)
def test_token_classification_reward_model(attn, tmp_path):
    """``Qwen2ForTokenClassification`` (num_labels=2): a ``d x 2`` score at every position."""
    from transformers import Qwen2ForTokenClassification

    torch.manual_seed(0)
    rm = Qwen2ForTokenClassification(tiny_config(attn, num_labels=2)).eval()
    rm.save_pretrained(tmp_path)  # writes config.json with its architectures
    s = ModelShape.from_pretrained(str(tmp_path))
    assert (s.head, s.num_labels) == ("score", 2)
    n = 12
    with torch.no_grad():
        measured, _ = count_flops(lambda: rm(input_ids=_ids(1, n)))
    assert measured == reward_model_flops(s, n, attention="full")
    # by hand: the tiny layers (2*30720*2 per token, 512 per key pair) + 2*64*2 per position
    assert measured == 2 * 30720 * 2 * n + 512 * n * n + 2 * 64 * 2 * n
    # num_params counts the score's weight only; HF's token-classification head also has a
    # bias (num_labels more parameters; sequence classification has none)
    assert s.num_params() + 2 == sum(p.numel() for p in rm.parameters())


def test_sequence_classification_params_and_flops():
    from transformers import Qwen2ForSequenceClassification

    torch.manual_seed(0)
    cfg = tiny_config("eager", num_labels=2)
    cfg.architectures = ["Qwen2ForSequenceClassification"]
    rm = Qwen2ForSequenceClassification(cfg).eval()
    s = shape_of(rm)
    assert s.head == "score"
    assert s.num_params() == sum(p.numel() for p in rm.parameters())
    n = 9
    with torch.no_grad():
        measured, _ = count_flops(lambda: rm(input_ids=_ids(1, n)))
    assert measured == reward_model_flops(s, n, attention="full")


@pytest.mark.parametrize("attn", ATTNS)
def test_step_level_prm(attn):
    """PRM head ``Linear(d,d)`` → ReLU → ``Linear(d,2)`` at every position; one marker token per
    step is appended to prompt + completion (``reward_model_flops(num_steps=...)``)."""
    cfg = tiny_config(attn)
    torch.manual_seed(0)
    prm = PRMModel(cfg).eval()
    s = ModelShape.from_config({**cfg.to_dict(), "architectures": ["Qwen2ForProcessRewardModel"]})
    assert s.head == "prm"
    assert s.num_params() == sum(p.numel() for p in prm.parameters())
    tokens, steps = 11, 3
    with torch.no_grad():
        measured, _ = count_flops(lambda: prm(_ids(1, tokens + steps)))
    assert measured == reward_model_flops(s, tokens, num_steps=steps, attention="full")
    n = tokens + steps  # by hand: head 2*(64*64 + 64*2) per position
    assert measured == 2 * 30720 * 2 * n + 512 * n * n + 2 * (64 * 64 + 64 * 2) * n


def test_lm_verifier_reads_last_position():
    m = tiny_causal_lm("eager")
    s = shape_of(m)
    with torch.no_grad():
        measured, _ = count_flops(lambda: m(input_ids=_ids(1, 8), logits_to_keep=1))
    assert measured == reward_model_flops(s, 8, attention="full")


# ======================================================= 5. real sizes, meta
@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-7B"])
def test_real_sizes_on_meta(name):
    """Real widths on the meta device (no memory, no compute; FlopCounterMode reads shapes).

    Eager attention: on meta, SDPA dispatches to its math fallback (plain matmuls, no fused
    kernel), which counts as eager does; eager states that plainly.
    """
    from transformers import Qwen2ForCausalLM

    s = ModelShape.preset(name)
    with torch.device("meta"):
        m = Qwen2ForCausalLM(config_from_shape(s, "eager"))
    assert s.num_params() == sum(p.numel() for p in m.parameters())
    ids = torch.zeros((1, 128), dtype=torch.long, device="meta")
    with torch.no_grad():
        measured, _ = count_flops(lambda: m(input_ids=ids, logits_to_keep=64))
    assert measured == forward_flops(s, 128, num_logits=64, attention="full")
    with torch.device("meta"):
        pm = lora(m, "all-linear", rank=32)
    pm.train()
    measured, _ = count_flops(lambda: pm(input_ids=ids, logits_to_keep=64).logits.sum().backward())
    t = training_flops(s, 128, num_logits=64, attention="full", lora=LoRASpec(32),
                       fused_attention=False)
    assert measured == t["total"]


def test_qwen25_15b_parameters():
    # shared/data/README.md: 1,543,714,304 parameters, embedding 233,373,696
    s = ModelShape.preset("Qwen/Qwen2.5-1.5B")
    assert s.num_params() == 1_543_714_304
    assert s.vocab_size * s.hidden_size == 233_373_696
    # by hand: per layer 46,792,704 matmul weights + 2,048 q/k/v biases + 3,072 norm weights
    assert 233_373_696 + 28 * (46_792_704 + 2_048 + 3_072) + 1_536 == 1_543_714_304


# ==================================================== 6. shapes and breakdowns
def _config_dict() -> dict:
    return {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 1536, "num_hidden_layers": 28,
            "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
            "vocab_size": 151936, "tie_word_embeddings": True, "model_type": "qwen2",
            "max_position_embeddings": 32768, "sliding_window": 32768, "use_sliding_window": False}


def test_from_config_and_from_pretrained(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_config_dict()))
    s = ModelShape.from_pretrained(str(tmp_path))
    p = ModelShape.preset("Qwen/Qwen2.5-1.5B")
    assert dataclasses.replace(s, name=p.name) == p
    assert s.head_dim == 128  # d / h when config.json has no head_dim
    assert ModelShape.from_pretrained(str(tmp_path / "config.json")).hidden_size == 1536
    # a tiny HF config round-trips through its dict
    t = shape_of(tiny_config())
    assert (t.hidden_size, t.num_layers, t.num_heads, t.num_kv_heads, t.head_dim,
            t.intermediate_size, t.vocab_size) == (64, 2, 4, 2, 16, 96, 97)


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "intermediate_size", "vocab_size"])
def test_from_pretrained_missing_field(field, tmp_path):
    cfg = _config_dict()
    del cfg[field]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=field):
        ModelShape.from_pretrained(str(tmp_path))


def test_bad_configs(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelShape.from_pretrained(str(tmp_path))
    with pytest.raises(ConfigError, match="num_kv_heads"):
        ModelShape.from_config({**_config_dict(), "num_key_value_heads": 5})
    with pytest.raises(ConfigError, match="unknown model"):
        ModelShape.from_pretrained("no-such-model")
    with pytest.raises(ConfigError, match="lora_rank"):
        LoRASpec(0)
    with pytest.raises(ConfigError, match="lora_target_modules"):
        LoRASpec(4, ("qkv",))
    assert LoRASpec(4, "q_proj, v_proj").target_modules == QV
    assert LoRASpec(4, "all-linear").target_modules == MODULES


@pytest.mark.parametrize("alias,name", [
    ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B"),
    ("Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
    ("Qwen/Qwen2.5-Math-PRM-7B", "Qwen/Qwen2.5-Math-PRM-7B"),
])
def test_presets(alias, name):
    assert ModelShape.preset(alias) == ModelShape.preset(name)
    assert ModelShape.from_pretrained(alias).name == name


def test_preset_values():
    """The table in shared/data/README.md."""
    rows = {"Qwen/Qwen2.5-0.5B": (896, 24, 14, 2, 64, 4864, 151936, True),
            "Qwen/Qwen2.5-1.5B": (1536, 28, 12, 2, 128, 8960, 151936, True),
            "Qwen/Qwen2.5-3B": (2048, 36, 16, 2, 128, 11008, 151936, True),
            "Qwen/Qwen2.5-7B": (3584, 28, 28, 4, 128, 18944, 152064, False)}
    for name, row in rows.items():
        s = ModelShape.preset(name)
        assert (s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim,
                s.intermediate_size, s.vocab_size, s.tie_word_embeddings) == row
    prm = ModelShape.preset("Qwen2.5-Math-PRM-7B")
    assert prm.head == "prm" and prm.head_matmul_params == 3584 * 3584 + 3584 * 2


def test_compute_breakdown_by_hand():
    a = ComputeBreakdown(search={"prefill": 100, "decode": 301},
                         learning={"forward": 200, "backward": 400}, reward={"reward_model": 0})
    b = ComputeBreakdown(search={"prefill": 50}, learning={"recompute": 49},
                         reward={"reward_model": 25})
    c = a + b
    assert c.search == {"prefill": 150, "decode": 301}
    assert c.learning == {"forward": 200, "backward": 400, "recompute": 49}
    assert (c.search_flops, c.learning_flops, c.reward_flops, c.total_flops) == (451, 649, 25, 1125)
    assert c.rho == 649 / 1125
    assert sum([a, b]) == c
    half = a * 0.5  # rounded down per item: 301 * 0.5 = 150
    assert half.search == {"prefill": 50, "decode": 150} and half.learning_flops == 300
    assert (2 * a).total_flops == 2002
    d = c.to_dict("x_")
    assert d["x_search_flops"] == 451 and d["x_total_flops"] == 1125 and d["x_rho"] == 649 / 1125
    assert d["x_learning_recompute_flops"] == 49 and d["x_reward_reward_model_flops"] == 25
    assert math.isnan(ComputeBreakdown().rho)
    with pytest.raises(ConfigError, match="search.prefill"):
        ComputeBreakdown(search={"prefill": -1})
    with pytest.raises(ConfigError, match="learning.forward"):
        ComputeBreakdown(learning={"forward": 1.5})
    with pytest.raises(ConfigError, match="scale"):
        a * -1
    acct = FlopAccount(useful=a, executed=c) + FlopAccount(useful=b, executed=b)
    assert acct.useful == c and acct.executed.total_flops == 1125 + 124
    flat = acct.to_dict()
    assert flat["total_flops"] == 1249 and flat["useful_total_flops"] == 1125


def test_generation_edge_cases():
    s = shape_of(tiny_config())
    assert generation_flops(s, 5, 0) == {"prefill": 0, "decode": 0, "total": 0}
    one = generation_flops(s, 5, 1)  # one token: the prefill alone yields it
    assert one["decode"] == 0 and one["prefill"] == forward_flops(s, 5, num_logits=1)
    with pytest.raises(ConfigError, match="prompt_tokens"):
        generation_flops(s, 0, 3)
    with pytest.raises(ConfigError, match="attention"):
        attention_keys(3, attention="sliding")
