"""Ctrl-C during a launch cancels its simulation and joins its threads.

Python runs its SIGINT handler (``KeyboardInterrupt``) only on the main thread, between
bytecodes. During a launch the main thread is usually blocked inside XLA (a jitted call,
``block_until_ready``) while the simulated cores run on XLA's callback threads, so the
handler never runs: the cores spun at full CPU and, under ``shard_map``, the process could
not exit. Python's C-level handler also writes the signal number to the "wakeup fd"
(``signal.set_wakeup_fd``) from whatever thread, so a watcher thread reading that socket
sees Ctrl-C at once and cancels every running simulation and waiting rendezvous with
``KeyboardInterrupt``; XLA returns, and the main thread's own ``KeyboardInterrupt``
follows.

Installed only from the main thread, only while SIGINT has Python's default handler and
nobody else (asyncio) owns the wakeup fd; otherwise Ctrl-C reaches a launch only when it
runs on the main thread (``Scheduler.run`` then cancels and joins its cores itself).
"""

from __future__ import annotations

import atexit
import signal
import socket
import threading
from collections.abc import Callable

_installed: list[socket.socket] = []  # the reading end, once installed (a registry)


def install(on_interrupt: Callable[[BaseException], None]) -> bool:
    """Watch for SIGINT and call ``on_interrupt(KeyboardInterrupt(...))`` when it comes.
    Idempotent; returns whether the watcher runs."""
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        reader.close()
        writer.close()
        return False
    if previous != -1:  # someone else's: give it back and stay out of the way
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        return False
    _installed.extend([reader, writer])

    def watch() -> None:
        while True:
            data = reader.recv(64)
            if not data:
                return
            if signal.SIGINT in data:
                on_interrupt(KeyboardInterrupt("palladium: launch cancelled by Ctrl-C (SIGINT)"))

    watcher = threading.Thread(target=watch, name="palladium SIGINT watcher", daemon=True)
    watcher.start()
    atexit.register(_uninstall, watcher)
    return True


def _uninstall(watcher: threading.Thread) -> None:
    """At exit: give the wakeup fd back, close the socket pair (the watcher reads the end
    of its stream and returns), so that no socket is left for the garbage collector."""
    if not _installed:
        return
    reader, writer = _installed
    try:
        previous = signal.set_wakeup_fd(-1)
        if previous not in (-1, writer.fileno()):  # someone replaced ours: keep theirs
            signal.set_wakeup_fd(previous)
    except ValueError:  # not the main thread
        pass
    writer.close()
    watcher.join(timeout=1.0)
    reader.close()
    _installed.clear()
