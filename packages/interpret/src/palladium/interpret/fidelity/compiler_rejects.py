"""What the TPU compiler rejects that only a run shows: the one home of those decisions.

The evaluator meets some kernels the compiler would reject only when it runs them: a DMA
between memory spaces known once its refs are, an explicit MXU operation's operands and
addresses. The rules that meet them (``eval/rules_dma.py``, ``eval/rules_mxu.py``) ask
this module, which answers why the compiler rejects it (None: it accepts), and raise
``TpuLoweringError`` with that reason where the kernel ran. Like ``approx_rules`` (what
the compiler rejects that the kernel's jaxpr shows), every answer was measured against
libtpu 0.0.42.1: ``tests/compiler/test_host_memory.py``, ``tests/compiler/test_mxu.py``.

It imports nothing above the chip record: the evaluator's rules may ask it (the one
exception to the folder layers, named in ``.importlinter``).

>>> from palladium.shared_memory import MemorySpace as M
>>> host_dma("v4", M.VMEM, M.HOST).startswith("the TPU compiler for TPU v4 cannot compile")
True
>>> host_dma("v5e", M.VMEM, M.HOST) is None, pushed_rhs((256, 256), "bfloat16", 1)
(True, None)
"""

from __future__ import annotations

from palladium.interpret.chip import DEFAULT_CHIP, chip_record
from palladium.shared_memory import MemorySpace

__all__ = ["ROWS_PER_ADDRESS", "RHS_SIZE", "accumulator_slice", "explicit_mxu",
           "full_staging_register", "host_dma", "lhs_operand", "mxu_index", "popped_shape",
           "pushed_rhs"]

_HOST = MemorySpace.HOST


def host_dma(chip: str | None, src: MemorySpace, dst: MemorySpace) -> str | None:
    """Why the compiler rejects a DMA from ``src`` to ``dst`` on ``chip`` (None: the
    params name no chip), or None where it accepts it.

    From the host only into HBM ("Unimplemented DMA from host to vmem" / "to smem" / "to
    host"); into the host from HBM, and from VMEM and SMEM from v5 on (v4's compiler
    aborts on VMEM: "Unexpected opcode: kDmaVmemToHost", and rejects SMEM:
    "Unimplemented DMA from smem to host")."""
    if src is _HOST and dst is not MemorySpace.HBM:
        return (f"the TPU compiler rejects a DMA from the host's memory to {dst.value} "
                f"(\"Unimplemented DMA from host to {dst.value.lower()}\"): a DMA reads the "
                "host's memory only into HBM. Copy it into an HBM ref (memory space pl.ANY) "
                "first")
    if (dst is _HOST and src in (MemorySpace.VMEM, MemorySpace.SMEM)
            and chip is not None and chip_record(chip).generation < 5):
        said = ("it aborts: \"Unexpected opcode: kDmaVmemToHost\"" if src is MemorySpace.VMEM
                else "\"Unimplemented DMA from smem to host\"")
        return (f"the TPU compiler for TPU {chip} cannot compile a DMA from {src.value} to "
                f"the host's memory ({said}; v5e and newer accept it). Copy it into an HBM "
                "ref (memory space pl.ANY) first")
    return None


# --- the explicit MXU operations (TPU v7 and newer) -------------------------------------
RHS_SIZE = 256  #: an RHS is RHS_SIZE x RHS_SIZE; an LHS and a popped slice M x RHS_SIZE
ROWS_PER_ADDRESS = 4  #: accumulator rows per unit of ``acc_addr``
_STAGING_REGISTERS = 2
_PUSH_DTYPES = frozenset({"float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"})


def explicit_mxu(chip: str | None) -> str | None:
    """Why the compiler rejects the explicit MXU operations on ``chip`` (None: the
    default chip), or None where it has them."""
    chip = chip or DEFAULT_CHIP
    facts = chip_record(chip).facts
    if facts.generation < 7 or not facts.num_accumulators:
        return (f"the TPU compiler rejects the explicit MXU operations on TPU {chip} "
                "(\"Explicit MXU ops not supported on TPU generations < 7\")")
    return None


def mxu_index(index: int, num_mxus: int, chip: str | None) -> str | None:
    if not 0 <= index < num_mxus:
        return f"mxu_index={index}, but a TPU {chip} core has {num_mxus} MXUs"
    return None


def accumulator_slice(addr: int, rows: int, accumulator_rows: int) -> str | None:
    """Why ``rows`` rows at ``acc_addr=addr`` are not a slice of the accumulators."""
    units = accumulator_rows // ROWS_PER_ADDRESS
    if addr % 2 or addr < 0:
        return f"acc_addr={addr} is not an even accumulator address"
    if addr + -(-rows // ROWS_PER_ADDRESS) > units:
        return (f"acc_addr={addr} with {rows} rows ends past the {units} accumulator "
                "addresses (\"OOB accumulator access\")")
    return None


def pushed_rhs(shape: tuple[int, ...], dtype: str, register: int) -> str | None:
    if shape != (RHS_SIZE, RHS_SIZE):
        return f"the pushed RHS must be 256x256, got {shape}"
    if dtype not in _PUSH_DTYPES:
        return f"unsupported element type for matmul push rhs: {dtype}"
    if not 0 <= register < _STAGING_REGISTERS:
        return f"invalid staging register: {register} (0 or 1)"
    return None


def full_staging_register(register: int, mxu: int) -> str:
    """Why the compiler rejects a push into a staging register that still holds an RHS
    (the simulation knows it does)."""
    return (f"staging register {register} of MXU {mxu} already holds an RHS not yet loaded "
            "by matmul_acc_lhs (\"Cannot schedule FIFO push instruction when the FIFO is "
            "full\")")


def lhs_operand(shape: tuple[int, ...], dtype: str, itemsize: int) -> str | None:
    if len(shape) != 2 or shape[1] != RHS_SIZE:
        return f"the LHS must be M x 256, got {shape}"
    rows_multiple = 8 * max(1, 4 // itemsize)
    if shape[0] % rows_multiple:
        return (f"the non-contracting dimension of the LHS must be a multiple of "
                f"{rows_multiple} for {dtype}, got {shape[0]}")
    return None


def popped_shape(m: int, n: int) -> str | None:
    if n != RHS_SIZE:
        return f"the popped shape must be M x 256, got {(m, n)}"
    return None
