"""The frames ``tpu_compiler`` and the compiler's process (``compiler_worker``) exchange,
and what is read from a compiled kernel."""

from __future__ import annotations

import dataclasses
import pickle
import re
import struct
from typing import IO, Any

__all__ = ["CallPlacement", "custom_call_placement", "describe_failure", "read_frame", "used_vmem",
           "write_frame"]


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


#: XLA's memory space numbers in an optimized HLO layout (``S(n)``; none: the default).
HBM_SPACE, VMEM_SPACE = 0, 1

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s+([\w\-]+)\((.*)$")
_ARRAY = re.compile(r"([a-z][a-z0-9]*\[[\d,]*\])(\{[^{}]*\})?")
_SPACE = re.compile(r"S\((\d+)\)")
_OPERAND = re.compile(r"%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class CallPlacement:
    """Where XLA placed one TPU custom call's operands and results in a compiled program:
    per array its type (``"f32[1,2,1024,128]"``) and memory space (``HBM_SPACE``,
    ``VMEM_SPACE``, ...), in the call's operand and result order."""

    name: str
    operands: tuple[tuple[str, int], ...]
    results: tuple[tuple[str, int], ...]


def _arrays(shape: str) -> tuple[tuple[str, int], ...]:
    return tuple((a, int(m.group(1)) if (m := _SPACE.search(layout or "")) else HBM_SPACE)
                 for a, layout in _ARRAY.findall(shape))


def custom_call_placement(hlo_text: str) -> tuple[CallPlacement, ...]:
    """The ``tpu_custom_call``s of an optimized HLO module's text (XLA's memory-space
    assignment done: an operand it put in VMEM has ``S(1)`` in its layout), in the order
    the text has them (a computation's in its schedule's order)."""
    shapes: dict[str, str] = {}
    found = []
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, shape, opcode, rest = m.groups()
        shapes[name] = shape
        if opcode != "custom-call" or '"tpu_custom_call"' not in rest:
            continue
        depth, end = 0, len(rest)
        for i, ch in enumerate(rest):  # the operand list ends at its closing parenthesis
            if ch == "(":
                depth += 1
            elif ch == ")":
                if depth == 0:
                    end = i
                    break
                depth -= 1
        operands = tuple(a for op in _OPERAND.findall(rest[:end])
                         for a in _arrays(shapes.get(op, "")))
        found.append(CallPlacement(name, operands, _arrays(shape)))
    return tuple(found)
