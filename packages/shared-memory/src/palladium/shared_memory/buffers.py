"""Buffers: HBM per device, VMEM and SMEM per core; reads, writes and swaps of regions.

A buffer stores its *logical* shape only. Its *bound* shape is the logical shape, or the
tile-padded one when the simulation uses ``bounds="padded"`` (never for SMEM): elements
between the two are tile padding, which always reads as uninitialised memory and
silently drops writes, like the reference interpreter. An access beyond the bound shape
raises :class:`OutOfBoundsError` (writes always; reads unless the policy is
``"uninitialized"``, which reads the fill value there instead).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np

from palladium.shared_memory.errors import ConfigError, OutOfBoundsError, at_site, core_name
from palladium.shared_memory.regions import AccessPlan, describe_region, resolve

__all__ = ["Buffer", "BufferRef", "MemorySpace", "is_float_dtype"]

_ELLIPSIS = (Ellipsis,)


# The advice appended to an out-of-bounds read error; a client (the interpreter) passes
# its own wording, naming its own option.
OUT_OF_BOUNDS_HINT = "Pass out_of_bounds='uninitialized' to read uninitialised values there."


class MemorySpace(enum.Enum):
    """Where a buffer lives: HBM or the host's memory (per device, shared by its cores),
    VMEM or SMEM (per core)."""

    HBM = "HBM"
    VMEM = "VMEM"
    SMEM = "SMEM"
    HOST = "HOST"

    @property
    def per_device(self) -> bool:
        """Whether a buffer of this space belongs to the device (HBM, host memory)
        rather than to one core."""
        return self in _PER_DEVICE


#: (a tuple: ``in`` compares by identity first, and an enum member's hash is Python code)
_PER_DEVICE = (MemorySpace.HBM, MemorySpace.HOST)


@dataclasses.dataclass(frozen=True)
class BufferRef:
    """A handle to an allocated buffer. ``core`` is 0 for HBM (shared by the device)."""

    key: int
    space: MemorySpace
    device: int
    core: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def label(self) -> str:
        """``'x' (VMEM, device 0 core 1)``: the buffer as messages name it."""
        return f"'{self.name}' ({self.where})"

    @property
    def where(self) -> str:
        """``HBM, device 1`` or ``VMEM, device 0 core 1``."""
        if self.space.per_device:
            return f"{self.space.value}, device {self.device}"
        return f"{self.space.value}, device {self.device} core {self.core}"


def is_float_dtype(dtype: np.dtype) -> bool:
    """Floating point, ml_dtypes' (bfloat16, float8_*) included."""
    return dtype.kind == "f" or (dtype.kind == "V" and "float" in dtype.name)


def outside_mask(plan: AccessPlan, mask: Any) -> np.ndarray:
    """The True elements of ``mask`` that lie outside the bounds of ``plan``."""
    outside = np.broadcast_to(np.asarray(mask, dtype=bool), plan.shape).copy()
    if plan.box is not None:
        outside[plan.box] = False
    return outside


def stored_mask(plan: AccessPlan, mask: Any) -> np.ndarray:
    """``mask`` restricted to the stored part of ``plan`` (what the race detector sees)."""
    mask = np.broadcast_to(np.asarray(mask, dtype=bool), plan.shape)
    return mask if plan.full else mask[plan.pos]


class Buffer:
    """The storage and bounds of one allocation (owned by a ``Simulation``)."""

    __slots__ = ("bound", "data", "fill", "logical", "oob_hint", "phantom", "private", "quiet",
                 "read_only", "ref", "refcount", "taint", "written", "clean")

    def __init__(self, ref: BufferRef, data: np.ndarray, bound: tuple[int, ...], fill: Any,
                 oob_hint: str = OUT_OF_BOUNDS_HINT, written: np.ndarray | None = None) -> None:
        self.ref = ref
        # Per element, whether anything ever wrote it (None: not tracked, the default).
        self.written = written
        # ``uninitialized_reads="on_use"``: where the uninitialised data this buffer holds
        # came from (the client's object, e.g. the read of a scratch nothing wrote; None:
        # none known). Copies and DMAs carry it along with the written-ness.
        self.taint: Any = None
        # Whether every element was written (None: not known; see ``is_clean``): stores
        # only set bits, so a clean buffer stays clean until bits are cleared.
        self.clean: bool | None = None
        self.oob_hint = oob_hint
        self.data = data
        self.logical = data.shape
        self.bound = bound
        self.fill = fill
        self.refcount = 1
        # Only its core accesses it / nothing writes it (``Simulation.allocate(private=,
        # read_only=)``); ``quiet``: either, the race detector is not told of its accesses.
        self.private = self.read_only = self.quiet = False
        # No data (``SimulationOptions.keep_float_data=False``): ``data`` is a read-only
        # zero-stride array of the fill; reads give the fill, writes check bounds only.
        self.phantom = data.ndim > 0 and not any(data.strides) and not data.flags.writeable

    def read_only_error(self, what: str, core: Any, site: object) -> ConfigError:
        """``what`` (a store, a DMA) writing this read-only buffer."""
        return ConfigError(
            f"{core_name(core)}: {what} writes {self.ref.label}, which was allocated "
            f"read-only (nothing was to write it during the run, so reads of it were not "
            f"recorded){at_site(site)}. Allocate it without read_only, or with "
            f"palladium.interpret report this as a bug and run with "
            f"InterpretParams(detect_races=False) meanwhile.")

    def plan(self, region: Any) -> AccessPlan:
        """``region`` resolved against this buffer, or ``region`` itself if it is already
        a plan for this buffer's shapes (a plan of other shapes is resolved again from
        its region). Nothing is cached here: a client that accesses a region repeatedly
        keeps its plan (``Simulation.plan``) and passes that."""
        if region.__class__ is AccessPlan:
            if region.logical == self.logical and region.bound == self.bound:
                return region  # type: ignore[no-any-return]
            region = region.region
        return resolve(region, self.logical, self.bound)

    # -- reads -------------------------------------------------------------------------

    def read(self, plan: AccessPlan, oob_raise: bool, what: str, core: Any, site: object,
             mask: Any = None) -> np.ndarray:
        """The values of the planned region (a copy); the fill where nothing is stored.

        With ``mask``, only its True elements count as read: a False element outside
        the bounds reads the fill instead of raising.
        """
        if plan.full:
            if self.phantom:
                return self.data[plan.index + _ELLIPSIS]
            return self.data[plan.index + _ELLIPSIS].copy()
        if plan.oob and oob_raise:
            if mask is None:
                raise self.oob_error(what, plan, core, site, hint=True)
            if outside_mask(plan, mask).any():
                raise self.oob_error(f"masked {what}", plan, core, site, hint=True)
        if self.phantom:
            return np.broadcast_to(np.asarray(self.fill, self.data.dtype), plan.shape)
        out = np.full(plan.shape, self.fill, self.data.dtype)
        if plan.index is not None:
            out[plan.pos] = self.data[plan.index]
        return out

    # -- writes ------------------------------------------------------------------------

    def write(self, plan: AccessPlan, value: Any, mask: Any, what: str, core: Any, site: object) -> np.ndarray | None:
        """Store ``value`` (where ``mask``) into the planned region.

        Returns the mask restricted to the stored part (for the race detector), or None
        when no mask was given.
        """
        data = self.data
        written = self.written
        if self.clean is False:
            self.clean = None  # (this store may complete it)
        if self.phantom:
            if not plan.full:
                self.check_write_bounds(plan, mask, what, core, site)
            if mask is None:
                return None
            mask = np.broadcast_to(np.asarray(mask, dtype=bool), plan.shape)
            return mask if plan.full or plan.index is None else mask[plan.pos]
        if plan.full:
            if mask is None:
                data[plan.index] = value
                if written is not None:
                    written[plan.index] = True
                return None
            mask = np.asarray(mask, dtype=bool)
            np.copyto(data[plan.index + _ELLIPSIS], value, casting="unsafe", where=mask)
            if written is not None:
                written[plan.index + _ELLIPSIS] |= mask
            return mask
        self.check_write_bounds(plan, mask, what, core, site)
        if plan.index is None:
            return None if mask is None else np.zeros((), bool)
        value = np.broadcast_to(np.asarray(value), plan.shape)[plan.pos]
        if mask is None:
            data[plan.index] = value
            if written is not None:
                written[plan.index] = True
            return None
        sub_mask = np.broadcast_to(np.asarray(mask, dtype=bool), plan.shape)[plan.pos]
        np.copyto(data[plan.index + _ELLIPSIS], value, casting="unsafe", where=sub_mask)
        if written is not None:
            written[plan.index + _ELLIPSIS] |= sub_mask
        return sub_mask

    # -- what was written (``uninitialized_reads``) ------------------------------------

    def unwritten(self, plan: AccessPlan, mask: Any = None) -> np.ndarray | None:
        """Of the stored elements ``plan`` reads (where ``mask``), those nothing wrote,
        as a mask of ``data[plan.index]``'s shape; None if there are none (or nothing is
        tracked). Elements beyond the logical shape (tile padding, out of bounds) are
        the user's explicit choice and never count."""
        written = self.written
        if written is None or plan.index is None:
            return None
        part = written[plan.index + _ELLIPSIS]
        if part.all():
            return None
        missing = ~part
        if mask is not None:
            missing &= np.broadcast_to(stored_mask(plan, mask), missing.shape)
            if not missing.any():
                return None
        return missing

    def is_clean(self) -> bool:
        """Whether every element was written (or nothing is tracked), kept until bits
        are cleared."""
        if self.written is None:
            return True
        if self.clean is None:
            self.clean = bool(self.written.all())
        return self.clean

    def written_bits(self, plan: AccessPlan) -> np.ndarray | None:
        """A copy of the written-mask of ``plan``'s stored elements (None: not tracked)."""
        if self.written is None or plan.index is None:
            return None
        return self.written[plan.index + _ELLIPSIS].copy()

    def set_written(self, plan: AccessPlan, bits: Any, mask: Any = None) -> None:
        """Set the written-mask of ``plan``'s stored elements to ``bits`` (where
        ``mask``): a copy carries the written-ness of its source along."""
        if self.written is None or plan.index is None:
            return
        self.clean = None
        part = self.written[plan.index + _ELLIPSIS]
        bits = np.broadcast_to(np.asarray(bits, dtype=bool), part.shape)
        if mask is None:
            part[...] = bits
        else:
            np.copyto(part, bits, where=np.broadcast_to(stored_mask(plan, mask), part.shape))

    def describe_elements(self, plan: AccessPlan, elements: np.ndarray) -> str:
        """The bounding box, in this buffer's coordinates, of ``elements`` (a mask of
        ``data[plan.index]``'s shape), e.g. ``[0:8, 0:128]``."""
        hit = np.zeros(self.logical, dtype=bool)
        hit[plan.index + _ELLIPSIS] = elements
        where = np.nonzero(hit)
        if not self.logical:
            return "[]"
        return "[" + ", ".join(f"{int(w.min())}:{int(w.max()) + 1}" for w in where) + "]"

    def check_write_bounds(self, plan: AccessPlan, mask: Any, what: str, core: Any, site: object) -> None:
        """Raise if an element that would be written lies outside the bound shape."""
        if not plan.oob:
            return
        if mask is None:
            raise self.oob_error(what, plan, core, site, hint=False)
        if outside_mask(plan, mask).any():
            raise self.oob_error(f"masked {what}", plan, core, site, hint=False)

    def swap(self, plan: AccessPlan, value: Any, mask: Any, core: Any, site: object) -> tuple[np.ndarray, np.ndarray | None]:
        """Store ``value`` (where ``mask``) and return the old contents of the region."""
        if plan.full:
            old = self.data[plan.index + _ELLIPSIS]
            if not self.phantom:
                old = old.copy()
        else:
            self.check_write_bounds(plan, mask, "swap", core, site)
            old = self.read(plan, False, "swap", core, site)
        return old, self.write(plan, value, mask, "swap", core, site)

    # -- messages ----------------------------------------------------------------------

    def oob_error(self, what: str, plan: AccessPlan, core: Any, site: object, *, hint: bool) -> OutOfBoundsError:
        """An ``OutOfBoundsError`` naming the buffer, the region, the shape, core and site."""
        region = plan.region
        shape = f"shape {self.logical}"
        if self.bound != self.logical:
            shape += f" (padded to {self.bound})"
        who = core_name(core) if core is not None else "host"
        # "Out-of-bounds read of", "... write of", "... masked swap of": jax's interpreter's
        # phrases, which tests written against it match. A site may name the condition
        # its own way (a block copy: "Out-of-bounds block index ... for input ...").
        headline = getattr(site, "out_of_bounds_headline", None)
        if headline:
            access = f"{headline}: {what} of {self.ref.label}"
        elif "DMA" in what:
            access = f"Out-of-bounds {what.replace('DMA ', '')} by a DMA: {what} of {self.ref.label}"
        else:
            access = f"Out-of-bounds {what} of {self.ref.label}"
        text = (
            f"{who}: {access}: region "
            f"{describe_region(region)} (result shape {plan.shape}) exceeds {shape}"
            f"{at_site(site)}."
        )
        # A site may know the likely bug better (a block copy: its index map), for
        # writes too; the simulation's hint (how to read past the end) is for reads.
        site_hint = getattr(site, "out_of_bounds_hint", None)
        own = str(site_hint) if site_hint is not None else ""
        if own:
            text += " " + own
        elif hint:
            text += " " + self.oob_hint
        return OutOfBoundsError(text)
