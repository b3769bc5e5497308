"""The process libtpu compiles in, seen from the user's process (see ``compiler_worker``).

Started on the first compile and kept for the next ones; started again after it died. A
compile that ends it (libtpu aborts on some kernels) or outlasts ``COMPILE_TIMEOUT`` is an
outcome ("crashed", "timeout"), never this process's end or a hang.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any

from palladium.interpret.fidelity.compiler_protocol import read_frame, write_frame
from palladium.interpret.state.process_state import STATE

__all__ = ["COMPILER_PROCESS", "COMPILE_TIMEOUT", "PRESTART_VARIABLE", "CompilerProcess"]

#: ``PALLADIUM_COMPILER_PRESTART=0`` keeps ``import palladium.interpret`` from starting the
#: compiler's process where libtpu is installed (it is then started on the first compile).
PRESTART_VARIABLE = "PALLADIUM_COMPILER_PRESTART"

#: Seconds one compile may take in the compiler's process before it is ended and the
#: kernel runs unchecked (libtpu compiles palladium's test kernels in 0.05-2 s).
COMPILE_TIMEOUT = 300.0


class CompilerProcess:
    """The process libtpu compiles in (``compiler_worker``): started on the first compile,
    kept for the next ones, started again after it died."""

    def __init__(self, command: list[str] | None = None) -> None:
        # (a test gives another worker: one that dies mid-compile)
        self._command = command or [sys.executable, "-m",
                                    "palladium.interpret.fidelity.compiler_worker"]
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._lock = threading.Lock()

    def compile(self, bytecode: bytes, topology: str, num_devices: int, num_args: int,
                num_outputs: int) -> tuple[str, str, int | None, Any]:
        """``(outcome, message, vmem_bytes, placement)``: outcome "accepted", "failed",
        "crashed" or "timeout"; ``placement``: the accepted program's custom calls
        (``compiler_protocol.CallPlacement``s), else None."""
        with self._lock:
            proc = self._start()
            request = (bytecode, topology, num_devices, num_args, num_outputs)
            assert proc.stdin is not None and proc.stdout is not None
            try:
                write_frame(proc.stdin, request)
                ready, _, _ = select.select([proc.stdout], [], [], COMPILE_TIMEOUT)
                reply = read_frame(proc.stdout) if ready else None
            except (BrokenPipeError, OSError):
                ready, reply = [proc.stdout], None
            if reply is not None:
                return reply  # type: ignore[no-any-return]
            return self._failure(proc, timed_out=not ready)

    def prestart(self) -> None:
        """Start the process now, in the background (its imports take seconds), so that
        the first compile finds it ready."""
        with self._lock:
            self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
                   **{PRESTART_VARIABLE: "0"})  # the worker imports palladium.interpret
        if self._stderr is not None:
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (kept with the process)
        self._proc = subprocess.Popen(
            self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        return self._proc

    def _failure(self, proc: subprocess.Popen[bytes],
                 timed_out: bool) -> tuple[str, str, int | None, Any]:
        if not timed_out:  # its replies ended: it is dying (libtpu's handler writes first)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
        if proc.poll() is None:  # no reply in time: end it
            proc.kill()
            proc.wait()
            _close_pipes(proc)
            self._proc = None
            return ("timeout", f"the TPU compiler did not finish within {COMPILE_TIMEOUT:.0f} "
                    "s", None, None)
        code = proc.returncode
        _close_pipes(proc)
        self._proc = None
        said = _last_words(self._stderr)
        how = (f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}")
        return ("crashed", f"the TPU compiler's process died ({how})"
                + (f"; libtpu said: {said}" if said else ""), None, None)

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                if self._proc.poll() is None:
                    self._proc.kill()
                    self._proc.wait()
                _close_pipes(self._proc)
            self._proc = None
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    """Close our ends of a finished process's pipes (else each is a ``ResourceWarning:
    unclosed file`` when the ``Popen`` is collected)."""
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # (a broken pipe's unflushed bytes)
                pipe.close()


def _last_words(stderr: Any) -> str:
    """libtpu's failed check, from what the compiler's process wrote before it died."""
    if stderr is None:
        return ""
    try:
        stderr.seek(0)
        text = stderr.read().decode(errors="replace")
    except OSError:
        return ""
    checks = [line for line in text.splitlines() if "Check failed" in line or "CHECK" in line]
    return checks[0].strip() if checks else ""


COMPILER_PROCESS = STATE.keep(
    "compiler_process", CompilerProcess(), owner=__name__,
    holds="the process libtpu compiles in (started on the first compile)")
atexit.register(COMPILER_PROCESS.close)
