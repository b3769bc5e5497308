"""The devices of a launch: the mesh axes of the surrounding ``shard_map`` and how a
kernel's ``device_id`` (an int, a tuple of mesh coordinates or a ``{axis: index}`` dict;
``DeviceIdType.LOGICAL`` or ``MESH``) names one of them.

Logical device ids are row-major over the mesh axes in the order the axis environment
lists them (the order of the ``shard_map`` mesh), like Mosaic's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.errors import KernelError, UnsupportedFeatureError


def _int(x: Any) -> int:
    return int(np.asarray(x))


@dataclasses.dataclass(frozen=True)
class DeviceMesh:
    """The manual mesh axes around a kernel launch (empty: one device)."""

    axis_names: tuple[Any, ...] = ()
    axis_sizes: tuple[int, ...] = ()

    @classmethod
    def from_axis_env(cls, sizes: dict[Any, int]) -> DeviceMesh:
        return cls(tuple(sizes), tuple(int(s) for s in sizes.values()))

    @property
    def num_devices(self) -> int:
        return math.prod(self.axis_sizes)

    def coords(self, device: int) -> tuple[int, ...]:
        """Mesh coordinates of a logical device id."""
        return tuple(int(c) for c in np.unravel_index(device, self.axis_sizes)) if self.axis_sizes else ()

    def logical_id(self, coords: tuple[int, ...]) -> int:
        out = 0
        for c, n in zip(coords, self.axis_sizes):
            out = out * n + c
        return out

    def axis_position(self, device: int, name: Any) -> tuple[int, int] | None:
        """``(index, size)`` of ``device`` along mesh axis ``name`` (None: not a mesh axis)."""
        if name not in self.axis_names:
            return None
        i = self.axis_names.index(name)
        return self.coords(device)[i], self.axis_sizes[i]

    def resolve(
        self,
        device_id: Any,
        id_type: Any,
        current: int,
        core_axis_names: tuple[Any, ...],
        where: Callable[[], str],
    ) -> tuple[int, int | None]:
        """``(logical device, core or None)`` that ``device_id`` names, seen from device
        ``current``. A ``{axis: index}`` dict may name core axes of a ``core_map`` too;
        mesh axes it omits keep the current device's coordinate."""
        core: int | None = None
        if isinstance(device_id, dict):
            current_coords = list(self.coords(current))
            for axis, value in device_id.items():
                if axis in core_axis_names:
                    core = _int(value)
                elif axis in self.axis_names:
                    i = self.axis_names.index(axis)
                    c = _int(value)
                    if not 0 <= c < self.axis_sizes[i]:
                        # Range-checked per axis: row-major, an out-of-range minor
                        # coordinate would silently name another device.
                        raise KernelError(
                            f"device_id {{{axis!r}: {c}}}: coordinate {c} is outside mesh "
                            f"axis {axis!r} of size {self.axis_sizes[i]} ({where()})"
                        )
                    current_coords[i] = c
                else:
                    raise UnsupportedFeatureError(
                        f"device_id names axis {axis!r}, which is neither a mesh axis of the "
                        f"surrounding shard_map {self.axis_names} nor a core axis ({where()})"
                    )
            device = self.logical_id(tuple(current_coords))
        elif id_type == jc.DeviceIdType.LOGICAL:
            parts = device_id if isinstance(device_id, tuple | list) else (device_id,)
            if len(parts) != 1:
                raise KernelError(
                    f"a LOGICAL device_id is one int, got {len(parts)} values ({where()})"
                )
            device = _int(parts[0])
        else:
            parts = device_id if isinstance(device_id, tuple | list) else (device_id,)
            coords = tuple(_int(p) for p in parts)
            if len(coords) != len(self.axis_sizes):
                if self.axis_sizes or any(coords):
                    raise KernelError(
                        f"device_id {coords} has {len(coords)} mesh coordinate(s), but the "
                        f"surrounding shard_map mesh has axes {self.axis_names} ({where()})"
                    )
                coords = ()
            for c, n, name in zip(coords, self.axis_sizes, self.axis_names):
                if not 0 <= c < n:
                    raise KernelError(
                        f"device_id {coords}: coordinate {c} is outside mesh axis {name!r} "
                        f"of size {n} ({where()})"
                    )
            device = self.logical_id(coords)
        n = max(self.num_devices, 1)
        if not 0 <= device < n:
            raise KernelError(
                f"device_id {device_id!r} names device {device}, but the kernel runs on "
                f"{n} device(s) ({where()})"
            )
        return device, core
