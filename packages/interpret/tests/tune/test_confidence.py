"""A verdict of palladium's approximation near the VMEM limit is "uncertain" in the
Prediction, the sweep's table and ranking (sure configurations first) and the error
text, with the one line that gets the TPU compiler's own verdict. The case of issue 44:
examples/tune_matmul.py --size 2048 ranked (1024, 1024, 1024) first at 16.0 of 16 MiB on
v5e, which the TPU compiler rejects."""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi
from palladium.interpret.fidelity.confidence import UNCERTAIN_MARGIN, uncertainty

pytestmark = pytest.mark.timeout(300)

MiB = 2**20
S = jax.ShapeDtypeStruct
INSTALL = "pip install 'palladium-interpret[compiler]' for the TPU compiler's verdict"


def matmul(x, y, *, bm, bk, bn):
    def kernel(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    (m, k), n = x.shape, y.shape[1]
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


OPERAND = S((2048, 2048), jnp.bfloat16)


def test_the_margin_is_ten_percent_of_the_limit_on_either_side():
    limit = 16 * MiB
    assert UNCERTAIN_MARGIN == 0.10
    assert uncertainty(limit, limit).startswith(
        "uncertain: palladium's approximation counts 16.00 MiB of 16.00 MiB VMEM, within "
        "10% of the limit")
    assert uncertainty(limit, limit).endswith(INSTALL)
    edge = int(0.1 * limit)
    assert uncertainty(limit - edge, limit) is not None
    assert uncertainty(limit - edge - 1, limit) is None
    assert uncertainty(limit + edge, limit) is not None
    assert uncertainty(limit + edge + 1, limit) is None


def test_the_matmul_at_the_limit_is_an_uncertain_prediction():
    at_limit = pi.predict(functools.partial(matmul, bm=1024, bk=1024, bn=1024), OPERAND,
                          OPERAND, chip="v5e", compile_check="approximate")
    assert at_limit.compiles and at_limit.vmem_bytes == 16 * MiB
    assert at_limit.uncertain == (
        "uncertain: palladium's approximation counts 16.00 MiB of 16.00 MiB VMEM, within 10% "
        "of the limit, where the TPU compiler's internal scratch (which the count cannot "
        f"size) decides; {INSTALL}")
    assert at_limit.summary().splitlines()[1] == f"  {at_limit.uncertain}"
    clear = pi.predict(functools.partial(matmul, bm=512, bk=1024, bn=1024), OPERAND, OPERAND,
                       chip="v5e", compile_check="approximate")
    assert clear.compiles and clear.vmem_bytes == 10 * MiB and clear.uncertain is None


def _configs():
    return [{"bm": 1024, "bk": 1024, "bn": 1024}, {"bm": 512, "bk": 1024, "bn": 1024},
            {"bm": 256, "bk": 512, "bn": 512}, {"bm": 1024, "bk": 2048, "bn": 1024}]


def _call(bm, bk, bn):
    return functools.partial(matmul, bm=bm, bk=bk, bn=bn)


def test_a_sweep_ranks_the_sure_configurations_first_and_marks_the_uncertain():
    result = pi.sweep(_call, _configs(), OPERAND, OPERAND, chip="v5e",
                      compile_check="approximate")
    ranked = [(row.label, row.verdict) for row in result.ranked]
    # (1024, 1024, 1024) is predicted as fast as (512, 1024, 1024) but may not compile
    assert ranked == [("bm=512, bk=1024, bn=1024", "compiles"),
                      ("bm=256, bk=512, bn=512", "compiles"),
                      ("bm=1024, bk=1024, bn=1024", "compiles, uncertain")]
    assert result.ranked[2].predicted_seconds <= result.ranked[1].predicted_seconds
    assert result.best.label == "bm=512, bk=1024, bn=1024"
    [rejected] = result.rejected  # 24 MiB: 50% over the limit, a sure rejection
    assert rejected.verdict == "rejected" and rejected.uncertain is None
    lines = result.table().splitlines()
    assert lines[0] == ("| rank | config | verdict | predicted_us | bound | exposed_dma_us | "
                        "vmem_mib | reason |")
    assert lines[4].startswith("| 3 | bm=1024, bk=1024, bn=1024 | compiles, uncertain | ")
    assert lines[4].endswith(f"| 16.0 | uncertain: palladium's approximation counts 16.00 MiB "
                             f"of 16.00 MiB VMEM, within 10% of the limit, where the TPU "
                             f"compiler's internal scratch (which the count cannot size) "
                             f"decides; {INSTALL} |")


def _scratch_call(mib):
    def kernel(x_ref, o_ref, big_ref):
        big_ref[0:8, :] = x_ref[...]
        o_ref[...] = big_ref[0:8, :]

    rows = int(mib * MiB) // (128 * 4)
    return lambda x: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32)])(x)


def test_a_rejection_just_over_the_limit_says_it_is_uncertain():
    x = S((8, 128), jnp.float32)
    near = pi.predict(_scratch_call(16.5), x, chip="v5e", compile_check="approximate")
    assert not near.compiles and near.error == "TpuResourceError"
    assert near.uncertain is not None and near.uncertain.startswith(
        "uncertain: palladium's approximation counts 16.5")
    assert near.message.splitlines()[-1] == f"This verdict is {near.uncertain}."
    far = pi.predict(_scratch_call(20), x, chip="v5e", compile_check="approximate")
    assert not far.compiles and far.uncertain is None and "uncertain" not in far.message
    # a kernel run (not a prediction) gets the same text from the same check
    with pytest.raises(pi.TpuResourceError, match=r"This verdict is uncertain: palladium's "
                                                  r"approximation counts 16\.5"):
        pl.pallas_call(
            lambda x_ref, o_ref, big_ref: o_ref.__setitem__(..., x_ref[...]),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((int(16.5 * MiB) // 512, 128), jnp.float32)],
            interpret=pi.InterpretParams(compile_check="approximate"))(jnp.ones((8, 128)))
