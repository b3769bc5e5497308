"""Which of a ``pallas_call``'s operands XLA places in VMEM, on a TPU (issue 40).

Inside a larger jitted program, XLA's memory-space assignment may put a TPU custom call's
operands and results in VMEM (``S(1)`` in the optimized HLO's layouts: an operand copied
in by ``copy-start``/``copy-done``, or produced there by the fusion before it); the
kernel's block copies from such an operand are then VMEM -> VMEM, not HBM -> VMEM. This
script compiles every calibration kernel whose name starts with a ``--prefix`` (the whole
program ``fn(*args)``, as ``jax.jit`` does on the host it runs on) and writes, per
kernel, each custom call's operand and result types and memory spaces (read with
palladium's own ``custom_call_placement``, the reader ``predict`` uses)::

    OUT=/tmp/x python benchmarks/chip/xla_memory_spaces.py        (on a TPU host)
    python benchmarks/chip/xla_memory_spaces.py --deviceless      (libtpu, no TPU)

``--deviceless`` compiles for a v5e topology without a TPU (libtpu installed), as
``predict`` does. Measured on a v5e (results_tpu/xla_memory_spaces.v5e.json,
2026-12-06): in jax's flash attention backward (the ``jax.grad`` program) every operand
and result of the dkv and dq kernels, and the forward's results, are in VMEM; the
gated-delta chunk kernel's inputs produced by XLA ops are too; every kernel called alone
on its arguments reads and writes HBM. The deviceless compile places them the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_kernels as ck  # noqa: E402


def _reader():  # palladium's reader, loaded alone (a TPU host may lack palladium's deps)
    import importlib.util

    path = (Path(__file__).resolve().parents[2] / "packages" / "interpret" / "src" /
            "palladium" / "interpret" / "fidelity" / "compiler_protocol.py")
    spec = importlib.util.spec_from_file_location("_compiler_protocol", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks itself up there)
    spec.loader.exec_module(module)
    return module.custom_call_placement


custom_call_placement = _reader()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", nargs="*", default=["heldout", "sweep"])
    ap.add_argument("--deviceless", action="store_true")
    a = ap.parse_args()
    out = Path(os.environ.get("OUT", "."))
    device = None
    if a.deviceless:
        from jax.experimental import topologies

        device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
    else:
        device = jax.devices()[0]
    res: dict = {"jax": jax.__version__, "device": str(device.device_kind),
                 "deviceless": a.deviceless, "kernels": {}}
    sharding = jax.sharding.SingleDeviceSharding(device)
    for name, entry in ck.ENTRIES.items():
        if not name.startswith(tuple(a.prefix)):
            continue
        fn, args = entry.make()
        structs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding) for x in args]
        try:
            with jax.default_device(device):
                text = jax.jit(fn).trace(*structs).lower(
                    lowering_platforms=("tpu",)).compile().as_text()
        except Exception as exc:  # noqa: BLE001 - reported, the others go on
            res["kernels"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        calls = custom_call_placement(text)
        res["kernels"][name] = [{"name": c.name, "operands": c.operands, "results": c.results}
                                for c in calls]
        vmem = [c.name for c in calls if any(s == 1 for _, s in c.operands + c.results)]
        if vmem:
            print(name, "VMEM operands or results in:", vmem)
    (out / "xla_memory_spaces.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
