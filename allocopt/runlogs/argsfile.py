"""Read the fields of TRL's ``training_args.bin`` (a ``torch.save`` of its ``GRPOConfig``)
with the standard library only and without running any of its code.

``torch.save`` writes a zip archive whose ``*/data.pkl`` is a pickle (``Trainer._save``:
``torch.save(self.args, "training_args.bin")``). A restricted :class:`pickle.Unpickler`
resolves every class to an inert stand-in that only stores its state, so no module is
imported and nothing of the file is executed; enum members come back as their values.

Limits (:mod:`allocopt.limits`): the file and its ``data.pkl`` member at most
:data:`~allocopt.limits.MAX_ARGS_BYTES` (16 MiB), by the size the archive declares and by the
bytes actually inflated; at most :data:`~allocopt.limits.MAX_VALUES` (100,000) values built
(objects, containers, and the values a shared container expands to), nested at most
:data:`~allocopt.limits.MAX_DEPTH` (64) deep; ``bytearray(n)`` at most 16 MiB. A pickle that
would build more (a few hundred bytes can ask for gigabytes) is refused before it does.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

from allocopt.limits import MAX_ARGS_BYTES, MAX_DEPTH, MAX_VALUES, read_bytes, read_capped


class _Limit(Exception):
    """A pickle over a limit of this module (the message says which)."""


def _bytearray(*args: Any) -> bytearray:
    """``bytearray`` that refuses to allocate more than the file limit."""
    if args and isinstance(args[0], int) and not isinstance(args[0], bool) and args[0] > MAX_ARGS_BYTES:
        raise _Limit(f"asks for bytearray({args[0]}), over the limit of {MAX_ARGS_BYTES // 2**20} MiB")
    return bytearray(*args)


_SAFE_BUILTINS = {"set": set, "frozenset": frozenset, "dict": dict, "list": list,
                  "tuple": tuple, "complex": complex, "slice": slice, "bytearray": _bytearray}


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
    classes = 0

    def find_class(self, module: str, name: str) -> Any:
        self.classes += 1
        if self.classes > 10_000:
            raise _Limit("more than 10000 class references")
        if module == "builtins" and name in _SAFE_BUILTINS:
            return _SAFE_BUILTINS[name]
        if module == "copyreg" and name == "_reconstructor":
            return _reconstructor
        if module == "collections" and name == "OrderedDict":
            return dict
        return type(name, (_Inert,), {"__module__": "inert." + module})

    def persistent_load(self, pid: Any) -> None:  # tensor storages: not needed
        return None


def _plain(v: Any, budget: list[int], level: int = 0) -> Any:
    """``v`` with stand-ins turned into dicts; at most ``budget[0]`` values in all (a shared or
    self-containing container counts every time it is reached) and :data:`MAX_DEPTH` deep."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Limit(f"builds more than the limit of {MAX_VALUES} values")
    if level > MAX_DEPTH:
        raise _Limit(f"nested deeper than the limit of {MAX_DEPTH} levels")
    if isinstance(v, _Inert):
        args = getattr(v, "_args", ())
        if args and set(v.__dict__) == {"_args"}:  # an enum member: Cls(value)
            return _plain(args[0], budget, level + 1)
        return {k: _plain(x, budget, level + 1) for k, x in v.__dict__.items() if k != "_args"}
    if isinstance(v, dict):
        return {k: _plain(x, budget, level + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x, budget, level + 1) for x in v]
    return v


def read_training_args(path: str | Path) -> dict[str, Any]:
    """The attributes of the config saved in ``path`` as plain values (limits: module docstring).

    Raises:
        ValueError: not a torch zip archive or a pickle of an object with attributes, or over a
            limit (the message names it).
    """
    raw = read_bytes(path, MAX_ARGS_BYTES, "training_args", ValueError)
    if zipfile.is_zipfile(io.BytesIO(raw)):
        try:
            with zipfile.ZipFile(io.BytesIO(raw)) as z:
                infos = [i for i in z.infolist() if i.filename.endswith("data.pkl")]
                if not infos:
                    raise ValueError("no data.pkl in the archive")
                if infos[0].file_size > MAX_ARGS_BYTES:
                    raise ValueError(f"archive member {infos[0].filename!r} declares {infos[0].file_size} "
                                     f"bytes, over the limit of {MAX_ARGS_BYTES // 2**20} MiB")
                with z.open(infos[0]) as fh:
                    raw = read_capped(fh, MAX_ARGS_BYTES, infos[0].filename, "archive member", ValueError)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError) as e:
            raise ValueError(f"not a readable zip archive ({type(e).__name__}: {str(e)[:120]})") from None
    try:
        obj = _Unpickler(io.BytesIO(raw)).load()
        out = _plain(obj, [MAX_VALUES])
    except _Limit as e:
        raise ValueError(f"the pickle {e}") from None
    except RecursionError:
        raise ValueError(f"the pickle is nested deeper than the limit of {MAX_DEPTH} levels") from None
    except MemoryError:
        raise ValueError("the pickle asks for more memory than there is") from None
    except Exception as e:  # noqa: BLE001 - any malformed pickle is one error
        raise ValueError(f"not a readable pickle ({type(e).__name__})") from None
    if not isinstance(out, dict):
        raise ValueError("the pickle holds no object with attributes")
    return out
