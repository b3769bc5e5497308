"""Refs as the evaluator sees them, and how a chain of jax ref transforms resolves.

A kernel ref is a simulated buffer (``MemRef``) or an array of semaphore ids
(``SemaphoreRef``). Loads, stores and DMAs carry a chain of jax transforms (indexers,
reshape, bitcast, transpose). Leading indexers compose into one *region* of the buffer
(what the simulator and the race detector see); anything after the first reshape,
bitcast or transpose is applied with numpy to the region's data (``post`` ops).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import UnsupportedFeatureError
from palladium.shared_memory import BufferRef, MemorySpace, SemaphoreKind


@dataclasses.dataclass(frozen=True, slots=True)
class MemRef:
    """A ref to a whole simulated buffer (HBM, VMEM or SMEM)."""

    buffer: BufferRef
    #: What an access's plan depends on of this ref (``access_path.operand_key``): the
    #: buffer's shape and dtype, whether it is SMEM (never tile-padded) or host memory.
    structure: tuple[Any, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        buf = self.buffer
        object.__setattr__(self, "structure", ("m", buf.shape, buf.dtype,
                                               buf.space is MemorySpace.SMEM,
                                               buf.space is MemorySpace.HOST))

    @property
    def name(self) -> str:
        return self.buffer.name


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class SemaphoreRef:
    """A ref to an array of semaphores: their ids, kind and user-facing name."""

    ids: np.ndarray
    kind: SemaphoreKind
    name: str
    #: What a DMA's plan depends on of this ref: the shape of the semaphore array.
    structure: tuple[Any, ...] = dataclasses.field(init=False, repr=False)
    #: ``ids`` flattened to Python ints, made on first use (``id_at``).
    _flat: list[int] | None = dataclasses.field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "structure", ("s", self.ids.shape))

    def id_at(self, position: int) -> int:
        """The id at flat ``position`` of ``ids`` (a DMA's semaphore, once per DMA: a
        list of ints made once instead of a numpy flat iterator and scalar per call)."""
        flat = self._flat
        if flat is None:
            flat = self.ids.ravel().tolist()
            object.__setattr__(self, "_flat", flat)
        return flat[position]  # type: ignore[no-any-return]

    def index(self, transforms: Sequence[Any]) -> SemaphoreRef:
        ids = self.ids
        for t in transforms:
            if not isinstance(t, jc.NDIndexer):
                raise UnsupportedFeatureError(
                    f"semaphore ref '{self.name}': transform {type(t).__name__} is not supported"
                )
            ids = ids[tuple(_numpy_index(i) for i in t.indices)]
        return SemaphoreRef(np.asarray(ids), self.kind, self.name)

    def scalar_id(self) -> int:
        if self.ids.shape != ():
            raise UnsupportedFeatureError(
                f"semaphore ref '{self.name}' of shape {self.ids.shape} used where one "
                "semaphore is expected; index it (sems.at[i])"
            )
        return int(self.ids)


def as_int(x: Any, what: str) -> int:
    a = np.asarray(x)
    if a.shape != ():
        raise UnsupportedFeatureError(
            f"{what}: array-valued (gather-style) indexers of refs are not supported on TPU"
        )
    return int(a)


def _numpy_index(i: Any) -> int | slice:
    if isinstance(i, jc.Slice):
        return numpy_slice(as_int(i.start, "ref indexer"), as_int(i.size, "ref indexer"),
                           int(i.stride))
    return as_int(i, "ref indexer")


def numpy_slice(start: int, size: int, stride: int) -> slice:
    """The numpy slice of a ``pl.ds(start, size, stride)``."""
    return slice(start, start + (size - 1) * stride + 1 if size else start, stride)


# --- numpy ops applied after the region is read --------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Index:
    index: tuple[int | slice, ...]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x[self.index]


@dataclasses.dataclass(frozen=True, slots=True)
class _Reshape:
    shape: tuple[int, ...]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.shape)


@dataclasses.dataclass(frozen=True, slots=True)
class _Transpose:
    permutation: tuple[int, ...]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x.transpose(self.permutation)


@dataclasses.dataclass(frozen=True, slots=True)
class Bitcast:
    dtype: np.dtype

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return tpu_bitcast(x, self.dtype)


def _bitcast_convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``lax.bitcast_convert_type`` in numpy: a narrower type adds a minor dimension of
    the ratio, a wider one takes it away."""
    y = np.ascontiguousarray(x).view(dtype)
    if x.dtype.itemsize > dtype.itemsize:
        return y.reshape(*x.shape, x.dtype.itemsize // dtype.itemsize)
    return y.reshape(x.shape[:-1]) if x.dtype.itemsize < dtype.itemsize else y


def tpu_bitcast(x: Any, dtype: Any, convert: Any = _bitcast_convert) -> Any:
    """TPU bitcast: a change of bit width scales the second-minor dimension.

    Narrowing 32 -> 16 bits turns rows ``i`` into rows ``2i, 2i+1`` (low half first);
    widening packs them back. Same-width bitcasts are plain reinterpretations. The
    traced evaluator's is this one with ``convert=lax.bitcast_convert_type``.
    """
    dtype = np.dtype(dtype)
    xb, yb = np.dtype(x.dtype).itemsize, dtype.itemsize
    if xb == yb:
        return convert(x, dtype)
    if x.ndim < 2:
        raise UnsupportedFeatureError("bitcast of a rank-1 ref with a bit width change")
    *lead, n, m = x.shape
    if xb < yb:
        r = yb // xb
        return convert(x.reshape(*lead, n // r, r, m).swapaxes(-1, -2), dtype)
    r = xb // yb
    return convert(x, dtype).swapaxes(-1, -2).reshape(*lead, n * r, m)


@dataclasses.dataclass(frozen=True, slots=True)
class Access:
    """A resolved ref access: a region of the buffer, then numpy ops on its data."""

    region: tuple[int | slice, ...]
    region_shape: tuple[int, ...]
    post: tuple[Any, ...]

    def apply(self, data: np.ndarray) -> np.ndarray:
        for op in self.post:
            data = op(data)
        return data

    def positions(self) -> np.ndarray:
        """For each element of the final view, its flat position within the region."""
        idx = np.arange(math.prod(self.region_shape)).reshape(self.region_shape)
        for op in self.post:
            if isinstance(op, Bitcast):
                raise AssertionError("positions() through a bitcast")
            idx = op(idx)
        return idx

    def region_mask(self, mask: Any = None) -> np.ndarray:
        """Which elements of the region the view covers (only where ``mask``, of the
        view's shape, is True), as a bool array of the region's shape."""
        positions = self.positions()
        covered = np.zeros(math.prod(self.region_shape), dtype=bool)
        if mask is None:
            covered[positions.ravel()] = True
        else:
            covered[positions[np.broadcast_to(np.asarray(mask, dtype=bool), positions.shape)]] = True
        return covered.reshape(self.region_shape)


def split_chain(transforms: Sequence[Any], dtype: Any) -> tuple[np.dtype | None, list[Any], list[Any]]:
    """A ref's transform chain as (the in-place cast, the region's indexers, the rest),
    for the simulator (:func:`resolve`) and the traced evaluator alike. A bitcast to a
    type of the same width before any other reshape, transpose or bitcast reinterprets
    each element in place (the cast: the dtype after it; None without one): indexers
    after it still narrow the region, so the race detector and the bounds check see only
    the elements read. From the first other transform on, the rest applies to the
    region's data."""
    cur, cast, region = np.dtype(dtype), None, []
    for i, t in enumerate(transforms):
        if isinstance(t, jc.BitcastTransform) and np.dtype(t.dtype).itemsize == cur.itemsize:
            cur = cast = np.dtype(t.dtype)
        elif isinstance(t, jc.NDIndexer):
            region.append(t)
        else:
            return cast, region, list(transforms[i:])
    return cast, region, []


def resolve(shape: tuple[int, ...], dtype: np.dtype, transforms: Sequence[Any], name: str) -> Access:
    """Compose ``transforms`` applied to a buffer of ``shape`` into an ``Access``."""
    cast, region_transforms, rest = split_chain(transforms, dtype)
    # Per base dimension: an int (dropped) or [start, step, size].
    dims: list[Any] = [[0, 1, n] for n in shape]
    for t in region_transforms:
        index = tuple(_numpy_index(i) for i in t.indices)
        if len(index) != sum(not isinstance(d, int) for d in dims):
            raise UnsupportedFeatureError(f"ref '{name}': indexer rank mismatch")
        dims = indexed_dims(dims, index)
    post: list[Any] = [] if cast is None or cast == np.dtype(dtype) else [Bitcast(cast)]
    for t in rest:
        if isinstance(t, jc.NDIndexer):
            post.append(_Index(tuple(_numpy_index(i) for i in t.indices)))
        elif isinstance(t, jc.ReshapeTransform):
            post.append(_Reshape(tuple(int(s) for s in t.shape)))
        elif isinstance(t, jc.TransposeTransform):
            post.append(_Transpose(tuple(t.permutation)))
        elif isinstance(t, jc.BitcastTransform):
            post.append(Bitcast(np.dtype(t.dtype)))
        else:
            raise UnsupportedFeatureError(
                f"ref '{name}': transform {type(t).__name__} is not supported by the interpreter"
            )
    region, region_shape = dims_region(dims)
    return Access(region, region_shape, tuple(post))


def indexed_dims(dims: list[Any], index: tuple[int | slice, ...]) -> list[Any]:
    """``dims`` (per base dimension: an int, dropped, or [start, step, size]) narrowed by
    one indexer's ``index`` (numpy ints and slices, one per dimension not dropped)."""
    it = iter(index)
    new_dims: list[Any] = []
    for d in dims:
        if isinstance(d, int):
            new_dims.append(d)
            continue
        i = next(it)
        start, step, _ = d
        if isinstance(i, int):
            new_dims.append(start + i * step)
        else:
            size = len(range(i.start, i.stop, i.step))
            new_dims.append([start + i.start * step, step * i.step, size])
    return new_dims


def dims_region(dims: list[Any]) -> tuple[tuple[int | slice, ...], tuple[int, ...]]:
    """The region ``dims`` select of their buffer, and its shape."""
    region: list[int | slice] = []
    region_shape: list[int] = []
    for d in dims:
        if isinstance(d, int):
            region.append(d)
        else:
            start, step, size = d
            region.append(numpy_slice(start, size, step))
            region_shape.append(size)
    return tuple(region), tuple(region_shape)


class RefView:
    """A ref with transforms as a plugin's evaluation passes it (``traced_rule.py``): the
    base ref, the index values of its transforms and their structure, kept flat so that
    a load or store composes them without building jax's transform objects;
    ``transforms`` builds them (for DMAs and the rules that take a ``TransformedRef``)."""

    __slots__ = ("leaves", "ref", "tree")
    ref: Any
    leaves: tuple[Any, ...]
    tree: Any

    def __init__(self, ref: Any, leaves: tuple[Any, ...], tree: Any) -> None:
        if isinstance(ref, RefView):  # a view of a view: one view of the base
            leaves = (*ref.leaves, *leaves)
            tree = jax.tree_util.treedef_tuple(
                [*jax.tree_util.treedef_children(ref.tree), *jax.tree_util.treedef_children(tree)])
            ref = ref.ref
        self.ref, self.leaves, self.tree = ref, leaves, tree

    @property
    def transforms(self) -> tuple[Any, ...]:
        return tuple(self.tree.unflatten(self.leaves))


def split_transformed(value: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(ref, transforms)`` of a possibly transformed ref from an unflattened tree (a
    ref with transforms around a ref with transforms, as an evaluation declared by a
    plugin makes them, gives the inner ones first)."""
    if not isinstance(value, jc.TransformedRef | RefView):
        return value, ()
    transforms = tuple(value.transforms)
    value = value.ref
    while isinstance(value, jc.TransformedRef | RefView):
        transforms = (*value.transforms, *transforms)
        value = value.ref
    return value, transforms
