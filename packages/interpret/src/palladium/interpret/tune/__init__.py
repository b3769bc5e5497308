"""Choosing a kernel's configuration on a CPU: will it compile and fit, how fast.

:func:`predict` answers for one configuration (the compile-and-fit verdict, VMEM/SMEM
use, predicted time, bound, exposed DMA); :func:`sweep` for many, as a table sorted by
predicted time; :func:`cost_estimate` turns recorded launches into jax's
``pl.CostEstimate``; on a TPU host, :func:`measure` times a kernel on the chip (device
time from the jax profiler's trace).
"""

from palladium.interpret.tune.cost_estimate import cost_estimate
from palladium.interpret.tune.measure import Measurement, measure
from palladium.interpret.tune.predict import Prediction, predict
from palladium.interpret.tune.sweep import sweep
from palladium.interpret.tune.sweep_result import SweepResult, SweepRow

__all__ = ["Measurement", "Prediction", "SweepResult", "SweepRow", "cost_estimate", "measure",
           "predict", "sweep"]
