"""A key of one ``pallas_call`` as it is bound, computed without lowering it.

The TPU compiler's verdicts are keyed by the lowered TPU module (``tpu_compiler``), which
costs a Mosaic lowering of the kernel to make (10-60 ms a kernel on a 2-core machine,
every first call of a process). :func:`call_key` hashes what that lowering is a function
of instead: the ``pallas_call``'s parameters (jaxprs written out equation by equation,
their constants' bytes; block mappings, compiler parameters and the rest field by
field), the operands' types, and the caller's ``extra`` (chip, mesh, versions, jax's
configuration). Source locations are left out: they are the lowered module's metadata,
which only a rejection's message shows. A value it cannot write down faithfully (a repr
naming an address or eliding with "...", nesting past ``_DEPTH``) gives no key (None):
the caller then lowers, as before. Only accepted verdicts are kept under such a key, so
a kernel the compiler rejects is always lowered again and reported exactly as before.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.state.disk_cache import DiskCache

__all__ = ["KeySet", "call_key"]

_DEPTH = 40


class _Opaque(Exception):
    """A value the key cannot write down faithfully."""


def call_key(params: Mapping[str, Any], avals_in: Sequence[Any], *extra: Any) -> str | None:
    """A hex digest of ``params`` (a ``pallas_call``'s), the operand avals and ``extra``;
    None when some value cannot be written down faithfully."""
    out: list[str] = []
    try:
        _write(out, dict(params), 0, {})
        _write(out, [_aval_text(a) for a in avals_in], 0, {})
        _write(out, list(extra), 0, {})
    except _Opaque:
        return None
    return hashlib.sha256("\x00".join(out).encode()).hexdigest()


def _aval_text(aval: Any) -> str:
    # jax writes an aval out in ~25 us, and a kernel's jaxprs repeat a few avals: kept for
    # the types whose equality covers every field their text shows (shaped arrays are
    # interned by jax; a ref's aval is its memory space and its inner aval's)
    return _kept_aval_text(aval) if type(aval) in _KEPT_TYPES else _write_aval(aval)


def _write_aval(aval: Any) -> str:
    return f"{aval}|{getattr(aval, 'weak_type', None)}|{type(aval).__name__}"


_kept_aval_text = functools.lru_cache(maxsize=4096)(_write_aval)
_KEPT_TYPES = frozenset({jc.ShapedArray, jc.AbstractRef})


def _write(out: list[str], x: Any, depth: int, seen: dict[int, int]) -> None:
    if depth > _DEPTH:
        raise _Opaque
    if x is None or isinstance(x, bool | int | float | complex | str | bytes):
        out.append(f"{type(x).__name__}:{x!r}")
    elif isinstance(x, enum.Enum):
        out.append(f"enum:{type(x).__qualname__}.{x.name}")
    elif isinstance(x, np.ndarray | np.generic):
        a = np.asarray(x)
        out.append(f"array:{a.dtype}:{a.shape}")
        out.append(a.tobytes().hex())
    elif isinstance(x, np.dtype):
        out.append(f"dtype:{x}")
    elif isinstance(x, jc.ClosedJaxpr):
        out.append("closed")
        _write(out, x.jaxpr, depth + 1, seen)
        _write(out, list(x.consts), depth + 1, seen)
    elif isinstance(x, jc.Jaxpr):
        _jaxpr(out, x, depth, seen)
    elif isinstance(x, tuple | list):
        out.append(f"{type(x).__name__}[{len(x)}]")
        for item in x:
            _write(out, item, depth + 1, seen)
    elif isinstance(x, Mapping):
        items = sorted(x.items(), key=lambda kv: repr(kv[0]))
        out.append(f"{type(x).__name__}{{{len(items)}}}")
        for k, v in items:
            _write(out, k, depth + 1, seen)
            _write(out, v, depth + 1, seen)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        out.append(f"dataclass:{type(x).__module__}.{type(x).__qualname__}")
        for f in dataclasses.fields(x):
            out.append(f.name)
            _write(out, getattr(x, f.name), depth + 1, seen)
    else:
        text = repr(x)
        if " at 0x" in text or "..." in text or " object at " in text:
            raise _Opaque
        out.append(f"{type(x).__module__}.{type(x).__qualname__}:{text}")


def _jaxpr(out: list[str], jaxpr: Any, depth: int, seen: dict[int, int]) -> None:
    """The jaxpr written out equation by equation: variables numbered, with their types;
    parameters (nested jaxprs included) as values. Not its source locations, names and
    name stacks: they are the lowered module's metadata, which only the compiler's
    messages show (and no rejection is kept under this key)."""
    if id(jaxpr) in seen:  # the same jaxpr object again: already written out, as the n-th
        out.append(f"jaxpr:again:{seen[id(jaxpr)]}")
        return
    seen[id(jaxpr)] = len(seen)
    names: dict[Any, int] = {}

    def var(v: Any) -> str:
        if isinstance(v, jc.Literal):
            return f"lit:{v.val!r}:{_aval_text(v.aval)}"
        n = names.get(v)
        if n is None:
            n = names[v] = len(names)
            return f"v{n}:{_aval_text(v.aval)}"
        return f"v{n}"

    out.append(" ".join(var(v) for v in (*jaxpr.constvars, *jaxpr.invars)))
    for eqn in jaxpr.eqns:
        # (its effects follow from these: jax prints them with the variables' ids)
        out.append(f"{eqn.primitive.name}({' '.join(var(v) for v in eqn.invars)})"
                   f"->{' '.join(var(v) for v in eqn.outvars)}")
        _write(out, eqn.params, depth + 1, seen)
    out.append(" ".join(var(v) for v in jaxpr.outvars))


class KeySet:
    """Keys known in this process and, as empty entries of palladium's disk cache
    (folder ``name``), across processes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._disk = DiskCache(name)
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def knows(self, key: str) -> bool:
        with self._lock:
            if key in self._known:
                return True
        if key not in self._disk:
            return False
        with self._lock:
            self._known.add(key)
        return True

    def add(self, key: str) -> None:
        with self._lock:
            self._known.add(key)
        self._disk.put(key, b"")

    def clear(self) -> None:
        """Forget the keys known in this process (the disk keeps its own)."""
        with self._lock:
            self._known.clear()
