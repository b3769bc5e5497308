"""The arrays that hold a launch's HBM outputs: one block per output for all devices,
kept for the kernel's next launch.

A multi-device launch allocates each output once per device (256 devices' all-gather:
256 buffers of 1 MiB). Allocated one by one, each is a fresh allocation the C library
takes from the OS a 4 KiB page fault at a time and returns at the end of the launch
(65,536 faults per launch there, 0.1-0.9 s of system time, varying from launch to
launch). Here the devices' buffers of one output are slices of ONE array, and that array
is kept with the kernel (while the kernel lives, at most ``KEPT`` per output shape) and
handed to its next launch once nothing refers to it any more: no fault at all after the
first launch. The simulation fills every buffer with the uninitialised value as it fills
a new one (``Simulation.allocate(storage=)``), so a launch cannot tell a kept block from
a new one.

"Nothing refers to it" is exact: the simulated buffers, the launch's results and every
view of them hold a reference to the block (numpy's ``base``), so a block is reused only
when its reference count is what the keeping list alone gives. A caller still holding a
result of the previous launch (a ``dma_order_trials`` comparison, an exception's state)
keeps its block: the launch then takes another one.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import numpy as np

from palladium.interpret.state.process_state import STATE

__all__ = ["KEPT", "kept_blocks", "output_storage"]

KEPT = 2  # blocks kept per kernel and output shape (a launch and one still referred to)

_LOCK = threading.Lock()
# kernel -> {(devices, shape, dtype): [blocks]}; a kernel's blocks go with the kernel.
_BLOCKS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], list[np.ndarray]]] = STATE.keep(
    "output_blocks", weakref.WeakKeyDictionary(), owner=__name__,
    holds="output buffers of finished launches for the next ones, kept weakly by the kernel")


def _count(kept: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(kept[i])


# The count of an array referred to by a list only, taken the way ``output_storage``
# takes it (so whatever the interpreter adds for the call is in both).
_ALONE = _count([np.empty(0)], 0)


def output_storage(kernel: Any, shape: tuple[int, ...], dtype: Any,
                   count: int) -> list[np.ndarray]:
    """``count`` writable arrays of ``shape`` and ``dtype`` (one per device) for an output
    of ``kernel``'s launch: for two or more, slices of one block kept for the kernel's
    next launch (see the module docstring). Their contents are undefined: the caller
    fills them."""
    if count == 1:  # a single device's launch: its own array, as before
        return [np.empty(shape, dtype)]
    key = (count, tuple(shape), np.dtype(dtype))
    with _LOCK:
        kept = _BLOCKS.setdefault(kernel, {}).setdefault(key, [])
        for i in range(len(kept)):
            if _count(kept, i) == _ALONE:
                block = kept[i]
                break
        else:
            block = np.empty((count, *shape), dtype)
            if len(kept) < KEPT:
                kept.append(block)
    return [block[d, ...] for d in range(count)]


def kept_blocks(kernel: Any) -> int:
    """How many blocks are kept for ``kernel`` (for tests)."""
    with _LOCK:
        return sum(len(v) for v in _BLOCKS.get(kernel, {}).values())
