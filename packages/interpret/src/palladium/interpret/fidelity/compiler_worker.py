"""The process that runs the TPU compiler (libtpu) for ``tpu_compiler``.

libtpu aborts its process on some kernels (a failed check in its pipeline or fusion
emitter, e.g. a first block that starts past its array, bool operands on v5p): compiling
in the user's process would end it. So the kernel is lowered in the user's process (jax's
TPU lowering, with the kernel's source locations) and its StableHLO, as MLIR bytecode, is
compiled here, in a process of its own started on the first compile and kept for the
next ones. A crash here is a verdict ("crashed", with libtpu's last words), never the
user's process's end.

Protocol (stdin/stdout, one pickled message per frame, 8-byte length prefix): a request
``(bytecode, topology, num_devices, num_args, num_outputs)``; a reply ``(kind, message,
vmem_bytes, placement)`` with ``kind`` "accepted" or "failed" (``message``: the compiler's
exception, its type and text, cause included) and ``placement`` the compiled program's
TPU custom calls with their operands' and results' memory spaces
(``compiler_protocol.custom_call_placement``; None when it failed).

    python -m palladium.interpret.fidelity.compiler_worker     (started by tpu_compiler)
"""

from __future__ import annotations

import os
import sys
from typing import IO

from palladium.interpret.fidelity.compiler_protocol import (
    custom_call_placement,
    describe_failure,
    read_frame,
    used_vmem,
    write_frame,
)

__all__ = ["main"]


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    import functools

    import numpy as np
    from jax.experimental import topologies

    from palladium.interpret import _jax_compat as jc

    topology = functools.cache(
        lambda name: topologies.get_topology_desc(platform="tpu", topology_name=name))
    while (request := read_frame(requests)) is not None:
        bytecode, topo_name, num_devices, num_args, num_outputs = request
        devices = topology(topo_name).devices[:num_devices]
        try:
            text = jc.compile_for_devices(bytecode, np.array(devices, dtype=object),
                                          num_args, num_outputs)
        except Exception as exc:  # noqa: BLE001  (the compiler's verdict)
            write_frame(replies, ("failed", describe_failure(exc), None, None))
        else:
            write_frame(replies, ("accepted", "", used_vmem(text), custom_call_placement(text)))


def main() -> None:
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever libtpu prints goes to stderr, not into the replies
    _serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
