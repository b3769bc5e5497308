"""Where a simulated access happened, formatted only when a message needs it."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from palladium.interpret import _jax_compat as jc


class Site(NamedTuple):
    """The kernel, grid point, core and source line of one operation.

    Cheap to create (no formatting happens until ``str()``); the simulator and the race
    detector embed it in their error messages. A named tuple rather than a frozen
    dataclass: every DMA start and wait makes one, and a frozen dataclass's ``__init__``
    (one ``object.__setattr__`` per field) cost ~3x a tuple's construction.
    """

    kernel: str
    core: tuple[int, int]
    grid_point: tuple[int, ...] | None = None
    source_info: Any = None
    what: str | None = None
    # How an out-of-bounds error at this site names the condition (a block copy: the
    # index map's answer and jax's wording; formatted by str()); None: the simulator's
    # own "Out-of-bounds read of ...".
    out_of_bounds_headline: object | None = None
    # What such an error suggests (formatted by str()); None: the simulation's hint.
    out_of_bounds_hint: object | None = None

    @property
    def source_line(self) -> str | None:
        if isinstance(self.source_info, str):  # already "file.py:line"
            return self.source_info
        frame = jc.user_frame(self.source_info)
        if frame is None:
            return None
        file, line = frame
        return f"{os.path.basename(file)}:{line}"

    def __str__(self) -> str:
        parts = [f"kernel '{self.kernel}'"]
        if self.what:
            parts.append(self.what)
        if self.grid_point is not None:
            parts.append(f"grid point {self.grid_point}")
        device, core = self.core
        parts.append(f"device {device} core {core}")  # both parts always, on every device
        text = ", ".join(parts)
        line = self.source_line
        return f"{text} ({line})" if line else text
