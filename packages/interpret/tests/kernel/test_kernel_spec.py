"""A prepared kernel is its frozen ``KernelSpec`` and the state its launches keep."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import palladium.interpret as pi
from palladium.interpret.kernel.kernel_spec import KernelSpec
from palladium.interpret.kernel.prepared_kernel import PreparedKernel
from palladium.interpret.observe.observers import scoped_launch_observer


def _kernels_of_one_call() -> list:
    seen = []

    def factory(info):
        seen.append(info.kernel)

    def add_one(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    f = pl.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       interpret=pi.InterpretParams())
    with scoped_launch_observer(factory):
        out = jax.block_until_ready(f(x))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) + 1)
    return seen


@pytest.mark.timeout(120)
def test_the_spec_is_frozen_and_the_kernel_reads_its_facts_through():
    (kernel,) = _kernels_of_one_call()
    assert isinstance(kernel, PreparedKernel) and isinstance(kernel.spec, KernelSpec)
    assert kernel.name == kernel.spec.name == "add_one"
    assert kernel.jaxpr is kernel.spec.jaxpr
    assert [i.name for i in kernel.inputs] == ["x_ref"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        kernel.spec.name = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        kernel.name = "other"  # a static fact is the spec's, not settable on the kernel
    # the state its launches keep is the kernel's own
    assert kernel.programs is not None and kernel.reads_uninitialized is False
    kernel.memory_use = None
