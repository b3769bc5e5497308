"""predict and sweep with the TPU compiler deciding (libtpu): its verdict, its numbers in
the rejection, its VMEM figure, and the same timeline as the approximation's."""

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import palladium.interpret as pi
from palladium.interpret.fidelity import tpu_compiler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tune"))
from test_tune import matmul  # noqa: E402

S = jax.ShapeDtypeStruct
X = S((2048, 2048), jnp.bfloat16)


@pytest.mark.timeout(300)
def test_predict_says_the_compiler_decided_and_keeps_its_vmem_figure():
    p = pi.predict(functools.partial(matmul, bm=512, bk=1024, bn=1024), X, X, chip="v5e",
                   compile_check="compiler")
    approx = pi.predict(functools.partial(matmul, bm=512, bk=1024, bn=1024), X, X,
                        chip="v5e", compile_check="approximate")
    assert p.compiles
    assert p.checker == f"TPU compiler ({tpu_compiler.checker_name()})"
    assert p.compiler_vmem_bytes is not None and p.compiler_vmem_bytes >= p.vmem_bytes
    assert p.predicted_seconds == approx.predicted_seconds  # the verdict changes no time


@pytest.mark.timeout(300)
def test_a_configuration_the_compiler_rejects_carries_its_numbers():
    p = pi.predict(functools.partial(matmul, bm=2048, bk=2048, bn=2048), X, X, chip="v5e",
                   compile_check="compiler")
    assert not p.compiles and p.error == "TpuResourceError"
    # one grid step: no second buffer, so 33.83M (the compiler's figure, its scratch in)
    assert p.reason.startswith("kernel 'matmul_kernel' (pallas_call at test_tune.py:")
    assert p.reason.split(") ", 1)[1] == (
        f"does not fit on TPU v5e: the TPU compiler ({tpu_compiler.checker_name()}, topology "
        f"v5e:2x2) says: JaxRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: "
        f"Scoped allocation with size 33.83M and limit 16.00M exceeded scoped vmem limit by "
        f"17.83M.")
