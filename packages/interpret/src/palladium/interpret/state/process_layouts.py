"""This process's place in a ``jax.distributed`` run (``process_state.STATE.processes``).

The layout itself (its transports, its heartbeat) is the hook's
(``hook.multi_process.ProcessLayout``), which tells this store how to make one when it
is imported (``make``): the process's state names no class above it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from palladium.interpret import _jax_compat as jc

__all__ = ["ProcessLayouts"]


class ProcessLayouts:
    """The process-wide layout: made at the first split launch, kept for the
    ``jax.distributed`` client it belongs to (its heartbeat thread runs from then on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layout: Any = None
        #: make(client, process index, process count) -> a layout (set by the hook)
        self.make: Callable[[Any, int, int], Any] | None = None

    def current(self) -> Any:
        """This process's layout in a ``jax.distributed`` run of 2+ processes, else None."""
        client = jc.distributed_client()
        if client is None or self.make is None:
            return None
        import jax

        count = jax.process_count()
        if count < 2:
            return None
        with self._lock:
            if self._layout is None or self._layout.client is not client:
                self._layout = self.make(client, jax.process_index(), count)
            return self._layout

    def start_heartbeat(self) -> None:
        """Start this process's heartbeat if it is part of a ``jax.distributed`` run of 2+
        processes (at import and when a kernel is lowered: a process that dies before
        its first launch is then seen by the others within ``PEER_TIMEOUT``)."""
        if jc.distributed_client() is None:
            return
        layout = self.current()
        if layout is not None:
            layout.start_heartbeat()
