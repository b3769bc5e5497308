"""BLAS runs single-threaded while a kernel is interpreted, and is restored afterwards.

Products are not compared bit for bit with those of a threaded BLAS: a BLAS may pick
other kernels or blockings for another thread count, which changes the last bits on
some CPUs (seen on an AMD EPYC with AVX2).
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from threadpoolctl import ThreadpoolController

import palladium.interpret as pi
from palladium.interpret.state.process_state import STATE

blas_threads, single_threaded_blas = STATE.blas.threads, STATE.blas.held


@pytest.fixture
def two_blas_threads():
    """numpy's BLAS at 2 threads (where it has one), so that a limit to 1 is visible."""
    controller = ThreadpoolController()
    if not controller.select(user_api="blas").lib_controllers:
        pytest.skip("numpy uses no BLAS that threadpoolctl knows")
    with controller.limit(limits=2, user_api="blas"):
        yield


def test_single_threaded_inside_and_restored_after(two_blas_threads):
    before = blas_threads()
    with single_threaded_blas():
        assert blas_threads() == 1
        with single_threaded_blas():  # nested launches (several devices) keep the limit
            assert blas_threads() == 1
        assert blas_threads() == 1
    assert blas_threads() == before


@pytest.mark.timeout(60)
def test_limit_held_until_the_last_concurrent_launch_leaves(two_blas_threads):
    before = blas_threads()
    entered, release = threading.Event(), threading.Event()

    def other_launch():
        with single_threaded_blas():
            entered.set()
            release.wait(30)

    t = threading.Thread(target=other_launch)
    t.start()
    entered.wait(30)
    with single_threaded_blas():
        pass
    assert blas_threads() == 1  # the other launch is still running
    release.set()
    t.join(30)
    assert blas_threads() == before


@pytest.mark.timeout(120)
def test_a_kernel_launch_runs_with_one_blas_thread(two_blas_threads):
    seen = []
    before = blas_threads()

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    x = jax.random.normal(jax.random.key(0), (2 * 128, 128), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (128, 128), jnp.float32)
    params = pi.InterpretParams(grid_point_recorder=lambda point, core: seen.append(blas_threads()))
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((2 * 128, 128), jnp.float32),
        grid=(2,),
        in_specs=[
            pl.BlockSpec((128, 128), lambda i: (i, 0)),
            pl.BlockSpec((128, 128), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)),
        interpret=params,
    )(x, y)
    np.testing.assert_allclose(out, np.asarray(x) @ np.asarray(y), rtol=1e-5, atol=1e-4)
    assert seen == [1, 1]
    assert blas_threads() == before  # restored after the launch
