"""Make the shared test harness of this package importable from its tests, and run the
on-chip mode where a TPU is jax's default backend.

Tests parametrized with ``mode="chip"`` (``_pipeline_harness.CHIP``) and tests marked
``tpu`` compile their kernels with Mosaic and run them on the TPU; elsewhere they are
skipped with the reason. ``pytest -m tpu`` selects them alone (``nox -s tpu``). On a TPU
host every other test runs with the CPU as jax's default device, so the interpreters
(jax's and palladium's) run where they run on a laptop and nothing fails only because
the host has a TPU.
"""

import os
import sys

import jax
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _pipeline_harness import CHIP, NO_TPU, on_a_tpu_host  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "tpu: compiles the kernel for the TPU and runs it on the chip "
        "(skipped where jax's default backend is not a TPU)")


def _answer_tpu_info_in_interpreter_callbacks():
    """jax 0.10.2's TPU interpreter asks ``tpu_info`` for the chip inside its callbacks
    (padded buffers); on a TPU host those run with the CPU as their device and got
    "Unsupported TPU device kind: cpu". jax's registry of device kinds answers for it
    with the host's own chip (a v5e here)."""
    from jax._src.pallas.mosaic import tpu_info

    kind = jax.devices()[0].device_kind
    version = tpu_info.chip_version_from_device_kind(kind)
    if version is not None:
        tpu_info.registry.setdefault(
            "cpu", lambda: tpu_info.get_tpu_info_for_chip(version, 1))


def pytest_collection_modifyitems(config, items):
    # Only markers here: asking jax for its backend would start it while collecting.
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("mode") == CHIP:
            item.add_marker(pytest.mark.tpu)


@pytest.fixture(autouse=True)
def _chip_or_cpu(request):
    """``tpu`` tests run on the chip (skipped without one); on a TPU host every other test
    runs with the CPU as the default device."""
    on_chip = request.node.get_closest_marker("tpu") is not None
    if on_chip and not on_a_tpu_host():
        pytest.skip(NO_TPU)
    if on_a_tpu_host() and not on_chip:
        _answer_tpu_info_in_interpreter_callbacks()
        with jax.default_device(jax.devices("cpu")[0]):
            yield
    else:
        yield
