"""TPU fidelity checks: a kernel that runs clean under palladium.interpret also compiles
and fits on the TPU it simulates.

* :mod:`.lowering_check`: the kernel goes through jax's Mosaic lowering for the chip
  (``TpuLoweringError`` at the kernel's line when Mosaic rejects it).
* :mod:`.memory_budget`: the VMEM and SMEM the kernel certainly holds per core, against
  the chip's limits (``TpuResourceError``); the numbers of every launch are
  ``LaunchInfo.memory``.
* :mod:`.approx_rules`: what the TPU compiler rejects after Mosaic's lowering accepted
  the kernel (dtypes per operation, layouts, alignment, MXU dtypes, grid semantics),
  learned from the compiler per chip (``benchmarks/compiler_agreement.py``).
* :mod:`.tpu_compiler`, :mod:`.compiler_check`: the TPU compiler's own verdict, with
  libtpu installed.
"""
