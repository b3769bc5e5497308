"""pytest plugin copied as ``conftest.py`` next to jax's extracted test files.

It runs before pytest imports the test modules, and makes jax's own Pallas TPU
interpret-mode tests exercise palladium instead of jax's interpreter:

- ``pltpu.InterpretParams``, ``force_tpu_interpret_mode``, ``set_tpu_interpret_mode``,
  ``reset_tpu_interpret_mode_state`` become palladium.interpret's;
- ``pltpu.emit_pipeline``, ``emit_pipeline_with_allocations``, ``BufferedRef``,
  ``BufferedRefBase``, ``BufferType`` become palladium.pipeline's;
- jax's interpreter reports a race by printing it and setting
  ``mosaic_interpret.races.races_found`` (a fresh state per launch); palladium raises
  ``DataRaceError`` by default. Here ``InterpretParams`` defaults to
  ``on_race="collect"`` and ``mosaic_interpret.races.races_found`` tells whether the
  launches since it was last read collected a race (the tests read it once per launch);
- ``PallasTest.pallas_call`` (the helper behind ``self.pallas_call`` in
  tpu_pallas_test.py) passes ``interpret=InterpretParams()`` instead of ``True`` when the
  test class sets ``INTERPRET``.

Apart from ``races``, a test that reaches into jax's interpreter module
(``mosaic_interpret.*``) still sees jax's, which palladium never runs.
The number of CPU devices comes from ``XLA_FLAGS``, which run.py sets per suite.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from pathlib import Path

import jax._src.pallas as _jax_pallas
from jax._src.pallas import pallas_call as _pl_lib
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as _mosaic_interpret
from jax.experimental.pallas import tpu as _pltpu

import palladium.interpret as _pi
import palladium.pipeline as _pp


def _test_util_module():
    """jax._src.pallas.pallas_test_util: installed, or the copy run.py extracted (the
    wheel does not ship it)."""
    name = "jax._src.pallas.pallas_test_util"
    try:
        return importlib.import_module(name)
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).with_name("_pallas_test_util.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _jax_pallas.pallas_test_util = module  # type: ignore[attr-defined]
    return module


_ptu = _test_util_module()

_INTERPRET_NAMES = (
    "InterpretParams",
    "force_tpu_interpret_mode",
    "set_tpu_interpret_mode",
    "reset_tpu_interpret_mode_state",
)
_PIPELINE_NAMES = (
    "emit_pipeline",
    "emit_pipeline_with_allocations",
    "BufferedRef",
    "BufferedRefBase",
    "BufferType",
)



@dataclasses.dataclass(frozen=True, kw_only=True)
class InterpretParams(_pi.InterpretParams):
    """palladium's params, reporting races as jax's interpreter does (no exception).

    palladium's TPU fidelity checks (the Mosaic lowering check) are off unless
    ``PALLADIUM_CONFORMANCE_CHECK_LOWERING=1``: jax's suites test an interpreter, and many
    of their kernels (deliberately out-of-bounds blocks, unpadded SMEM scratch) are ones
    a TPU's compiler rejects, which palladium reports first by default.
    """

    on_race: _pi.params.OnRace = "collect"
    check_lowering: bool = os.environ.get("PALLADIUM_CONFORMANCE_CHECK_LOWERING") == "1"


class _RaceState:
    """Stands in for jax's ``RaceDetectionState``: only ``races_found`` is read."""

    @property
    def races_found(self) -> bool:
        return bool(_pi.collected_race_reports())


for _name in _INTERPRET_NAMES:
    setattr(_pltpu, _name, getattr(_pi, _name))
_pltpu.InterpretParams = InterpretParams
_mosaic_interpret.races = _RaceState()
for _name in _PIPELINE_NAMES:
    setattr(_pltpu, _name, getattr(_pp, _name))


def _pallas_call(self, *args, **kwargs):
    interpret = InterpretParams() if self.INTERPRET else False
    return _pl_lib.pallas_call(*args, **kwargs, interpret=interpret)


_ptu.PallasTest.pallas_call = _pallas_call
