"""The interpreter's side of the observer seam: launch observers see every launch's
grid steps, pipeline block copies (with their buffer counts), compute equations and the
simulator's events; re-runs of ``dma_order_trials`` are not shown to them."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from palladium.interpret import InterpretParams
from palladium.interpret.observe.observers import add_launch_observer, remove_launch_observer
from palladium.shared_memory import MemorySpace, Observer

X = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)


class Events(Observer):
    def __init__(self, info):
        self.info = info
        self.steps, self.copies, self.prims, self.allocs = [], [], [], []
        self.runs = 0

    def grid_step_begin(self, core, step, grid_point):
        self.steps.append(("begin", core, step, grid_point))

    def grid_step_end(self, core, step, grid_point):
        self.steps.append(("end", core, step, grid_point))

    def block_copy(self, copy):
        self.copies.append(copy)

    def compute(self, core, eqn):
        self.prims.append(str(eqn.primitive))

    def allocate(self, buf, nbytes, core):
        self.allocs.append((buf.space, buf.name, nbytes))

    def run_end(self, cores):
        self.runs += 1


@contextlib.contextmanager
def observing():
    seen = []

    def factory(info):
        seen.append(Events(info))
        return seen[-1]

    add_launch_observer(factory)
    try:
        yield seen
    finally:
        remove_launch_observer(factory)


def _double(x, params, in_mode=None):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    spec = (pl.BlockSpec((8, 128), lambda i: (i, 0)) if in_mode is None
            else pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=in_mode))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
        in_specs=[spec], out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        interpret=params,
    )(x)


@pytest.mark.parametrize("jit", [False, True])
def test_a_launch_reports_grid_steps_copies_and_equations(jit):
    fn = jax.jit(_double, static_argnums=(1,)) if jit else _double
    with observing() as seen:
        out = jax.block_until_ready(fn(X, InterpretParams()))
    np.testing.assert_array_equal(out, X * 2)
    (obs,) = seen
    assert (obs.info.kernel_name, obs.info.grid, obs.info.num_devices) == ("kernel", (4,), 1)
    assert obs.steps == [(e, (0, 0), s, (s,)) for s in range(4) for e in ("begin", "end")]
    ins = [(c.operand, c.block, c.step, c.nbytes, c.buffer_count) for c in obs.copies
           if c.direction == "in"]
    outs = [(c.operand, c.block, c.step, c.space) for c in obs.copies if c.direction == "out"]
    assert ins == [("x_ref", (s, 0), s, 4096, 2) for s in range(4)]
    assert outs == [("o_ref", (s, 0), s, MemorySpace.VMEM) for s in range(4)]
    assert obs.prims.count("mul") == 4 and obs.prims.count("get") == 4
    assert ("VMEM", "x_ref", 4096) in [(s.value, n, b) for s, n, b in obs.allocs]
    assert obs.runs == 1


def test_buffered_pipeline_mode_is_reported():
    with observing() as seen:
        _double(X, InterpretParams(), in_mode=pl.Buffered(3))
    copies = {c.operand: c.buffer_count for c in seen[0].copies}
    assert copies == {"x_ref": 3, "o_ref": 2}


def test_order_trials_are_not_observed():
    with observing() as seen:
        _double(X, InterpretParams(dma_order="random", dma_order_trials=2))
    assert len(seen) == 1


def test_no_factory_no_observers(monkeypatch):
    from palladium.interpret.run import launch as launch_mod
    created = []
    original = launch_mod.Launch.execute_devices

    def spy(self, device_args):
        try:
            return original(self, device_args)
        finally:
            created.append(self.sim.observers)

    monkeypatch.setattr(launch_mod.Launch, "execute_devices", spy)
    _double(X, InterpretParams())
    assert created == [None]
