"""Hub look-ups: a model's ``config.json`` from the Hugging Face hub, and model shapes that may
need one. Network code, kept out of the pure FLOP math (:mod:`allocopt.flops`).

``huggingface_hub`` is imported inside the function (optional, network only).
"""

from __future__ import annotations

from typing import Any

from allocopt.errors import ConfigError
from allocopt.flops.shapes import _PRESET_LIST, ModelShape

__all__ = ["HUB_TIMEOUT_S", "hub_config", "model_shape"]

HUB_TIMEOUT_S = 2.5
"""Seconds a hub look-up may take before it is given up: a ``config.json`` here, whether an id
exists in :mod:`allocopt.resources` (offline, a command fails in under 5 s with one line, not
half a minute of retries)."""


def hub_config(repo_id: str) -> str:
    """Local path of ``repo_id``'s ``config.json`` from the Hugging Face hub (cache first).

    Honours ``HF_HUB_OFFLINE``; gives up after :data:`HUB_TIMEOUT_S` (the download runs in a
    daemon thread, its retry warnings silenced). Raises :class:`ConfigError` in one line.
    """
    import logging
    import threading

    try:
        from huggingface_hub import hf_hub_download  # optional, network only
    except ImportError:
        raise ConfigError(f"model={repo_id!r}: not a preset or a local folder, and "
                          "huggingface_hub is not installed to fetch it") from None
    result: dict[str, Any] = {}

    def fetch() -> None:
        try:
            result["path"] = hf_hub_download(repo_id, "config.json", etag_timeout=HUB_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - reported as one line below
            result["error"] = e

    for name in ("huggingface_hub", "urllib3", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    t = threading.Thread(target=fetch, daemon=True)
    t.start()
    t.join(HUB_TIMEOUT_S)
    if "path" in result:
        return result["path"]
    why = (f"no answer in {HUB_TIMEOUT_S:g} s" if t.is_alive()
           else type(result.get("error")).__name__)
    raise ConfigError(f"model={repo_id!r}: not a preset or a local folder, and its config.json "
                      f"could not be fetched from the hub ({why}); pass a folder with "
                      f"config.json or a preset ({', '.join(p.name for p in _PRESET_LIST)})")


def model_shape(name_or_path: str) -> ModelShape:
    """:meth:`ModelShape.from_pretrained` that fetches a hub id's ``config.json``
    (:func:`hub_config`) when ``name_or_path`` is neither a preset nor a local path.
    Raises :class:`ConfigError` in one line."""
    return ModelShape.from_pretrained(name_or_path, fetch_config=hub_config)
