"""An access is resolved once: a kernel's loads, stores, DMAs and block copies hand the
simulator plans kept per equation (or per block), so the number of region resolutions
and race-detector preparations does not grow with the number of grid steps, and the
detector only ever receives prepared accesses (one seam from the simulator to it)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from palladium.interpret import InterpretParams
from palladium.race_detect import PreparedAccess, RaceDetector
from palladium.shared_memory import buffers as buffers_module
from palladium.shared_memory import regions as regions_module


def _kernel(x_ref, y_hbm, o_ref, scratch, sem):
    copy = pltpu.make_async_copy(y_hbm.at[pl.ds(0, 8)], scratch, sem)
    copy.start()
    copy.wait()
    o_ref[...] = x_ref[...] * 2.0 + scratch[...]
    o_ref[0:4, :] = o_ref[0:4, :] + 1.0


def _call(steps, x, y):
    return pl.pallas_call(
        _kernel,
        grid=(2, steps),  # the input's block alternates: copied in on every step
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (j % 2, 0)),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=InterpretParams(detect_races=True, on_race="raise"),
    )(x, y)


@pytest.mark.timeout(120)
def test_resolutions_do_not_grow_with_grid_steps_and_the_detector_gets_prepared_accesses(
    monkeypatch,
):
    counts = {"resolve": 0, "prepare": 0}
    regions_seen = []
    real_resolve, real_prepare = buffers_module.resolve, regions_module.prepare

    def resolve(*args):
        counts["resolve"] += 1
        return real_resolve(*args)

    def prepare(*args):
        counts["prepare"] += 1
        return real_prepare(*args)

    monkeypatch.setattr(buffers_module, "resolve", resolve)
    monkeypatch.setattr(regions_module, "prepare", prepare)
    for name in ("read", "write"):
        method = getattr(RaceDetector, name)

        def spy(self, actor, key, region=None, site=None, *, mask=None, _method=method):
            regions_seen.append(region)
            return _method(self, actor, key, region, site, mask=mask)

        monkeypatch.setattr(RaceDetector, name, spy)

    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    y = jnp.ones((16, 128), jnp.float32)
    per_steps = {}
    for steps in (2, 8):
        counts.update(resolve=0, prepare=0)
        del regions_seen[:]
        out = np.asarray(_call(steps, x, y))
        last = np.asarray(x)[8:16] * 2.0 + 1.0  # the last step (odd j) read block 1
        last[0:4] += 1.0
        want = np.concatenate([last, last])
        np.testing.assert_array_equal(out, want)
        per_steps[steps] = dict(counts)
        assert regions_seen and all(type(r) is PreparedAccess for r in regions_seen)
    assert per_steps[8] == per_steps[2], per_steps
    assert 0 < per_steps[8]["prepare"] <= per_steps[8]["resolve"]
