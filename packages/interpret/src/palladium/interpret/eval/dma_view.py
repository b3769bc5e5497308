"""DMAs through reshaped, transposed or bitcast refs, mapped onto buffer regions.

A ref transform chain resolves to a rectangular region of the buffer plus numpy ops on
its data (``Access.post``). The simulator copies region to region; when either side has
ops, the DMA gets a ``DmaView``: the source region elements it reads (a mask, so the race
detector and the bounds check see exactly those), a conversion of the source region's
data into the destination region's data (the source ops, then the inverse of the
destination ops), and the destination region elements it writes (a mask).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from palladium.interpret.errors import KernelError, UnsupportedFeatureError
from palladium.interpret.eval.refs import Access, Bitcast, tpu_bitcast
from palladium.shared_memory import DmaView


def view_of(acc: Access, dtype: np.dtype) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype the kernel sees through ``acc`` of a ``dtype`` buffer."""
    view = acc.apply(np.zeros(acc.region_shape, dtype)) if acc.post else None
    if view is None:
        return acc.region_shape, np.dtype(dtype)
    return view.shape, view.dtype


def view_nbytes(acc: Access, dtype: np.dtype) -> int:
    """The bytes a DMA of the view through ``acc`` moves."""
    shape, vdtype = view_of(acc, dtype)
    return int(np.prod(shape, dtype=np.int64)) * vdtype.itemsize


def _has_bitcast(acc: Access) -> bool:
    return any(isinstance(op, Bitcast) for op in acc.post)


def _region_mask(acc: Access) -> np.ndarray | None:
    """The region elements the view through ``acc`` covers (None: all of them)."""
    if not acc.post or _has_bitcast(acc):
        return None
    mask = acc.region_mask()
    return None if mask.all() else mask


def _scatter(acc: Access, dtype: np.dtype, name: str, site: object) -> Callable[[np.ndarray], np.ndarray]:
    """A function from view values to the region's data (elements outside the view: 0)."""
    post = acc.post
    if not _has_bitcast(acc):
        positions = acc.positions().ravel()

        def plain(values: np.ndarray) -> np.ndarray:
            flat = np.zeros(int(np.prod(acc.region_shape, dtype=np.int64)), dtype)
            flat[positions] = np.asarray(values).ravel()
            return flat.reshape(acc.region_shape)

        return plain
    if not isinstance(post[0], Bitcast) or any(isinstance(p, Bitcast) for p in post[1:]):
        raise UnsupportedFeatureError(
            f"DMA destination '{name}' is a reshape followed by a bitcast, or two bitcasts; "
            f"the interpreter writes a bitcast destination only when the bitcast comes first "
            f"({site})"
        )
    cast_shape = tpu_bitcast(np.zeros(acc.region_shape, dtype), post[0].dtype).shape
    rest = Access(acc.region, cast_shape, post[1:])
    positions = rest.positions().ravel()
    if np.unique(positions).size != int(np.prod(cast_shape, dtype=np.int64)):
        raise UnsupportedFeatureError(
            f"DMA destination '{name}' is bitcast and then indexed: the DMA would write part "
            f"of the bitcast words ({site})"
        )

    def through_bitcast(values: np.ndarray) -> np.ndarray:
        flat = np.empty(positions.size, post[0].dtype)
        flat[positions] = np.asarray(values).ravel()
        return tpu_bitcast(flat.reshape(cast_shape), dtype)

    return through_bitcast


def dma_view(
    src: tuple[Access, np.dtype, str], dst: tuple[Access, np.dtype, str], site: object
) -> DmaView | None:
    """The ``DmaView`` of a DMA between two accesses (None if both are plain regions).

    ``src``/``dst`` are ``(access, buffer dtype, ref name)``.
    """
    (src_acc, src_dtype, src_name), (dst_acc, dst_dtype, dst_name) = src, dst
    if not src_acc.post and not dst_acc.post:
        return None
    src_view = view_of(src_acc, src_dtype)
    dst_view = view_of(dst_acc, dst_dtype)
    if src_view != dst_view:
        raise KernelError(
            f"DMA from '{src_name}' (a {src_view[1]}{list(src_view[0])} view) to "
            f"'{dst_name}' (a {dst_view[1]}{list(dst_view[0])} view): the shapes or dtypes "
            f"differ ({site})"
        )
    write = _scatter(dst_acc, np.dtype(dst_dtype), dst_name, site)

    def convert(data: np.ndarray) -> np.ndarray:
        return write(src_acc.apply(np.asarray(data)))

    return DmaView(src_mask=_region_mask(src_acc), dst_mask=_region_mask(dst_acc), convert=convert)
