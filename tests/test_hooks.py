"""Private methods of libraries that allocopt overrides: their signatures as pinned, and the
installed versions inside the range pyproject.toml pins. A new library release that changes a
hook fails here, not silently inside a trial or a surrogate fit."""

import importlib.metadata
import inspect
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from allocopt.tomlio import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def pinned(name: str) -> Requirement:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for req in (Requirement(r) for group in extras.values() for r in group):
        if req.name == name:
            return req
    raise AssertionError(f"{name} not in pyproject.toml")


def _gpytorch():
    import gpytorch

    return gpytorch.models.ExactGP


def _trl():
    from trl import GRPOTrainer

    return GRPOTrainer


HOOKS = [
    # (package, class getter, method, signature as pinned, where allocopt overrides it)
    ("gpytorch", _gpytorch, "_get_test_prior_mean_and_covariances",
     "(self, train_inputs: 'Iterable[Tensor]', test_inputs: 'Iterable[Tensor]', **kwargs) -> "
     "'tuple[Tensor, Tensor, Tensor, torch.Size, torch.Size, type[Distribution]]'",
     "allocopt/surrogate.py"),
    ("trl", _trl, "_generate_and_score_completions",
     "(self, inputs: list[dict[str, torch.Tensor | typing.Any]]) -> dict[str, torch.Tensor | typing.Any]",
     "allocopt/grpo/driver.py"),
    ("trl", _trl, "_get_per_token_logps_and_entropies",
     "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
     "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, "
     "pixel_attention_mask=None, spatial_shapes=None, num_tiles=None, image_sizes=None, "
     "token_type_ids=None, mm_token_type_ids=None, image_position_ids=None) -> "
     "tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]",
     "allocopt/grpo/driver.py"),
]


@pytest.mark.parametrize("package,cls,method,signature,where", HOOKS, ids=[h[2] for h in HOOKS])
def test_hooked_private_method_keeps_its_signature(package, cls, method, signature, where):
    got = str(inspect.signature(getattr(cls(), method)))
    assert got == signature, (f"{package} {importlib.metadata.version(package)} changed "
                              f"{cls().__name__}.{method}, which {where} overrides: re-check the "
                              "override, then the pin in pyproject.toml")


@pytest.mark.parametrize("package", sorted({h[0] for h in HOOKS}))
def test_installed_version_is_inside_the_pin(package):
    req = pinned(package)
    assert req.specifier and any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), \
        f"{req}: a hooked library needs an upper bound"
    assert req.specifier.contains(importlib.metadata.version(package)), (req, importlib.metadata.version(package))


def test_gpu_extra_pins_vllm_to_the_range_trl_supports():
    """TRL's own `vllm` extra states the vLLM versions it supports; the gpu extra must agree."""
    trl_vllm = next(Requirement(r) for r in importlib.metadata.requires("trl")
                    if r.startswith("vllm") and 'extra == "vllm"' in r)
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    ours = next(Requirement(r) for r in extras["gpu"] if r.startswith("vllm"))
    assert str(ours.specifier) == str(trl_vllm.specifier), (ours, trl_vllm)
