"""Kernels built on jax's own ``pltpu.emit_pipeline`` (inlined, the way jax 0.10.2's docs
teach pipelining) under palladium on a CPU: jax's emitter asks ``tpu_info`` for the TPU's
tiling while the kernel is traced, and palladium answers with the chip it simulates
(before, every route failed with "Unsupported TPU device kind: cpu"). Results against
numpy; races, the timeline, ``predict`` and the compile check on such kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.race_detect import DataRaceError

pytest_plugins = ["pytester"]

ANY = pl.BlockSpec(memory_space=pl.ANY)


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """palladium simulates on the CPU device; on a TPU host (``nox -s tpu`` runs this
    module there too) the CPU is made the default device, as a user beside the chip does."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def matmul_kernel(block):
    bm, bk, bn = block

    def kernel(x_hbm, y_hbm, o_hbm):
        def body(x, y, o):
            @pl.when(pl.program_id(2) == 0)
            def _():
                o[...] = jnp.zeros_like(o)

            o[...] += jnp.dot(x[...], y[...], preferred_element_type=jnp.float32)

        m, k = x_hbm.shape
        n = y_hbm.shape[1]
        pltpu.emit_pipeline(
            body, grid=(m // bm, n // bn, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
            out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))],
        )(x_hbm, y_hbm, o_hbm)

    return kernel


def matmul(x, y, block=(64, 128, 128), interpret=None):
    return pl.pallas_call(
        matmul_kernel(block), out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]),
                                                             jnp.float32),
        in_specs=[ANY, ANY], out_specs=ANY, interpret=interpret)(x, y)


def _operands():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 384), np.float32)
    y = rng.standard_normal((384, 256), np.float32)
    return x, y, x.astype(np.float64) @ y.astype(np.float64)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route", ["interpret_params", "forced", "jit"])
def test_jax_emit_pipeline_matmul_matches_numpy(route):
    x, y, expected = _operands()
    params = pi.InterpretParams(detect_races=True)
    if route == "interpret_params":
        out = matmul(x, y, interpret=params)
    elif route == "forced":
        with pi.force_tpu_interpret_mode(params):
            out = matmul(x, y)
    else:
        out = jax.jit(lambda a, b: matmul(a, b, interpret=params))(x, y)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=2e-5, atol=2e-4)


def racing_kernel(x_hbm, o_hbm, sem):
    """Copies ``x`` into ``o`` twice at once: jax's pipeline and a whole-array DMA waited
    for only after the pipeline: the two write ``o`` unordered (a write-write race)."""
    copy = pltpu.make_async_copy(x_hbm, o_hbm, sem)
    copy.start()

    def body(xv, ov):
        ov[...] = xv[...]

    pltpu.emit_pipeline(body, grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                        out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(x_hbm, o_hbm)
    copy.wait()


@pytest.mark.timeout(120)
def test_races_between_jax_pipeline_and_a_dma_are_reported():
    x = np.arange(32 * 128, dtype=np.float32).reshape(32, 128)
    call = pl.pallas_call(
        racing_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
        in_specs=[ANY], out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA],
        interpret=pi.InterpretParams(detect_races=True))
    with pytest.raises(DataRaceError) as info, pi.errors_as_raised():
        jax.block_until_ready(call(x))
    assert "o_hbm" in str(info.value)


@pytest.mark.timeout(120)
def test_timeline_and_predict_see_the_pipeline_dmas():
    x, y, _ = _operands()
    with pi.timeline() as tl:
        jax.block_until_ready(matmul(x, y, interpret=pi.InterpretParams()))
    [launch] = tl.launches
    assert launch.predicted_seconds > 0
    assert "dma" in launch.summary().lower()
    spec = [jax.ShapeDtypeStruct((1024, 1024), jnp.float32)] * 2
    small = pi.predict(lambda a, b: matmul(a, b, block=(128, 128, 128)), *spec,
                       chip="v5e", compile_check="approximate")
    big = pi.predict(lambda a, b: matmul(a, b, block=(512, 512, 512)), *spec,
                     chip="v5e", compile_check="approximate")
    assert small.compiles and big.compiles
    assert small.predicted_seconds > 0 and big.predicted_seconds > 0


@pytest.mark.timeout(120)
def test_compile_check_rejects_jax_pipeline_buffers_over_vmem():
    # Two 4096x4096 f32 input buffers per operand: 2 x 2 x 64 MiB of VMEM, over any chip's.
    spec = [jax.ShapeDtypeStruct((4096, 4096), jnp.float32)] * 2
    verdict = pi.predict(lambda a, b: matmul(a, b, block=(4096, 4096, 4096)), *spec,
                         chip="v5e", compile_check="approximate")
    assert not verdict.compiles
    assert "VMEM" in verdict.reason


@pytest.mark.timeout(60)
def test_palladium_params_placed_on_a_tpu_are_refused_not_silently_run_by_jax():
    """Lowered for a TPU, jax's own rule would run palladium's params under jax's HLO
    interpreter, without races, bounds or the compile check: palladium says where to run
    instead."""
    x, y, _ = _operands()
    traced = jax.jit(lambda a, b: matmul(a, b, interpret=pi.InterpretParams())).trace(x, y)
    with pytest.raises(pi.ConfigError, match="simulates TPU kernels on the CPU device"):
        traced.lower(lowering_platforms=("tpu",))


PLUGIN_SUITE = '''
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

pytest_plugins = ["pytester"]

ANY = pl.BlockSpec(memory_space=pl.ANY)
X = np.arange(32 * 128, dtype=np.float32).reshape(32, 128)


def body(x, o):
    o[...] = x[...] * 2.0


def pipelined(x_hbm, o_hbm):
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)


def racing(x_hbm, o_hbm, sem):
    copy = pltpu.make_async_copy(x_hbm, o_hbm, sem)
    copy.start()
    pipelined(x_hbm, o_hbm)
    copy.wait()


def call(kernel, **kw):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, jnp.float32),
                          in_specs=[ANY], out_specs=ANY, interpret=True, **kw)


def test_clean():
    np.testing.assert_array_equal(call(pipelined)(X), X * 2)


def test_racing():
    call(racing, scratch_shapes=[pltpu.SemaphoreType.DMA])(X)
'''


@pytest.mark.timeout(240)
def test_pytest_plugin_runs_jax_pipeline_kernels(pytester, monkeypatch):
    pytester.makepyfile(test_jax_pipelines=PLUGIN_SUITE)
    # One process at a time can hold a TPU (this one may, under `nox -s tpu`): the
    # subprocess simulates on the CPU anyway.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    result = pytester.runpytest_subprocess("-rA", "-p", "no:randomly", "--palladium",
                                           "--palladium-races", "test_jax_pipelines.py")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*_ test_racing _*", "*DataRaceError: data race on 'o_hbm*"])
