"""The frames ``tpu_compiler`` and the compiler's process (``compiler_worker``) exchange,
and what is read from a compiled kernel."""

from __future__ import annotations

import pickle
import re
import struct
from typing import IO, Any

__all__ = ["read_frame", "used_vmem", "write_frame"]


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
