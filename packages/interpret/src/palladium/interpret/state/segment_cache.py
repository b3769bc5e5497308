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

import atexit
import collections
import functools
import hashlib
import pickle
import queue
import threading
from collections.abc import Callable
from typing import Any

from palladium.interpret.state.disk_cache import DiskCache
from palladium.interpret.state.environment import host_digest

__all__ = ["EXECUTABLES", "RUNNING_WAIT", "BackgroundCompile", "SegmentExecutables"]

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
        self._jobs: queue.SimpleQueue[Any] | None = None  # the background compiler's
        self._stopping = False

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


    def get_in_background(self, text: str | None, compile_fn: Callable[[], Any]
                          ) -> BackgroundCompile:
        """``get(text, compile_fn)`` for the background compiler's thread (one daemon
        thread, started on first use: one compile at a time beside the launches); the
        job, whose ``result()`` runs it in the caller's thread if the background thread
        has not started it yet. ``text`` None: ``compile_fn()``, kept by the caller only."""
        job = BackgroundCompile(
            compile_fn if text is None else functools.partial(self.get, text, compile_fn))
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                worker = threading.Thread(target=self._compile_jobs, args=(self._jobs,),
                                          daemon=True, name="palladium-segment-compiler")
                worker.start()
                atexit.register(self._stop, self._jobs, worker)
            self._jobs.put(job)
        return job

    def _stop(self, jobs: queue.SimpleQueue[Any], worker: threading.Thread) -> None:
        """At exit: drop the compiles not started, let the running one finish (XLA must
        not be mid-compile while the interpreter tears down)."""
        self._stopping = True
        jobs.put(None)
        worker.join(timeout=30)

    def _compile_jobs(self, jobs: queue.SimpleQueue[Any]) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            if not self._stopping:
                job.run()


#: Seconds a caller waits for a compile the background thread is running before it
#: compiles the same executable itself (a compile takes ~0.1-2 s; this bounds a compile
#: that never ends, e.g. one waiting for a lock the caller holds).
RUNNING_WAIT = 60.0


class BackgroundCompile:
    """A compile queued for the background thread, run by whoever needs it first.

    A hot launch (or segment) that finds its compile still queued behind others' runs
    it at once in its own thread, instead of waiting for the shared thread to reach it:
    it never waits for another kernel's compile, and whether it runs compiled never
    depends on the machine's load (with 10 threads and one shared compiler, third
    calls waited up to 60 s and then ran simulated). A compile already running is
    waited for (it is this call's own), at most ``RUNNING_WAIT`` seconds, after which
    the caller compiles the same executable itself.
    """

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn: Callable[[], Any] | None = fn
        self._lock = threading.Lock()
        self._claimed = False
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    @classmethod
    def finished(cls, value: Any) -> BackgroundCompile:
        """A job whose result is ``value`` (nothing to compile)."""
        job = cls(lambda: value)
        job.run()
        return job

    def done(self) -> bool:
        return self._done.is_set()

    def run(self) -> None:
        """Run the compile here, unless someone else has started it."""
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
        fn = self._fn
        try:
            assert fn is not None
            self._value = fn()
        except BaseException as e:  # noqa: BLE001 - whoever asks for the result gets it
            self._error = e
        finally:
            self._done.set()
            self._fn = None  # (what it compiled from: a launch's grid points, ...)

    def result(self) -> Any:
        """The compile's result (or its exception): run here if not started yet."""
        fn = self._fn
        self.run()
        if not self._done.wait(RUNNING_WAIT):
            assert fn is not None  # (not done yet: not dropped)
            return fn()
        if self._error is not None:
            raise self._error
        return self._value


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
