"""The key a compiled launch's executable is kept under across processes.

Tracing and compiling a kernel's whole launch (``compiled_launch.py``) costs seconds
(paged attention: ~1.6 s of tracing and ~3.5 s of XLA's compile on a 2-core machine);
loading the executable from the disk cache (``state.segment_cache``, which adds the
versions, the host CPU, ``XLA_FLAGS`` and palladium's own source to every key) costs a
tenth of that. The key writes down (``fidelity.call_key``) what the launch function is
a function of: the kernel's jaxpr, grid mapping, blocks, scratch, aliases and compiler
parameters, the launch's grid, its grid order, the uninitialised value and the operand
types, and jax's configuration. What is derived from those (which refs DMAs reach,
which buffers are private or read-only) is not written again, nor what only messages
show (names, source lines). A kernel the key cannot write down gets None: it is traced
and compiled in every process, as before.
"""

from __future__ import annotations

from typing import Any

import jax

from palladium.interpret import _jax_compat as jc
from palladium.interpret.fidelity.call_key import call_key
from palladium.interpret.kernel.prepared_kernel import PreparedKernel

__all__ = ["launch_key"]


def launch_key(kernel: PreparedKernel, grid: tuple[int, ...], points: list[tuple[int, ...]],
               vmapped: tuple[int, ...], fill: str, specs: list[Any]) -> str | None:
    """``"whole launch <digest>"`` for one launch of ``kernel``, or None."""
    k = kernel
    described = {
        "jaxpr": k.jaxpr, "grid_mapping": k.grid_mapping, "mesh": k.mesh,
        "compiler_params": k.compiler_params, "aliases": k.input_output_aliases,
        "out_avals": k.out_avals, "scalars": len(k.scalar_names), "inputs": k.inputs,
        "outputs": k.outputs, "scratch": [s.aval for s in k.scratch],
        "debug_checks": k.debug_checks, "core_map": k.is_core_map,
    }
    key = call_key(described, [jc.ShapedArray(s.shape, s.dtype) for s in specs],
                   "whole launch", grid, points, vmapped, fill,
                   sorted(jax.config.values.items()))
    return None if key is None else f"whole launch {key}"
