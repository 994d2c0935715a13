"""Finding a model or dataset (a local path first, then the Hugging Face cache, then the hub) and
loading a model's tokenizer: what an objective and the reward models load before a trial runs.

Offline, a missing id fails at once with one line (:class:`MissingResource`, a
:class:`~allocopt.flops.ConfigError`): the local path and the cache are checked without any
network, and the hub is asked once with a short timeout (``huggingface_hub`` with
``timeout=HUB_TIMEOUT_S``; no retries), so a user without the network learns within seconds
what to download. ``huggingface_hub`` and transformers are imported inside the functions.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from allocopt.flops import ConfigError

from allocopt.plan.hub import HUB_TIMEOUT_S  # seconds the hub may take to answer

_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class MissingResource(ConfigError):
    """A model or dataset is neither a local path, nor cached, nor reachable on the hub."""


def resolve(name: str, kind: Literal["model", "dataset"] = "model", *, field: str | None = None) -> str:
    """Where to load ``name`` from: the local path itself, the cached snapshot folder, or the
    hub id (when the hub answers that it exists; loading then downloads it).

    Args:
        name: a local folder or file, or a hub id ``owner/name``.
        kind: ``model`` or ``dataset``.
        field: the setting's name for messages (default ``kind``).

    Raises:
        MissingResource: none of the three (one line naming the field, the value and what to do).
    """
    field = field or kind
    if not isinstance(name, str) or not name.strip():
        raise MissingResource(f"{field}={name!r}: must be a local path or a hub id owner/name")
    if os.path.exists(name):
        return name
    if not _ID_RE.match(name):
        raise MissingResource(f"{field}={name!r}: no such local path, and not a hub id (owner/name)")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, repo_type=kind, local_files_only=True)
    except Exception:  # not cached: ask the hub below
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise MissingResource(f"{field}={name!r}: not a local path and not in the Hugging Face cache "
                              f"(HF_HUB_OFFLINE is set); download it first: hf download "
                              f"{'--repo-type dataset ' if kind == 'dataset' else ''}{name}")
    try:
        from huggingface_hub import HfApi

        api = HfApi()
        (api.model_info if kind == "model" else api.dataset_info)(name, timeout=HUB_TIMEOUT_S)
    except Exception as e:
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise MissingResource(
            f"{field}={name!r}: not a local path, not in the Hugging Face cache, and the hub did "
            f"not confirm it ({type(e).__name__}: {reason}); download it first (hf download "
            f"{'--repo-type dataset ' if kind == 'dataset' else ''}{name}) or give a local path"
        ) from None
    return name


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a resolved model folder or hub id, left padding.

    ``AutoTokenizer`` picks the class from the model type (a Qwen2 model gets Qwen2's own
    pre-tokenizer), which re-tokenizes a folder saved from a plain ``PreTrainedTokenizerFast``
    differently than it was built; such a folder (``tokenizer_class`` in its
    ``tokenizer_config.json``) is loaded with that class.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = os.path.join(path, "tokenizer_config.json")
    cls = None
    if os.path.isfile(cfg):
        with open(cfg, encoding="utf-8") as fh:
            cls = json.load(fh).get("tokenizer_class")
    if cls in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        tok = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    tok.padding_side = "left"
    return tok


__all__ = ["MissingResource", "load_tokenizer", "resolve"]
