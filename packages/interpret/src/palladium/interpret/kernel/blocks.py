"""Block specs of a ``pallas_call``: which region of an operand a grid point sees."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import KernelError, UnsupportedFeatureError
from palladium.shared_memory import MemorySpace


def memory_space_of(space: Any) -> MemorySpace | str:
    """Map a jax/Pallas memory space to the simulator's (or "semaphore")."""
    if space is jc.SEMAPHORE:
        return "semaphore"
    if space is jc.ANY or space is jc.HBM:
        return MemorySpace.HBM
    if space is not None and space is jc.HOST:
        return MemorySpace.HOST
    if space is jc.SMEM:
        return MemorySpace.SMEM
    return MemorySpace.VMEM


@dataclasses.dataclass(frozen=True)
class BlockDim:
    """One dimension of a block: ``kind`` is "blocked", "element", "bounded" or "squeezed".

    A "bounded" dimension (``pl.BoundedSlice``) takes two index-map outputs, the start
    and the size (<= ``size``) of a ``pl.ds``: that many elements are copied, into the
    start of the block.

    ``pad``: an element dimension's ``(low, high)`` padding: the kernel sees the array
    with ``low`` uninitialised elements before and ``high`` after it, and its index map
    returns offsets into that padded array.
    """

    kind: str
    size: int
    pad: tuple[int, int] = (0, 0)

    def start(self, index: int) -> int:
        return index * self.size if self.kind == "blocked" else index


def _block_dim(bd: Any, name: str) -> BlockDim:
    if isinstance(bd, jc.Squeezed) or bd is None:
        return BlockDim("squeezed", 1)
    if isinstance(bd, jc.Blocked):
        return BlockDim("blocked", int(bd.block_size))
    if jc.BoundedSlice is not None and isinstance(bd, jc.BoundedSlice):
        return BlockDim("bounded", int(bd.block_size))
    if isinstance(bd, jc.Element):
        low, high = (int(p) for p in bd.padding)
        return BlockDim("element", int(bd.block_size), (low, high))
    raise UnsupportedFeatureError(
        f"operand '{name}': block dimension {bd!r} ({type(bd).__name__}) is not supported"
    )


@dataclasses.dataclass(frozen=True)
class BlockSpecInfo:
    """How one pallas_call operand is blocked, from its ``BlockMapping``."""

    name: str
    dims: tuple[BlockDim, ...]
    array_shape: tuple[int, ...]
    dtype: np.dtype
    space: Any  # simulator MemorySpace of the kernel's ref
    index_map: Any  # ClosedJaxpr: (*grid indices, *scalar prefetch refs) -> block indices
    index_tree: Any = None  # the index map's output tree (a pl.ds of a BoundedSlice dim)
    buffer_count: int = 2  # pipeline buffers on a TPU (``pipeline_mode=pl.Buffered(n)``)

    @classmethod
    def from_mapping(cls, bm: Any, name: str) -> BlockSpecInfo:
        return cls(
            name=name,
            dims=tuple(_block_dim(bd, name) for bd in bm.block_shape),
            array_shape=tuple(int(s) for s in bm.array_aval.shape),
            dtype=np.dtype(bm.array_aval.dtype),
            space=memory_space_of(bm.transformed_block_aval.memory_space),
            index_map=bm.index_map_jaxpr,
            index_tree=getattr(bm, "index_map_out_tree", None),
            buffer_count=_buffer_count(bm),
        )

    @property
    def in_hbm(self) -> bool:
        """Whether the kernel gets the operand's whole array where it lives (HBM, or the
        host's memory for ``pl.HOST``) instead of blocks copied to VMEM/SMEM."""
        return self.space == MemorySpace.HBM or self.space == MemorySpace.HOST

    @property
    def dynamic(self) -> bool:
        """Whether the index map's block index depends on the grid or scalar-prefetch
        values (each grid step computes it and checks it against the last step's)."""
        jaxpr = getattr(self.index_map, "jaxpr", self.index_map)
        outs = getattr(jaxpr, "outvars", ())
        return any(not hasattr(v, "val") for v in outs)

    @property
    def reads_table(self) -> bool:
        """Whether the index map reads a scalar-prefetch ref (a table in SMEM: splash's
        ``data_next[h, i, j]``, gmm's group offsets) to find its block."""
        jaxpr = getattr(self.index_map, "jaxpr", self.index_map)
        return any(e.primitive is jc.get_p for e in getattr(jaxpr, "eqns", ()))

    @property
    def strided(self) -> bool:
        """Whether a block is pieces of the array rather than one run of it: a dimension
        it takes only part of, with a dimension of more than one element before it (a
        (128, 128) block of a (2048, 2048) array; not a (1, 1, 128, 128) one of a
        (1, 4, 2048, 128) array)."""
        sizes = [1 if d.kind == "squeezed" else d.size for d in self.dims]
        partial = [i for i, (b, n) in enumerate(zip(sizes, self.array_shape)) if b < n]
        return bool(partial) and any(b > 1 for b in sizes[:partial[-1]])

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The shape of the kernel's ref (squeezed dimensions dropped)."""
        return tuple(d.size for d in self.dims if d.kind != "squeezed")

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """The array shape rounded up to whole blocks (ragged last blocks stay in bounds)
        and widened by ``pl.Element`` padding."""
        if self.in_hbm:
            return self.array_shape
        return tuple(
            math.ceil(n / d.size) * d.size if d.kind == "blocked" and d.size else n + sum(d.pad)
            for n, d in zip(self.array_shape, self.dims)
        )

    def array_region(self, shape: tuple[int, ...]) -> tuple[slice, ...]:
        """Where an array of ``shape`` (this operand's) lies in its padded HBM buffer."""
        lows = [0] * len(shape) if self.in_hbm else [d.pad[0] for d in self.dims]
        return tuple(slice(lo, lo + n) for lo, n in zip(lows, shape))

    @property
    def has_element_padding(self) -> bool:
        """Whether a ``pl.Element`` dimension of this operand is padded."""
        return not self.in_hbm and any(d.pad != (0, 0) for d in self.dims)

    def region(self, block_indices: tuple[int, ...]) -> tuple[int | slice, ...]:
        """The region of the (padded) array that block ``block_indices`` covers."""
        out: list[int | slice] = []
        for d, i in zip(self.dims, self._per_dim(block_indices)):
            if d.kind == "squeezed":
                out.append(i)
            elif d.kind == "bounded":
                start, size = i
                out.append(slice(start, start + self._bounded_size(size, d)))
            else:
                start = d.start(i)
                out.append(slice(start, start + d.size))
        return tuple(out)

    def block_region(self, block_indices: tuple[int, ...]) -> tuple[slice, ...] | None:
        """The part of the kernel's block that block ``block_indices`` fills (None: all;
        only ``pl.BoundedSlice`` dimensions fill less)."""
        if all(d.kind != "bounded" for d in self.dims):
            return None
        out: list[slice] = []
        for d, i in zip(self.dims, self._per_dim(block_indices)):
            if d.kind == "bounded":
                out.append(slice(0, self._bounded_size(i[1], d)))
            elif d.kind != "squeezed":
                out.append(slice(0, d.size))
        return tuple(out)

    def _per_dim(self, block_indices: tuple[int, ...]) -> list[Any]:
        """Per dimension: the block index, or (start, size) of a bounded dimension."""
        if all(d.kind != "bounded" for d in self.dims):
            return [int(i) for i in block_indices]
        out: list[Any] = []
        for d, v in zip(self.dims, self.index_tree.unflatten(block_indices)):
            out.append((int(v.start), int(v.size)) if d.kind == "bounded" else int(v))
        return out

    def _bounded_size(self, size: int, d: BlockDim) -> int:
        if not 0 <= size <= d.size:
            raise KernelError(
                f"operand '{self.name}': the index map's pl.ds size {size} does not fit "
                f"pl.BoundedSlice({d.size})"
            )
        return size


def _buffer_count(bm: Any) -> int:
    """The operand's pipeline buffer count: ``pl.Buffered(n)``'s n, else 2 (Mosaic's
    default double buffering)."""
    count = getattr(getattr(bm, "pipeline_mode", None), "buffer_count", None)
    return int(count) if isinstance(count, int) and count >= 1 else 2
