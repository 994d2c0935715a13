"""Read the fields of TRL's ``training_args.bin`` (a ``torch.save`` of its ``GRPOConfig``)
with the standard library only and without running any of its code.

``torch.save`` writes a zip archive whose ``*/data.pkl`` is a pickle (``Trainer._save``:
``torch.save(self.args, "training_args.bin")``). A restricted :class:`pickle.Unpickler`
resolves every class to an inert stand-in that only stores its state, so no module is
imported and nothing of the file is executed; enum members come back as their values.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

_SAFE_BUILTINS = {"set": set, "frozenset": frozenset, "dict": dict, "list": list,
                  "tuple": tuple, "complex": complex, "slice": slice, "bytearray": bytearray}


class _Inert:
    """Stand-in for any pickled class: keeps constructor args and state, runs nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:  # copyreg._reconstructor
    return cls.__new__(cls)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return _SAFE_BUILTINS[name]
        if module == "copyreg" and name == "_reconstructor":
            return _reconstructor
        if module == "collections" and name == "OrderedDict":
            return dict
        return type(name, (_Inert,), {"__module__": "inert." + module})

    def persistent_load(self, pid: Any) -> None:  # tensor storages: not needed
        return None


def _plain(v: Any) -> Any:
    if isinstance(v, _Inert):
        args = getattr(v, "_args", ())
        if args and set(v.__dict__) == {"_args"}:  # an enum member: Cls(value)
            return _plain(args[0])
        return {k: _plain(x) for k, x in v.__dict__.items() if k != "_args"}
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def read_training_args(path: str | Path) -> dict[str, Any]:
    """The attributes of the config saved in ``path`` as plain values.

    Raises:
        ValueError: not a torch zip archive or a pickle of an object with attributes.
    """
    raw = Path(path).read_bytes()
    if zipfile.is_zipfile(io.BytesIO(raw)):
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            names = [n for n in z.namelist() if n.endswith("data.pkl")]
            if not names:
                raise ValueError("no data.pkl in the archive")
            raw = z.read(names[0])
    try:
        obj = _Unpickler(io.BytesIO(raw)).load()
    except Exception as e:  # noqa: BLE001 - any malformed pickle is one error
        raise ValueError(f"not a readable pickle ({type(e).__name__})") from None
    out = _plain(obj)
    if not isinstance(out, dict):
        raise ValueError("the pickle holds no object with attributes")
    return out
