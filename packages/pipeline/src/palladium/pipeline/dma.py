"""Local DMAs between a source ref and a window buffer (Mosaic ``dma_start``/``dma_wait``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from palladium.pipeline import _jax_compat as jc


@dataclasses.dataclass(frozen=True)
class LocalCopy:
    """A local DMA ``src -> dst`` that signals ``sem`` when the destination is written."""

    src: Any
    dst: Any
    sem: Any

    def _bind(self, primitive, **params) -> None:
        flat, tree = jc.dma_flatten(self.src, self.dst, self.sem, None, None)
        primitive.bind(*flat, tree=tree, device_id_type=jc.DeviceIdType.MESH, **params)

    def start(self) -> None:
        """Issue the DMA."""
        self._bind(jc.dma_start_p, priority=0, add=False)

    def wait(self) -> None:
        """Block until the destination has been written."""
        self._bind(jc.dma_wait_p, **jc.DMA_WAIT_PARAMS)
