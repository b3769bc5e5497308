"""The pytest plugin (``pytest --palladium``), run on a small suite of kernel tests with
pytester: clean, racy, deadlocking and out-of-bounds kernels that take ``interpret=True``
(jax's own interpreter, which notices none of the bugs), with and without the plugin
and under pytest-xdist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import palladium.interpret as pi

pytestmark = pytest.mark.serial  # pytest runs of its own, one under xdist: not beside a parallel run

pytest_plugins = ["pytester"]

KERNELS = '''
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def call(kernel, **kw):
    out = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    return pl.pallas_call(kernel, out_shape=out, interpret=True, **kw)


def clean_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def racy_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    o_ref[...] = buf[...] * 2.0  # reads the DMA's destination before the wait
    copy.wait()


def deadlock_kernel(x_ref, o_ref, sem):
    pl.semaphore_wait(sem, 1)  # nobody signals it
    o_ref[...] = x_ref[...]


def oob_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(pl.program_id(0) * 8 + 4, 8), :]  # rows 4:12 of 8


def run_racy():
    return call(racy_kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])(X)
'''

SUITE = '''
from kernels import *


def test_clean():
    np.testing.assert_array_equal(call(clean_kernel)(X), X * 2.0)


def test_racy():
    jax.block_until_ready(run_racy())


def test_deadlock():
    jax.block_until_ready(call(deadlock_kernel, scratch_shapes=[pltpu.SemaphoreType.REGULAR])(X))


def test_oob():
    jax.block_until_ready(jax.jit(call(oob_kernel, grid=(1,)))(X))
'''

MARKED = '''
import pytest
from kernels import *


# (the racy kernel's output is the DMA's destination read before its wait: off, so that
# the launch ends and its races are collected)
@pytest.mark.palladium(detect_races=True, on_race="collect", uninitialized_reads="off")
def test_races_collected(palladium):
    run_racy()
    races = palladium.races
    assert races and all("buf" in str(r) for r in races)
    assert [launch.kernel for launch in palladium.launches] == ["racy_kernel"]


def test_fixture_records_launches(palladium):
    call(clean_kernel)(X)
    jax.jit(call(clean_kernel, grid=(2,)))(X)
    assert palladium.races == []
    assert [(l.kernel, l.grid) for l in palladium.launches] == [
        ("clean_kernel", ()), ("clean_kernel", (2,))]


@pytest.mark.palladium(chip="v6e", random_seed=7)
def test_marker_fields(palladium):
    call(clean_kernel)(X)
    assert (palladium.params.chip, palladium.params.random_seed) == ("v6e", 7)
    assert palladium.launches[0].chip == "v6e"


def test_options(palladium, request):
    expected = request.config.getoption("--palladium-chip")
    call(clean_kernel)(X)
    if expected:
        assert palladium.params.chip == expected == palladium.launches[0].chip
        assert palladium.params.dma_order == request.config.getoption("--palladium-dma-order")
        assert palladium.params.random_seed == request.config.getoption("--palladium-seed")
'''

UNDER_PALLADIUM = {
    "test_suite.py::test_clean": "passed",
    "test_suite.py::test_racy": "failed",
    "test_suite.py::test_deadlock": "failed",
    "test_suite.py::test_oob": "failed",
    "test_marked.py::test_races_collected": "passed",
    "test_marked.py::test_fixture_records_launches": "passed",
    "test_marked.py::test_marker_fields": "passed",
    "test_marked.py::test_options": "passed",
}


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(kernels=KERNELS, test_suite=SUITE, test_marked=MARKED)
    return pytester


def outcomes(result) -> dict[str, str]:
    """test id -> outcome, from the ``-rA`` short summary."""
    found = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", result.stdout.str(), re.M)
    return {test: outcome.lower() for outcome, test in found}


def failure(result, test: str) -> str:
    """The failure section of one test."""
    text = result.stdout.str()
    start = text.index(f"_ {test} _")
    end = text.find("\n___", start + 1)
    return text[start:end]


@pytest.mark.timeout(300)
def test_without_the_plugin_the_bugs_go_unnoticed(suite):
    for args in (["-p", "no:palladium"], []):  # disabled, or loaded but not asked
        result = suite.runpytest_subprocess("-rA", "-p", "no:randomly", "test_suite.py", *args)
        assert outcomes(result) == {f"test_suite.py::test_{t}": "passed"
                                    for t in ("clean", "racy", "deadlock", "oob")}


@pytest.mark.timeout(300)
def test_palladium_fails_each_bug_with_its_typed_exception(suite):
    result = suite.runpytest_subprocess("-rA", "-p", "no:randomly", "--palladium",
                                        "--palladium-races")
    assert outcomes(result) == UNDER_PALLADIUM
    for test, error, names in [
        ("test_racy", "DataRaceError", ["racy_kernel", "buf"]),
        ("test_deadlock", "DeadlockError", ["deadlock"]),
        ("test_oob", "OutOfBoundsError", ["oob_kernel", "x_ref"]),
    ]:
        text = failure(result, test)
        raised = re.findall(r"^E\s+([\w.]+Error): ", text, re.M)
        assert [r.rsplit(".", 1)[-1] for r in raised] == [error], text
        assert "JaxRuntimeError" not in text
        assert all(name in text for name in names), text


@pytest.mark.timeout(300)
def test_options_reach_the_params(suite):
    result = suite.runpytest_subprocess(
        "-rA", "-p", "no:randomly", "test_marked.py", "--palladium-chip=v5p",
        "--palladium-dma-order=random", "--palladium-seed=3",
    )
    assert outcomes(result) == {k: v for k, v in UNDER_PALLADIUM.items() if "marked" in k}
    bad = suite.runpytest_subprocess("test_marked.py", "--palladium-chip=v99")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*InterpretParams.chip must be one of*"])


@pytest.mark.timeout(300)
def test_uninitialized_option_reports_reads_of_never_written_memory(suite):
    result = suite.runpytest_subprocess(
        "-rA", "-p", "no:randomly", "test_suite.py::test_clean", "test_suite.py::test_racy",
        "--palladium-uninitialized=raise")
    assert outcomes(result) == {"test_suite.py::test_clean": "passed",
                                "test_suite.py::test_racy": "failed"}
    text = failure(result, "test_racy")
    assert "UninitializedReadError" in text
    assert "read of never-written memory: 'buf' (VMEM, device 0 core 0)" in text


@pytest.mark.timeout(300)
def test_by_default_a_racy_read_reaching_the_output_is_reported_and_off_opts_out(suite):
    """Without races, the racy kernel's output is the DMA's destination read before its
    wait: reported by default (``uninitialized_reads="on_use"``), silent with ``off``."""
    default = suite.runpytest_subprocess("-rA", "-p", "no:randomly", "--palladium",
                                         "test_suite.py::test_racy")
    assert outcomes(default) == {"test_suite.py::test_racy": "failed"}
    text = failure(default, "test_racy")
    assert "UninitializedUseError" in text
    assert "holds data derived from uninitialised memory" in text and "'buf' (VMEM" in text
    off = suite.runpytest_subprocess("-rA", "-p", "no:randomly", "--palladium",
                                     "--palladium-uninitialized=off", "test_suite.py::test_racy")
    assert outcomes(off) == {"test_suite.py::test_racy": "passed"}


@pytest.mark.timeout(300)
def test_under_xdist_the_outcomes_are_the_serial_ones(suite):
    pytest.importorskip("xdist")
    result = suite.runpytest_subprocess("-rA", "-p", "no:randomly", "-n", "2", "--palladium",
                                        "--palladium-races")
    assert outcomes(result) == UNDER_PALLADIUM
    assert "DataRaceError" in failure(result, "test_racy")


@pytest.mark.timeout(300)
def test_timeline_option(suite, tmp_path):
    traces = tmp_path / "traces"
    result = suite.runpytest_subprocess("-p", "no:randomly", "test_suite.py::test_clean",
                                        f"--palladium-timeline={traces}")
    if not hasattr(pi, "timeline"):
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*--palladium-timeline needs palladium.interpret.timeline()*"])
    else:
        assert result.ret == pytest.ExitCode.OK
        assert [p.name for p in traces.iterdir()] == ["test_suite.py_test_clean.json"]


@pytest.mark.timeout(300)
def test_readme_example(pytester):
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    [example] = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                 if "@pytest.mark.palladium" in b]
    pytester.makepyfile(test_kernels=example)
    result = pytester.runpytest_subprocess("-rA", "-p", "no:randomly", "--palladium")
    assert outcomes(result) == {"test_kernels.py::test_double": "passed",
                                "test_kernels.py::test_double_has_no_race": "passed"}
    # Without --palladium the kernel without interpret= needs a TPU; the marked test runs.
    result = pytester.runpytest_subprocess("-rA", "-p", "no:randomly")
    assert outcomes(result) == {"test_kernels.py::test_double": "failed",
                                "test_kernels.py::test_double_has_no_race": "passed"}


BAD_MARKERS = '''
import pytest


@pytest.mark.palladium(no_such_field=1)
def test_unknown_field():
    pass


@pytest.mark.palladium(chip="v99")
def test_bad_value():
    pass


def test_unmarked():
    pass
'''


@pytest.mark.timeout(300)
def test_a_bad_marker_field_is_one_config_error_at_setup(pytester):
    """It used to be reported twice, as a setup and a teardown error (a TypeError)."""
    pytester.makepyfile(test_bad=BAD_MARKERS)
    result = pytester.runpytest_subprocess("-rA", "-p", "no:randomly")
    text = result.stdout.str()
    assert sorted(re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", text, re.M)) == [
        ("ERROR", "test_bad.py::test_bad_value"),
        ("ERROR", "test_bad.py::test_unknown_field"),
        ("PASSED", "test_bad.py::test_unmarked"),
    ], text
    assert "at teardown" not in text, text
    assert re.search(
        r"ConfigError: test_bad.py::test_unknown_field: @pytest.mark.palladium\(no_such_field=1\)"
        r": InterpretParams has no field 'no_such_field'; its fields are detect_races, .*", text)
    assert re.search(
        r"ConfigError: test_bad.py::test_bad_value: @pytest.mark.palladium\(chip='v99'\): "
        r"InterpretParams.chip must be one of", text)


BACKGROUND = '''
import threading
import time

from kernels import *

stop = threading.Event()
launched = [0]


def test_starts_a_background_launcher():
    def loop():
        while not stop.is_set():
            jax.block_until_ready(call(clean_kernel)(X))
            launched[0] += 1

    threading.Thread(target=loop, daemon=True).start()
    deadline = time.monotonic() + 60
    while launched[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert launched[0] > 0


def test_records_only_its_own(palladium):
    before = launched[0]
    for _ in range(3):
        jax.block_until_ready(call(clean_kernel, grid=(2,))(X))
    deadline = time.monotonic() + 60
    while launched[0] < before + 2 and time.monotonic() < deadline:  # theirs ran meanwhile
        time.sleep(0.01)
    stop.set()
    assert launched[0] >= before + 2
    assert [(l.kernel, l.grid) for l in palladium.launches] == [("clean_kernel", (2,))] * 3
'''


@pytest.mark.timeout(300)
def test_a_test_records_only_its_own_threads_launches(suite):
    """Another thread's launches (here a background thread an earlier test started) are
    not the test's; the plugin's recorder used to be process-wide."""
    suite.makepyfile(test_background=BACKGROUND)
    result = suite.runpytest_subprocess("-rA", "-p", "no:randomly", "--palladium",
                                        "test_background.py")
    assert outcomes(result) == {"test_background.py::test_starts_a_background_launcher": "passed",
                                "test_background.py::test_records_only_its_own": "passed"}, \
        result.stdout.str()


@pytest.mark.timeout(300)
def test_a_race_is_reported_briefly_with_its_vector_clocks_only_on_v(suite):
    racy = inspect_lines("racy_kernel")
    brief = suite.runpytest_subprocess("-rA", "-p", "no:randomly", "test_suite.py::test_racy",
                                       "--palladium-races")
    text = failure(brief, "test_racy")
    assert (f"palladium.race_detect.errors.DataRaceError: data race on 'buf (VMEM, device 0 "
            f"core 0)' at element (0, 0): read (kernels.py:{racy['o_ref[...] = buf']}) and "
            f"write (kernels.py:{racy['copy.start()']}) are not ordered\n") in text, text
    assert ("  no semaphore wait, barrier or join orders them (pytest -v shows their vector "
            "clocks)\n") in text
    assert "vector clocks {" not in text
    assert "For simplicity, JAX has removed" not in text  # pytest shows its own traceback
    # the short summary: the class name, not palladium.race_detect.errors.DataRaceErro...
    summary = [line for line in brief.stdout.lines if line.startswith("FAILED ")]
    assert len(summary) == 1 and summary[0].startswith(
        "FAILED test_suite.py::test_racy - DataRaceError: data race on"), summary
    detailed = suite.runpytest_subprocess("-v", "-p", "no:randomly", "test_suite.py::test_racy",
                                          "--palladium-races")
    assert "orders them (vector clocks {kernel launch: " in failure(detailed, "test_racy")


def inspect_lines(function: str) -> dict[str, int]:
    """Line numbers in KERNELS (kernels.py) of the lines of ``function``, by their text."""
    lines = KERNELS.strip("\n").splitlines()  # as pytester writes it
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {function}("))
    found = {}
    for i in range(start, len(lines)):
        for text in ("o_ref[...] = buf", "copy.start()"):
            if text in lines[i] and text not in found:
                found[text] = i + 1
    return found


NO_INTERPRET = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def test_tpu_kernel():
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(
        jnp.zeros((8, 128), jnp.float32))
'''


@pytest.mark.timeout(300)
def test_a_tpu_kernel_without_palladium_fails_with_a_hint_at_the_flag(pytester):
    pytester.makepyfile(test_tpu=NO_INTERPRET)
    plain = pytester.runpytest_subprocess("-rA", "-p", "no:randomly")
    assert outcomes(plain) == {"test_tpu.py::test_tpu_kernel": "failed"}
    [summary] = [line for line in plain.stdout.lines if line.startswith("FAILED ")]
    assert summary.startswith(
        "FAILED test_tpu.py::test_tpu_kernel - ValueError (try pytest --palladium): "), summary
    text = plain.stdout.str()
    assert "Only interpret mode is supported on CPU backend." in text
    assert re.search(r"-+ palladium -+\npytest --palladium runs Pallas TPU kernels on this "
                     r"CPU under palladium", text), text
    under = pytester.runpytest_subprocess("-rA", "-p", "no:randomly", "--palladium")
    assert outcomes(under) == {"test_tpu.py::test_tpu_kernel": "passed"}
