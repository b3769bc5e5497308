"""Which of a ``pallas_call``'s operands XLA places in VMEM, on a TPU (issue 40).

Inside a larger jitted program, XLA's memory-space assignment may put a TPU custom call's
operands and results in VMEM (``S(1)`` in the optimized HLO's layouts: an operand copied
in by ``copy-start``/``copy-done``, or produced there by the fusion before it); the
kernel's block copies from such an operand are then VMEM -> VMEM, not HBM -> VMEM. This
script compiles jax's flash attention backward (the whole ``jax.grad`` program) and its
forward alone, writes the optimized HLO and a summary, and prints each custom call::

    OUT=/tmp/x python benchmarks/chip/xla_memory_spaces.py     (on a TPU host)

Measured on a v5e (results_tpu/xla_memory_spaces.v5e.json, 2026-12-06): in the backward
program every operand and result of the dkv and dq kernels is in VMEM; the forward
called alone reads and writes HBM.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernel_cases as kc  # noqa: E402


def main() -> None:
    out = Path(os.environ.get("OUT", "."))
    res = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind)}
    for name, case in (("flash-backward/h2/s1024", kc.flash_backward_case(2, 1024, 128)),
                       ("flash-forward/h2/s1024", kc.flash_forward_case(2, 1024, 128))):
        fn, args = case.make()
        text = jax.jit(fn).lower(*args).compile().as_text()
        (out / f"{name.replace('/', '_')}.hlo.txt").write_text(text)
        lines = text.splitlines()
        res[name] = {
            "custom_calls": [ln.strip()[:600] for ln in lines if "custom-call(" in ln],
            "vmem_layout_lines": sum("S(1)" in ln for ln in lines),
            "copies_into_vmem": [ln.strip()[:300] for ln in lines if "copy-start(" in ln]}
    (out / "xla_memory_spaces.json").write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        if isinstance(v, dict):
            print(k, "lines with VMEM (S(1)) layouts:", v["vmem_layout_lines"])
            for c in v["custom_calls"]:
                print("  ", c[:300])


if __name__ == "__main__":
    main()
