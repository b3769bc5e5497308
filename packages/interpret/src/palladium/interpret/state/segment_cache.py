"""Compiled segments kept across launches and processes.

A segment's executable (``segments.py``) is keyed by the text of its equations (shapes,
dtypes, parameters and literals included) and ``state.environment.host_digest`` (the
versions, a digest of palladium's source, the flags and the host CPU: an executable
holds the host's instructions): in memory for the process (``STATE.segments``: a kernel traced
again after ``jax.clear_caches()`` finds its segments compiled) and in palladium's
disk cache (``state.disk_cache``, folder ``executables``: a new process loads one in
~10 ms instead of compiling it in ~0.2-0.5 s). Whether a segment is compiled never
depends on this cache, only how long compiling takes: results are the same with a cold
cache or a warm one.

On disk an executable is jax's serialized form (``serialize_executable``, a pickle), in
an entry signed with the user's cache secret: it is unpickled only after its signature
and key verified, and loaded onto this process's own first CPU device (under
``jax.distributed``, ``jax.devices("cpu")[0]`` is process 0's).
"""

from __future__ import annotations

import collections
import hashlib
import pickle
import threading
from collections.abc import Callable
from typing import Any

from palladium.interpret.state.disk_cache import DiskCache
from palladium.interpret.state.environment import host_digest

__all__ = ["EXECUTABLES", "SegmentExecutables"]

_MEMORY_LIMIT = 1024
_FORMAT = 2
#: Compiled segments' and whole launches' executables on disk.
EXECUTABLES = DiskCache("executables")


def _local_device() -> Any:
    """The device this process's executables run on: its own first CPU device (under
    ``jax.distributed``, ``jax.devices("cpu")[0]`` is process 0's)."""
    import jax

    return jax.local_devices(backend="cpu")[0]


class SegmentExecutables:
    """Compiled segments by key, in memory (bounded) and on disk."""

    def __init__(self) -> None:
        self._memory: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # compiled in this process (the rest came from a cache)

    def __len__(self) -> int:
        return len(self._memory)

    def clear(self) -> None:
        """Forget the executables kept in memory (the disk cache stays)."""
        with self._lock:
            self._memory.clear()

    def get(self, text: str, compile_fn: Callable[[], Any]) -> Any:
        """The executable of the segment whose key text is ``text``: kept, loaded from
        disk, or ``compile_fn()`` (then kept and written to disk)."""
        # (an executable names the device it was compiled for: under jax.distributed
        # each process's first CPU device is another, and needs its own)
        key = hashlib.sha256(
            f"format={_FORMAT}\n{host_digest()}\ndevice={_local_device().id}\n{text}".encode()
        ).hexdigest()
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self._memory.move_to_end(key)
                return hit
        exe = _load(key)
        if exe is _NOTHING:  # compile_fn gave None for this key before
            exe = None
        elif exe is None:
            exe = compile_fn()
            self.compiled += 1
            _store(key, exe)
        with self._lock:
            self._memory[key] = exe
            if len(self._memory) > _MEMORY_LIMIT:
                self._memory.popitem(last=False)
        return exe


#: What a key whose ``compile_fn`` gave None (not compiled: e.g. a launch a compiled
#: launch does not model) holds on disk, so that later processes do not try again.
_NOTHING_BYTES = b"palladium: nothing compiled\n"
_NOTHING = object()


def _load(key: str) -> Any:
    """The executable kept under ``key``, ``_NOTHING``, or None (not on disk)."""
    from jax.experimental.serialize_executable import deserialize_and_load

    data = EXECUTABLES.get(key)  # (verified: what this user's palladium wrote, for key)
    if data is None:
        return None
    if data == _NOTHING_BYTES:
        return _NOTHING
    try:
        payload, in_tree, out_tree = pickle.loads(data)
        return deserialize_and_load(payload, in_tree, out_tree,
                                    execution_devices=[_local_device()])
    except Exception:  # noqa: BLE001 - stale (another jaxlib's): compile it again
        return None


def _store(key: str, exe: Any) -> None:
    from jax.experimental.serialize_executable import serialize

    try:
        data = _NOTHING_BYTES if exe is None else pickle.dumps(serialize(exe))
    except Exception:  # noqa: BLE001 - not serializable: kept in memory only
        return
    EXECUTABLES.put(key, data)
