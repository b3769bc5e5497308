"""Local DMAs between a source ref and a window buffer.

A thin layer over the Mosaic ``dma_start`` / ``dma_wait`` primitives that can also
signal a second semaphore when the *read* of the source completes, so an output copy
can be awaited for its read only (``output_wait_read_only``) and fenced for its write
later. jax 0.10.x's ``make_async_copy`` only offers that for remote copies.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from palladium.pipeline import _jax_compat as jc


@dataclasses.dataclass(frozen=True)
class LocalCopy:
    """A local DMA ``src -> dst`` that signals ``sem`` when written.

    ``read_sem``, when set, is also signalled once the source has been read.
    """

    src: Any
    dst: Any
    sem: Any
    read_sem: Any = None

    def _bind(self, primitive, args: tuple, **params) -> None:
        flat, tree = jc.dma_flatten(*args)
        primitive.bind(*flat, tree=tree, device_id_type=jc.DeviceIdType.MESH, **params)

    def start(self) -> None:
        """Issue the DMA."""
        self._bind(jc.dma_start_p, (self.src, self.dst, self.sem, self.read_sem, None),
                   priority=0, add=False)

    def wait(self) -> None:
        """Block until the destination has been written."""
        self._bind(jc.dma_wait_p, (self.src, self.dst, self.sem, None, None),
                   insert_dummy_device=False)

    def wait_read(self) -> None:
        """Block until the source has been read (needs ``read_sem``)."""
        assert self.read_sem is not None
        # dma_wait waits on the semaphore in the destination slot: swap the roles.
        self._bind(jc.dma_wait_p, (self.dst, self.src, self.read_sem, None, None),
                   insert_dummy_device=False)
