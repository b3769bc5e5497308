"""The timeline and performance model: a kernel launch on simulated TPU clocks.

>>> import jax, jax.numpy as jnp
>>> from jax.experimental import pallas as pl
>>> import palladium.interpret as pi
>>> def double(x_ref, o_ref):
...     o_ref[...] = x_ref[...] * 2
>>> x = jnp.ones((1024, 1024), jnp.float32)
>>> f = pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(8,),
...     in_specs=[pl.BlockSpec((128, 1024), lambda i: (i, 0))],
...     out_specs=pl.BlockSpec((128, 1024), lambda i: (i, 0)),
...     interpret=pi.InterpretParams(chip="v5e"))
>>> with pi.timeline() as tl:
...     _ = jax.block_until_ready(f(x))
>>> rec = tl.launches[-1]
>>> rec.bound, round(rec.predicted_seconds * 1e6)   # 4 MiB read, 4 MiB written (v5e)
('HBM', 13)
"""

from palladium.interpret.perf.model import ChipModel, chip_model
from palladium.interpret.perf.record import LaunchRecord
from palladium.interpret.perf.timeline import Timeline, timeline

__all__ = ["ChipModel", "LaunchRecord", "Timeline", "chip_model", "timeline"]
