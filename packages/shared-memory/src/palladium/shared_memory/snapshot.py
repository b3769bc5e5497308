"""The state of a simulated launch at one moment, to inspect after a failure.

``Simulation.snapshot()`` takes one (each core's state and where it is, every buffer
with a copy of its contents up to a byte budget, every semaphore's count, the DMAs in
flight); a client adds what only it knows (the interpreter: each core's grid point).
Plain data: numpy arrays and strings, nothing that keeps the simulation alive.

>>> import numpy as np
>>> snap = Snapshot(cores=(CoreState((0, 0), "blocked", "waits for 'sem'", (1,)),),
...                 buffers=(BufferState("x", "VMEM", 0, 0, (2,), "float32", np.zeros(2)),))
>>> snap.buffer("x").tolist()
[0.0, 0.0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["BufferState", "CoreState", "DmaState", "SemaphoreState", "Snapshot", "keep_within"]


@dataclasses.dataclass(frozen=True)
class CoreState:
    """One simulated core: ``state`` is ``"failed"`` (it raised), ``"running"``,
    ``"blocked"``, ``"runnable"`` or ``"finished"``; ``where``: what it waits for or the
    last place it was seen; ``grid_point``: the grid point it was at (None: not known)."""

    core: tuple[int, int]
    state: str
    where: str = ""
    grid_point: tuple[int, ...] | None = None

    def __str__(self) -> str:
        point = "" if self.grid_point is None else f" at grid point {self.grid_point}"
        where = f": {self.where}" if self.where else ""
        return f"device {self.core[0]} core {self.core[1]}{point} {self.state}{where}"


@dataclasses.dataclass(frozen=True)
class BufferState:
    """One buffer: its name as the user gave it, where it lives, and its contents
    (``data``, a copy; None when the snapshot's byte budget left it out)."""

    name: str
    space: str
    device: int
    core: int
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray | None

    @property
    def where(self) -> str:
        return (f"{self.space}, device {self.device}" if self.space in ("HBM", "HOST")
                else f"{self.space}, device {self.device} core {self.core}")

    def __str__(self) -> str:
        kept = "" if self.data is not None else " (contents not kept: over the byte budget)"
        return f"'{self.name}' ({self.where}) {self.dtype}{list(self.shape)}{kept}"


@dataclasses.dataclass(frozen=True)
class SemaphoreState:
    """One semaphore's count (DMA semaphores count bytes)."""

    name: str
    kind: str
    device: int
    core: int
    value: int

    def __str__(self) -> str:
        return (f"{self.name} ({self.kind}, device {self.device} core {self.core}) = "
                f"{self.value}")


@dataclasses.dataclass(frozen=True)
class DmaState:
    """One DMA in flight: ``state`` is ``"started"`` (nothing copied yet) or ``"read"``
    (source read, destination not yet written)."""

    name: str
    core: tuple[int, int]
    state: str
    nbytes: int
    site: str

    def __str__(self) -> str:
        at = f" at {self.site}" if self.site else ""
        return f"{self.name} ({self.nbytes} bytes, {self.state}){at}"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The simulated state of a launch (see the module docstring)."""

    cores: tuple[CoreState, ...] = ()
    buffers: tuple[BufferState, ...] = ()
    semaphores: tuple[SemaphoreState, ...] = ()
    dmas: tuple[DmaState, ...] = ()
    title: str = ""

    def buffer(self, name: str, *, device: int | None = None, core: int | None = None,
               space: str | None = None) -> np.ndarray:
        """The contents of the one buffer called ``name`` (narrowed by ``device``,
        ``core``, ``space``); ``KeyError`` naming the candidates if not exactly one."""
        found = [b for b in self.buffers if b.name == name
                 and (device is None or b.device == device)
                 and (core is None or b.core == core)
                 and (space is None or b.space == space)]
        if len(found) != 1:
            names = sorted({f"{b.name} ({b.where})" for b in self.buffers})
            raise KeyError(
                f"{len(found)} buffers match {name!r}"
                + (" (pass device=, core= or space=)" if found else "")
                + f"; the snapshot has: {', '.join(names)}"
            )
        if found[0].data is None:
            raise KeyError(f"buffer {found[0]}: its contents were not kept")
        return found[0].data

    def semaphore(self, name: str, *, device: int = 0, core: int = 0) -> int:
        """The count of semaphore ``name`` (``'sems[1]'`` for an element) on a core."""
        for s in self.semaphores:
            if s.name in (name, f"'{name}'") and (s.device, s.core) == (device, core):
                return s.value
        raise KeyError(f"no semaphore {name!r} on device {device} core {core}")

    def summary(self) -> str:
        """A readable page: cores, DMAs in flight, semaphores, buffers."""
        lines = [self.title or "simulated state:"]
        lines.append("cores:")
        lines += [f"  {c}" for c in self.cores] or ["  (none)"]
        lines.append("DMAs in flight:")
        lines += [f"  {d}" for d in self.dmas] or ["  (none)"]
        lines.append("semaphores:")
        lines += [f"  {s}" for s in self.semaphores] or ["  (none)"]
        lines.append("buffers:")
        lines += [f"  {b}" for b in self.buffers] or ["  (none)"]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    @property
    def nbytes(self) -> int:
        """The bytes of buffer contents the snapshot keeps."""
        return sum(b.data.nbytes for b in self.buffers if b.data is not None)

    def without_contents(self) -> Snapshot:
        """The same snapshot without any buffer's contents (what a long-kept one keeps)."""
        return dataclasses.replace(
            self, buffers=tuple(dataclasses.replace(b, data=None) for b in self.buffers))


def keep_within(arrays: Iterable[tuple[Any, np.ndarray]], budget: int) -> dict[Any, np.ndarray]:
    """Copies of the arrays (by key) that fit in ``budget`` bytes together, the smallest
    first (a few big buffers are left out rather than many small ones)."""
    out: dict[Any, np.ndarray] = {}
    used = 0
    for key, array in sorted(arrays, key=lambda kv: kv[1].nbytes):
        if used + array.nbytes > budget:
            break
        out[key] = array.copy()
        used += array.nbytes
    return out
