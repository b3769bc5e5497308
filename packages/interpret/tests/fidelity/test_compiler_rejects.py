"""fidelity/compiler_rejects.py: the run-time checks of what the TPU compiler rejects
(the evaluator's DMA and MXU rules ask it; their error tests are tests/eval/test_mxu.py
and tests/eval/test_host_memory.py)."""

import doctest

import pytest

from palladium.interpret.fidelity import compiler_rejects as rejects
from palladium.shared_memory import MemorySpace as M


def test_the_docstring_examples_run():
    failures, tried = doctest.testmod(rejects)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("dst", [M.VMEM, M.SMEM, M.HOST])
def test_the_host_is_read_only_into_hbm(dst):
    why = rejects.host_dma("v5e", M.HOST, dst)
    assert f"Unimplemented DMA from host to {dst.value.lower()}" in why
    assert rejects.host_dma("v5e", M.HOST, M.HBM) is None


@pytest.mark.parametrize(("chip", "rejected"), [("v4", True), ("v5e", False), (None, False)])
def test_vmem_to_host_needs_v5(chip, rejected):
    assert (rejects.host_dma(chip, M.VMEM, M.HOST) is not None) == rejected


def test_explicit_mxu_operations_need_v7():
    assert "generations < 7" in rejects.explicit_mxu("v6e")
    assert "TPU v5e" in rejects.explicit_mxu(None)  # the default chip
    assert rejects.explicit_mxu("v7x") is None


def test_the_mxu_operands():
    assert rejects.pushed_rhs((256, 256), "float32", 0) is None
    assert rejects.pushed_rhs((128, 256), "float32", 0) == (
        "the pushed RHS must be 256x256, got (128, 256)")
    assert rejects.pushed_rhs((256, 256), "int8", 0) == (
        "unsupported element type for matmul push rhs: int8")
    assert rejects.pushed_rhs((256, 256), "float32", 2) == "invalid staging register: 2 (0 or 1)"
    assert rejects.lhs_operand((16, 256), "bfloat16", 2) is None
    assert "multiple of 16 for bfloat16, got 8" in rejects.lhs_operand((8, 256), "bfloat16", 2)
    assert rejects.accumulator_slice(3, 8, 64) == "acc_addr=3 is not an even accumulator address"
    assert "OOB accumulator access" in rejects.accumulator_slice(14, 16, 64)
    assert rejects.accumulator_slice(12, 16, 64) is None
    assert rejects.popped_shape(8, 128) == "the popped shape must be M x 256, got (8, 128)"
    assert rejects.mxu_index(2, 2, "v7x") == "mxu_index=2, but a TPU v7x core has 2 MXUs"
