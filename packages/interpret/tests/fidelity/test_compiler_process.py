"""The compiler's process seen from the user's (fidelity/compiler_process.py): a process
killed mid-compile is an outcome ("crashed"), and leaves nothing open behind it."""

import gc
import sys
import warnings

import pytest

from palladium.interpret.fidelity.compiler_process import CompilerProcess

# A worker that reads the request's length and dies by SIGKILL mid-compile, as libtpu's
# process does when it aborts or is killed.
_DIES = ("import os, signal, sys; sys.stdin.buffer.read(8); "
         "os.kill(os.getpid(), signal.SIGKILL)")


@pytest.mark.timeout(60)
def test_a_compiler_killed_mid_compile_leaves_no_unclosed_file():
    """Issue 42 item 13: two ``ResourceWarning: unclosed file`` (its stdin and stdout
    pipes) once the dead process's ``Popen`` was collected."""
    process = CompilerProcess([sys.executable, "-c", _DIES])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome, message, vmem, placement = process.compile(b"module", "v5e:2x2", 1, 1, 1)
        assert (outcome, message, vmem, placement) == (
            "crashed", "the TPU compiler's process died (signal SIGKILL)", None, None)
        # started again for the next compile, which dies too
        assert process.compile(b"module", "v5e:2x2", 1, 1, 1)[0] == "crashed"
        process.close()
        del process
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
