"""The frames ``tpu_compiler`` and the compiler's process (``compiler_worker``) exchange,
and what is read from a compiled kernel."""

from __future__ import annotations

import pickle
import re
import struct
from typing import IO, Any

__all__ = ["describe_failure", "read_frame", "used_vmem", "write_frame"]


_JAX_TRACE_NOTE = "\n\nThe preceding stack trace is the source of the JAX operation"


def describe_failure(exc: BaseException) -> str:
    """``"Type: text"`` of what jax or the compiler raised, whole and once."""
    cause = exc.__cause__
    if cause is not None and type(cause).__name__ == "JaxStackTraceBeforeTransformation":
        # jax's marker of where the user's traceback was: the error's own text is whole.
        return f"{type(exc).__name__}: {str(exc).split(_JAX_TRACE_NOTE, 1)[0].rstrip()}"
    first = str(exc).strip().split("\n", 1)[0]
    if cause is not None and first and first in str(cause):
        # jax's MosaicError repeats its cause's text without the MLIR location: keep the
        # cause's whole (it has the location) under the error's name.
        return f"{type(exc).__name__}: {cause}"
    text = f"{type(exc).__name__}: {exc}"
    if cause is not None and str(cause) not in text:
        text += f"\n(caused by {type(cause).__name__}: {cause})"
    return text


def write_frame(stream: IO[bytes], message: Any) -> None:
    """One pickled message with an 8-byte length prefix."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> Any:
    """The next message, or None at end of stream."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


_USED_SCOPED = re.compile(r'"used_scoped_memory_configs":\[([^\]]*)\]')
_CONFIG = re.compile(r'\{"memory_space":"(\d+)","offset":"(\d+)","size":"(\d+)"\}')
_VMEM_SPACE = "1"


def used_vmem(hlo_text: str) -> int | None:
    """The scoped VMEM the compiled kernel(s) use: the largest of the custom calls'."""
    sizes = [int(size) for block in _USED_SCOPED.findall(hlo_text)
             for space, _, size in _CONFIG.findall(block) if space == _VMEM_SPACE]
    return max(sizes) if sizes else None
