"""What the interpreter knows about one ``pallas_call`` before it runs and that never
changes: its names, blocks, grid, jaxpr and what its DMAs reach (``KernelSpec``, frozen).
Built once per lowering; ``prepared_kernel.PreparedKernel`` adds what its launches keep."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.eval.jaxprs import jaxprs_in
from palladium.interpret.kernel.blocks import BlockSpecInfo, memory_space_of
from palladium.interpret.kernel.dma_reach import (
    RefReach,
    private_positions,
    read_only_positions,
    ref_reach,
)

__all__ = ["KernelSpec", "ScratchInfo", "static_grid_points"]

# Names that say nothing: a ``core_map`` body written as ``@pl.core_map(mesh) def _():``
# (jax's documented style) or a lambda is reported under the function that wrote it.
_ANONYMOUS = ("_", "<lambda>")


def static_grid_points(gm: Any) -> int:
    """How many grid points a launch runs (1 if a dimension is only known at run time)."""
    n = 1
    for d in getattr(gm, "grid", ()):
        if not isinstance(d, int | np.integer):
            return 1
        n *= int(d)
    return n


def _kernel_name(jaxpr: Any, name: str | None, enclosing: str | None = None) -> str:
    if name:
        out = str(name)
    else:
        info = getattr(jaxpr.debug_info, "func_src_info", None) if jaxpr.debug_info else None
        out = str(info).split(" at ")[0] if info else "<kernel>"
    enclosing = enclosing.rsplit(".", 1)[-1] if enclosing else None  # jax gives qualnames
    if out in _ANONYMOUS and enclosing and enclosing not in _ANONYMOUS + ("<module>",):
        return f"{enclosing}.{out}"
    return out


@dataclasses.dataclass(frozen=True)
class ScratchInfo:
    name: str
    aval: Any


@dataclasses.dataclass(frozen=True, eq=False)
class KernelSpec:
    """A pallas_call's static description: what is known of it once it is lowered, and
    never changes (``PreparedKernel`` adds what its launches keep)."""

    jaxpr: Any
    grid_mapping: Any
    mesh: Any
    compiler_params: Any
    input_output_aliases: tuple[tuple[int, int], ...]
    out_avals: tuple[Any, ...]
    name: str
    scalar_names: tuple[str, ...]
    inputs: tuple[BlockSpecInfo, ...]
    outputs: tuple[BlockSpecInfo, ...]
    scratch: tuple[ScratchInfo, ...]
    call_site: str | None = None  # "file.py:line" of the pallas_call / core_map call
    # id(eqn) -> the source info to report for an equation of a nested jaxpr that has
    # no user frame of its own (e.g. the DMA inside ``pltpu.sync_copy``'s run_scoped):
    # that of the innermost enclosing equation that has one.
    inherited_sources: dict[int, Any] = dataclasses.field(default_factory=dict)
    #: ``pl.enable_debug_checks`` when the kernel was lowered: ``pl.debug_check`` checks.
    debug_checks: bool = False
    #: The ref variables (any depth) a DMA may reach or anything may write
    #: (``dma_reach``); None: assume all.
    reach: RefReach | None = None
    #: The operand positions no DMA reaches: their VMEM/SMEM buffers are private.
    private_positions: frozenset[int] = frozenset()
    #: The inputs (indices into ``inputs``) nothing writes and no output aliases: their
    #: HBM buffers are read-only for the launch.
    read_only_inputs: frozenset[int] = frozenset()

    def scalar_key(self, args: Any) -> bytes:
        """The bytes of a launch's dynamic grid bounds and scalar-prefetch operands
        (``args``: one device's operands)."""
        gm = self.grid_mapping
        n = gm.num_dynamic_grid_bounds + gm.num_index_operands
        return b"|".join(np.ascontiguousarray(a).tobytes() for a in args[:n])

    def is_private(self, var: Any) -> bool:
        """Whether no DMA of the kernel reaches the ref bound to ``var``."""
        return self.reach is not None and var not in self.reach.named

    @property
    def launch_location(self) -> str | None:
        """Where block copies and revisits are reported: the ``pallas_call`` line when
        jax kept it, else the kernel function's definition."""
        return self.call_site or self.location

    def named(self, at: str = "") -> str:
        """``kernel 'name' (<at>file:line)``, as messages name the kernel (where it was
        launched: ``launch_location``; without one, ``kernel 'name'``)."""
        where = self.launch_location
        return f"kernel '{self.name}'" + (f" ({at}{where})" if where else "")

    @property
    def location(self) -> str | None:
        """``file.py:line`` of the kernel function's definition."""
        info = getattr(self.jaxpr.debug_info, "func_src_info", None) if self.jaxpr.debug_info else None
        if not info or " at " not in str(info):
            return None
        return os.path.basename(str(info).rsplit(" at ", 1)[1])

    @classmethod
    def from_params(cls, *, jaxpr: Any, grid_mapping: Any, mesh: Any, compiler_params: Any,
                    input_output_aliases: Any, out_avals: Any, name: Any = None,
                    call_site: tuple[str, int] | tuple[str, int, str] | None = None,
                    **_: Any) -> KernelSpec:
        """``call_site``: (file, line[, enclosing function]) of the user's call."""
        gm = grid_mapping
        arg_names = getattr(jaxpr.debug_info, "arg_names", None) if jaxpr.debug_info else None
        n_idx, n_in, n_out = gm.num_index_operands, gm.num_inputs, gm.num_outputs
        n_scratch = len(jaxpr.invars) - n_idx - n_in - n_out

        def named(i: int, fallback: str) -> str:
            if arg_names is not None and i < len(arg_names) and arg_names[i]:
                return str(arg_names[i])
            return fallback

        scalar_names = tuple(named(i, f"scalar_prefetch[{i}]") for i in range(n_idx))
        bms = gm.block_mappings
        inputs = tuple(
            BlockSpecInfo.from_mapping(bms[i], named(n_idx + i, _origin(bms[i], f"inputs[{i}]")))
            for i in range(n_in)
        )
        outputs = tuple(
            BlockSpecInfo.from_mapping(
                bms[n_in + i], named(n_idx + n_in + i, _origin(bms[n_in + i], f"outputs[{i}]"))
            )
            for i in range(n_out)
        )
        scratch_vars = jaxpr.invars[n_idx + n_in + n_out :]
        scratch = tuple(
            ScratchInfo(named(n_idx + n_in + n_out + i, f"scratch_shapes[{i}]"), v.aval)
            for i, v in enumerate(scratch_vars)
        )
        assert len(scratch) == n_scratch
        aliased = {int(i) for i, _ in input_output_aliases}  # inputs an output overwrites
        return cls(
            jaxpr=jaxpr,
            grid_mapping=gm,
            mesh=mesh,
            compiler_params=compiler_params,
            input_output_aliases=tuple(input_output_aliases),
            out_avals=tuple(out_avals),
            name=_kernel_name(jaxpr, name, call_site[2] if call_site and len(call_site) > 2
                              else None),
            scalar_names=scalar_names,
            inputs=inputs,
            outputs=outputs,
            scratch=scratch,
            call_site=(f"{os.path.basename(call_site[0])}:{call_site[1]}"
                       if call_site is not None else None),
            inherited_sources=_inherited_sources(jaxpr),
            debug_checks=jc.pallas_debug_checks_enabled(),
            reach=(reach := ref_reach(jaxpr)),
            private_positions=private_positions(jaxpr, reach),
            read_only_inputs=frozenset(
                i - n_idx for i in read_only_positions(jaxpr, reach)
                if n_idx <= i < n_idx + n_in and i not in aliased),
        )

    @property
    def is_core_map(self) -> bool:
        return isinstance(self.mesh, jc.TensorCoreMesh)

    @property
    def core_axis_names(self) -> tuple[Any, ...]:
        return tuple(self.mesh.shape.keys()) if self.mesh is not None else ()

    def scratch_space(self, i: int) -> Any:
        return memory_space_of(getattr(self.scratch[i].aval, "memory_space", None))


def _origin(bm: Any, fallback: str) -> str:
    origin = getattr(bm, "origin", None)
    return str(origin) if origin else fallback


def _inherited_sources(jaxpr: Any) -> dict[int, Any]:
    """For every equation of ``jaxpr``'s nested jaxprs whose traceback has no user frame,
    the source info of its innermost enclosing equation that has one (computed once per
    kernel, so error sites cost a dict lookup)."""
    out: dict[int, Any] = {}
    seen: set[int] = set()

    def walk(jx: Any, outer: Any) -> None:
        if id(jx) in seen:
            return
        seen.add(id(jx))
        for eqn in jx.eqns:
            own = eqn.source_info
            if jc.user_frame(own) is None and outer is not None:
                out[id(eqn)] = outer
                own = outer
            for value in eqn.params.values():
                for sub in jaxprs_in(value):
                    walk(sub, own)

    walk(jaxpr, None)
    return out
