"""How sure a verdict of palladium's approximation is: near the VMEM limit, where the
TPU compiler's internal scratch (which the count cannot size) decides, only the compiler
knows.

Said in ``Prediction.uncertain``, the sweep's table and ranking (sure configurations
first), and the approximation's ``TpuResourceError``.
"""

from __future__ import annotations

from palladium.interpret.fidelity.tpu_compiler import INSTALL_COMMAND

__all__ = ["UNCERTAIN_MARGIN", "uncertainty"]

#: How near the approximation's VMEM count may come to the limit (a fraction of it, on
#: either side) before its verdict is uncertain. Measured: its only false accepts on 590
#: boundary kernels x 5 chips (``benchmarks/compiler_agreement.py``) are a dot whose
#: internal scratch it cannot size, 16.48 MiB of 16.00 (3% over); ``examples/tune_matmul.py
#: --size 2048`` counted (1024, 1024, 1024) at 16.0 of 16 MiB on v5e, which the compiler
#: rejects.
UNCERTAIN_MARGIN = 0.10


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def uncertainty(peak_bytes: int, limit_bytes: int) -> str | None:
    """Why a verdict of the approximation on a VMEM count of ``peak_bytes`` against
    ``limit_bytes`` is uncertain (within ``UNCERTAIN_MARGIN`` of the limit, either side),
    or None.

    The values a kernel computes (``MemoryUse.intermediates_peak_bytes``) are not used:
    they count a dot's whole result (4 MiB for a 1024x1024 f32 block) where the compiler
    measured 0.48 MiB of internal scratch, and would call most matmul blocks uncertain.
    """
    if limit_bytes <= 0 or abs(peak_bytes - limit_bytes) > UNCERTAIN_MARGIN * limit_bytes:
        return None
    return (f"uncertain: palladium's approximation counts {_mib(peak_bytes)} of "
            f"{_mib(limit_bytes)} VMEM, within {UNCERTAIN_MARGIN:.0%} of the limit, where "
            f"the TPU compiler's internal scratch (which the count cannot size) decides; "
            f"{INSTALL_COMMAND} for the TPU compiler's verdict")
