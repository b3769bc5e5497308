"""Ctrl-C during a launch: the launch stops at its next grid step or scheduling point, and
the program sees ONE ``KeyboardInterrupt``.

Python runs its SIGINT handler (``KeyboardInterrupt``) only on the main thread, between
bytecodes. A launch runs inside XLA: on the calling thread for a one-device launch
(XLA calls the host callback inline), on XLA's own threads for a multi-device one, while
the main thread waits inside ``block_until_ready``, where no Python handler runs.

* **Seeing Ctrl-C.** Python's C-level handler also writes the signal number to the
  "wakeup fd" (``signal.set_wakeup_fd``) from whatever thread, so a watcher thread reading
  that socket sees Ctrl-C at once and cancels every running simulation and waiting
  rendezvous with :class:`LaunchInterrupted`; the cores unwind at their next grid step or
  scheduling point.
* **One exception.** A launch that raised would reach the caller as jax's
  ``JaxRuntimeError`` ("launch cancelled by Ctrl-C"), followed by Python's own
  ``KeyboardInterrupt`` inside the caller's ``except`` block. So a launch cancelled by
  Ctrl-C does not fail: it is *abandoned* and returns placeholder outputs (NaN, or 0 for
  integers), and the ``KeyboardInterrupt`` Python raises on the main thread as soon as it
  runs Python code again is the one exception the program sees. While a launch runs
  inline on the main thread, :func:`main_thread_launch` swaps in a handler that, inside
  the launch's host callback, cancels the launch instead of raising there (jax would wrap
  it) and trips SIGINT again as it returns, until it runs outside the callback: there,
  at the first check of pending signals back in the caller's code, it raises the
  ``KeyboardInterrupt``.
* Abandoning is only done where the main thread is certain to raise: the launch runs on
  the main thread or on one of XLA's threads (a multi-device launch: whoever dispatched
  it), and SIGINT has Python's default handler (or palladium's). A launch running inline
  on another Python thread fails with ``LaunchInterrupted`` instead, as does every launch
  when the program installed its own SIGINT handler.

Installed only from the main thread, only while SIGINT has Python's default handler and
nobody else (asyncio) owns the wakeup fd; otherwise Ctrl-C reaches a launch only when it
runs on the main thread (``Scheduler.run`` then cancels and unwinds its cores itself).
"""

from __future__ import annotations

import _signal  # (the C functions under ``signal``: no enum conversions per launch)
import _thread
import atexit
import contextlib
import operator
import os
import signal
import socket
import threading
import types
import weakref
from collections.abc import Callable, Iterator

from palladium.interpret.state.process_state import STATE

__all__ = ["LaunchInterrupted", "abandon_on_interrupt", "install", "main_thread_launch"]


class LaunchInterrupted(KeyboardInterrupt):
    """A launch cancelled by Ctrl-C (SIGINT)."""


# The registry of this module (the only state it keeps): the watcher's socket pair once
# installed, the interrupt callback, and the deferred-Ctrl-C flag of the main thread.
_installed: list[socket.socket] = STATE.keep(
    "interrupt_watcher", [], owner=__name__, holds="the Ctrl-C watcher's socket pair")
_hooks: dict[str, Callable[[BaseException], None]] = STATE.keep(
    "interrupt_hooks", {}, owner=__name__, holds="the interrupt callback")
_deferred = threading.Event()  # a Ctrl-C seen inside a launch, to raise after it
_retrips: list[weakref.ref] = STATE.keep(  # the weak reference that trips SIGINT again
    "interrupt_retrips", [], owner=__name__, holds="the reference that trips SIGINT again")

# The frames "inside palladium's host callback": any of ``host_call.py`` and
# ``ffi_callback.py`` (palladium's FFI handler) and the launch entry points of
# ``jax_hook.py``; jax's callback wrapper around them counts too.
# (Named by path: the hook is a layer above this module.)
_HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hook")
_HOST_CALL_FILE = os.path.join(_HOOK, "host_call.py")
_HOST_CALL_FILES = (_HOST_CALL_FILE, os.path.join(_HOOK, "ffi_callback.py"))
_ENTRY_POINTS = {(os.path.join(_HOOK, "jax_hook.py"), name)
                 for name in ("run", "run_device", "_join", "_execute", "_attempt")}


def install(on_interrupt: Callable[[BaseException], None]) -> bool:
    """Watch for SIGINT and call ``on_interrupt(LaunchInterrupted(...))`` when it comes.
    Idempotent; returns whether the watcher runs."""
    _hooks["interrupt"] = on_interrupt
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
            try:
                data = reader.recv(64)
            except OSError:  # closed at exit
                return
            if not data:
                return
            if signal.SIGINT in data:
                _cancel()

    watcher = threading.Thread(target=watch, name="palladium SIGINT watcher", daemon=True)
    watcher.start()
    atexit.register(_uninstall, watcher)
    return True


def _cancel() -> None:
    hook = _hooks.get("interrupt")
    if hook is not None:
        hook(LaunchInterrupted("palladium: launch cancelled by Ctrl-C (SIGINT)"))


def abandon_on_interrupt() -> bool:
    """Whether a launch cancelled by Ctrl-C on this thread returns placeholder outputs
    (the main thread will raise ``KeyboardInterrupt``) rather than fail."""
    thread = threading.current_thread()
    if thread is not threading.main_thread() and not isinstance(
            thread, threading._DummyThread):  # a Python thread of the program's own
        return False
    return signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _deferring_handler)


_SIGINT = int(signal.SIGINT)


@contextlib.contextmanager
def main_thread_launch() -> Iterator[None]:
    """Around a launch's host callback: on the main thread, with Python's default SIGINT
    handler, Ctrl-C cancels the launch and its ``KeyboardInterrupt`` is raised after the
    callback, in the caller's code (not inside the callback, where jax would wrap it)."""
    if (threading.current_thread() is not threading.main_thread()
            or _signal.getsignal(_SIGINT) is not signal.default_int_handler):
        yield
        return
    _signal.signal(_SIGINT, _deferring_handler)
    try:
        yield
    finally:
        if not _deferred.is_set() and _signal.getsignal(_SIGINT) is _deferring_handler:
            _signal.signal(_SIGINT, signal.default_int_handler)


def _deferring_handler(signum: int, frame: types.FrameType | None) -> None:
    """palladium's SIGINT handler while a launch runs inline on the main thread."""
    if _in_host_callback(frame):
        if not _deferred.is_set():
            _deferred.set()
            _cancel()
        _retrip_after_return()
        return
    _deferred.clear()
    if signal.getsignal(signal.SIGINT) is _deferring_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.default_int_handler(signum, frame)


class _Retrip(weakref.ref):
    """A weak reference whose callback trips SIGINT, in C alone: ``methodcaller("trip")``
    calls ``ref.trip()``, which is ``_thread.interrupt_main``."""

    trip = staticmethod(_thread.interrupt_main)


class _Token:
    pass


def _retrip_after_return() -> None:
    """Trip SIGINT again once the calling handler has returned, so that it runs once more
    at the next check of pending signals and raises at the first one outside the
    callback. Tripping it from the handler's own code would run the handler again inside
    itself (Python checks pending signals after the call that trips), recursively; here
    the token dies when this frame returns (its last reference is a local) and its weak
    reference's callback trips SIGINT from C, where no check follows."""
    token = _Token()
    _retrips[:] = [_Retrip(token, operator.methodcaller("trip"))]


def _in_host_callback(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` (the main thread's, when the handler runs) is inside palladium's
    host callback, jax's wrapper of it included."""
    depth = 0
    glet = _current_greenlet()
    while depth < 256:
        if frame is None:
            # The bottom of a simulated core's stack (a greenlet): its launch's frames
            # are below the frame where the scheduler switched to it.
            glet = getattr(glet, "parent", None)
            frame = getattr(glet, "gr_frame", None)
            if frame is None:
                return False
        code = frame.f_code
        if code.co_filename in _HOST_CALL_FILES or (code.co_filename, code.co_name) in _ENTRY_POINTS:
            return True
        if code.co_name == "_wrapped_callback":  # jax's wrapper: of our callback?
            inner = frame.f_locals.get("callback")
            inner_code = getattr(inner, "__code__", None)
            if inner_code is not None and inner_code.co_filename == _HOST_CALL_FILE:
                return True
        frame = frame.f_back
        depth += 1
    return False


def _current_greenlet() -> object:
    try:
        import greenlet  # the simulator's cores are greenlets (palladium.shared_memory)
    except ImportError:  # pragma: no cover - shared_memory depends on it
        return None
    return greenlet.getcurrent()


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
    with contextlib.suppress(BaseException):  # a Ctrl-C at exit must not be reported here
        watcher.join(timeout=1.0)
    reader.close()
    _installed.clear()
