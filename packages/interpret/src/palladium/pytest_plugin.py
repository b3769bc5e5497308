"""pytest plugin of palladium-interpret: run a test suite's Pallas TPU kernels on CPU.

Installed with palladium-interpret (entry point ``pytest11: palladium``); it does
nothing (and imports nothing beyond pytest) unless asked:

    pytest --palladium                      # every pallas_call / core_map under palladium
    pytest --palladium --palladium-races    # ... with the race detector (DataRaceError)
    pytest --palladium --palladium-chip=v6e --palladium-dma-order=random --palladium-seed=3
    pytest --palladium --palladium-timeline=traces/   # one Chrome trace per test
    pytest --palladium --palladium-uninitialized=raise   # reads of never-written memory
    pytest -n 4 --palladium                 # with pytest-xdist: each worker alone

``--palladium`` runs every kernel of the run (kernels that take no ``interpret=``
argument, and kernels with ``interpret=True``) in palladium's interpret mode, through
``palladium.interpret.set_tpu_interpret_mode``. A test whose kernel races, deadlocks,
leaks a semaphore or goes out of bounds fails with palladium's typed exception and its
full report (``errors_as_raised``), not jax's ``JaxRuntimeError``. The short summary
names it by its class (``FAILED test_x.py::test_y - DataRaceError: data race on ...``);
a race report says what raced and where (both lines), its vector clocks only with
``pytest -v``. Without ``--palladium``, a test failing with jax's "Only interpret mode
is supported on CPU backend." is told that the flag exists.

Per test, the marker ``@pytest.mark.palladium(**InterpretParams fields)`` runs the test
under palladium (with or without ``--palladium``) with those fields over the options'.
The fixture ``palladium`` (a :class:`KernelRecords`) gives a test the race reports and
the launch records of its own kernels, and runs it under palladium too::

    @pytest.mark.palladium(detect_races=True, on_race="collect")
    def test_no_race(palladium):
        my_kernel(x)
        assert palladium.races == []
        assert [launch.kernel for launch in palladium.launches] == ["my_kernel"]
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_RECORDS = pytest.StashKey["KernelRecords"]()
_INVALID = pytest.StashKey[bool]()  # the item's marker was reported bad at setup


@dataclasses.dataclass(frozen=True)
class LaunchRecord:
    """One kernel launch of a test: the kernel's name, its grid, how many devices and
    cores per device ran it, and the chip it was simulated as."""

    kernel: str
    grid: tuple[int, ...]
    num_devices: int
    num_cores: int
    chip: str


@dataclasses.dataclass
class KernelRecords:
    """What the kernels of one test did (the ``palladium`` fixture).

    ``races``: the ``RaceReport`` of every race found with ``on_race="collect"`` (with
    ``"raise"`` the first race fails the test instead); ``launches``: a
    :class:`LaunchRecord` per launch, in order; ``params``: the ``InterpretParams`` the
    test's kernels run with.
    """

    params: Any
    launches: list[LaunchRecord] = dataclasses.field(default_factory=list)
    _races: list[Any] = dataclasses.field(default_factory=list)

    @property
    def races(self) -> list[Any]:
        self._drain()
        return list(self._races)

    def _drain(self) -> None:
        from palladium.interpret import collected_race_reports

        self._races.extend(collected_race_reports())


class _LaunchRecorder:
    """A launch observer factory (``palladium.interpret.observe.observers``) that appends a
    :class:`LaunchRecord` per launch to one test's records; it observes nothing else.
    It is scoped to the test's context (``scoped_launch_observer``): launches of other
    threads are not the test's."""

    def __init__(self, records: KernelRecords) -> None:
        self.records = records
        self._lock = threading.Lock()

    def __call__(self, info: Any) -> None:
        record = LaunchRecord(str(info.kernel_name), tuple(info.grid), int(info.num_devices),
                              int(info.num_cores), str(info.chip))
        with self._lock:  # a multi-device launch reports from XLA's threads
            self.records.launches.append(record)


_OPTIONS = {  # option dest -> InterpretParams field
    "palladium_chip": "chip",
    "palladium_dma_order": "dma_order",
    "palladium_seed": "random_seed",
    "palladium_uninitialized": "uninitialized_reads",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("palladium", "run Pallas TPU kernels under palladium.interpret")
    group.addoption("--palladium", action="store_true",
                    help="run every pallas_call / core_map of the run in palladium's "
                         "interpret mode (the --palladium-* options imply it)")
    group.addoption("--palladium-races", action="store_true",
                    help="detect data races (a race fails the test with DataRaceError)")
    group.addoption("--palladium-chip", metavar="CHIP",
                    help="the TPU chip to simulate (v2 ... v7x; default: v5e)")
    group.addoption("--palladium-dma-order", choices=("issue", "random"),
                    help="the order pending DMAs complete in")
    group.addoption("--palladium-seed", type=int, metavar="N",
                    help="InterpretParams.random_seed (grid order, schedules, DMA order)")
    group.addoption("--palladium-uninitialized", choices=("off", "on_use", "warn", "raise"),
                    help="InterpretParams.uninitialized_reads (default on_use: report values "
                         "derived from memory nothing wrote where they decide something or "
                         "reach an output; raise: every such read; off: nothing)")
    group.addoption("--palladium-timeline", metavar="DIR",
                    help="write a Chrome trace (palladium.interpret.timeline) per test to DIR")


def _base_fields(config: pytest.Config) -> dict[str, Any] | None:
    """The InterpretParams fields the command line asks for; None: no --palladium."""
    opt = config.option
    fields = {f: getattr(opt, d) for d, f in _OPTIONS.items() if getattr(opt, d) is not None}
    if opt.palladium_races:
        fields["detect_races"] = True
    if not (opt.palladium or fields or opt.palladium_timeline):
        return None
    return fields


def _make_params(
    fields: dict[str, Any], where: str, error: type[Exception] | None = pytest.UsageError
) -> Any:
    """``InterpretParams(**fields)``; a bad field is ``error`` (None: palladium's
    ``ConfigError``) naming ``where`` it came from."""
    import dataclasses as dc

    import palladium.interpret as pi

    known = [f.name for f in dc.fields(pi.InterpretParams)]
    unknown = [name for name in fields if name not in known]
    try:
        if unknown:
            raise pi.ConfigError(
                f"InterpretParams has no field {unknown[0]!r}; its fields are "
                f"{', '.join(known)}."
            )
        return pi.InterpretParams(**fields)
    except (TypeError, ValueError) as e:
        if error is None:
            raise pi.ConfigError(f"{where}: {e}") from None
        raise error(f"{where}: {e}") from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "palladium(**fields): run this test's Pallas kernels under palladium.interpret "
        "with these InterpretParams fields (over the --palladium-* options)",
    )
    config.pluginmanager.register(_Plugin(config), "palladium-run")


class _Plugin:
    def __init__(self, config: pytest.Config) -> None:
        self.fields = _base_fields(config)
        self.timeline_dir: Path | None = None
        if self.fields is None:
            return
        import palladium.interpret as pi

        if config.option.palladium_timeline:
            if not hasattr(pi, "timeline"):
                raise pytest.UsageError(
                    "--palladium-timeline needs palladium.interpret.timeline(), which "
                    f"palladium-interpret {pi.__version__} does not have; upgrade "
                    "palladium-interpret or drop the option"
                )
            self.timeline_dir = Path(config.option.palladium_timeline)
            self.timeline_dir.mkdir(parents=True, exist_ok=True)
        # Every kernel of the run, also those traced outside a test (module level,
        # fixtures of any scope); each test's own context below refines it.
        pi.set_tpu_interpret_mode(_make_params(self.fields, "--palladium options"))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.fields is not None:
            import palladium.interpret as pi

            pi.reset_tpu_interpret_mode_state()

    def _records(self, item: pytest.Item) -> KernelRecords | None:
        """The item's records, made on its first phase; None: not under palladium."""
        records = item.stash.get(_RECORDS, None)
        if records is not None or item.stash.get(_INVALID, False):
            return records
        marker = item.get_closest_marker("palladium")
        wants_fixture = "palladium" in getattr(item, "fixturenames", ())
        if self.fields is None and marker is None and not wants_fixture:
            return None
        fields = dict(self.fields or {})
        if marker is not None:
            shown = ", ".join([*map(repr, marker.args),
                               *(f"{k}={v!r}" for k, v in marker.kwargs.items())])
            where = f"{item.nodeid}: @pytest.mark.palladium({shown})"
            if marker.args:
                item.stash[_INVALID] = True  # reported once, at setup
                from palladium.interpret import ConfigError

                raise ConfigError(
                    f"{where}: the marker takes InterpretParams fields as keywords only, "
                    f"e.g. @pytest.mark.palladium(detect_races=True)"
                )
            fields.update(marker.kwargs)
        else:
            where = f"{item.nodeid}: --palladium options"
        try:
            params = _make_params(fields, where, None)
        except Exception:
            item.stash[_INVALID] = True  # reported once, at setup
            raise
        records = KernelRecords(params)
        import palladium.interpret as pi

        pi.collected_race_reports()  # earlier tests' reports are not this test's
        item.stash[_RECORDS] = records
        return records

    @contextlib.contextmanager
    def _under_palladium(self, item: pytest.Item, phase: str) -> Iterator[None]:
        __tracebackhide__ = True
        records = self._records(item)
        if records is None:
            yield
            return
        import palladium.interpret as pi
        from palladium.interpret.observe.observers import scoped_launch_observer

        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(scoped_launch_observer(_LaunchRecorder(records)))
                stack.enter_context(pi.force_tpu_interpret_mode(records.params))
                if phase == "call" and self.timeline_dir is not None:
                    tl = stack.enter_context(pi.timeline())  # type: ignore[attr-defined]
                    stack.callback(self._save_timeline, tl, item)
                stack.enter_context(pi.errors_as_raised())
                yield
        except Exception as e:
            # The typed exception alone, at the test's own frames: jax's wrapper (chained
            # by errors_as_raised) repeats the message under the callback's traceback.
            wrapper = e.__cause__
            if wrapper is None or type(wrapper).__name__ != "JaxRuntimeError":
                raise
            e.__cause__ = None
            e.__suppress_context__ = True
            raise e.with_traceback(wrapper.__traceback__) from None
        finally:
            records._drain()

    def _save_timeline(self, tl: Any, item: pytest.Item) -> None:
        assert self.timeline_dir is not None
        if getattr(tl, "launches", None):
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid).strip("_")
            tl.save(str(self.timeline_dir / f"{name}.json"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        __tracebackhide__ = True
        with self._under_palladium(item, "setup"):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        __tracebackhide__ = True
        with self._under_palladium(item, "call"):
            try:
                return (yield)
            except Exception as e:
                if _palladium_error(e):
                    _without_jax_note(e)
                    if item.config.get_verbosity() < 1:
                        _without_clocks(e)
                raise

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        if call.excinfo is not None and report.failed:
            _shorten_crash_line(report, call.excinfo.value, self.fields is None)
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Any) -> Any:
        __tracebackhide__ = True
        with self._under_palladium(item, "teardown"):
            return (yield)


# jax's error for a TPU kernel run on a CPU without an interpret mode: the plugin is
# installed, so it says how to run the kernel under palladium.
_NO_INTERPRET_MODE = "Only interpret mode is supported on CPU backend."
_PALLADIUM_HINT = ("pytest --palladium runs Pallas TPU kernels on this CPU under palladium "
                   "(races, deadlocks, out-of-bounds checks); @pytest.mark.palladium runs "
                   "one test so")


def _palladium_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of palladium's (without importing palladium)."""
    errors = sys.modules.get("palladium.race_detect.errors")
    return errors is not None and isinstance(exc, errors.PalladiumError)


def _without_jax_note(exc: BaseException) -> None:
    """Drop jax's note that it filtered the traceback: pytest shows its own."""
    notes = getattr(exc, "__notes__", None)
    if notes:
        notes[:] = [n for n in notes if "JAX has removed its internal frames" not in n]


def _without_clocks(exc: BaseException) -> None:
    """A race report's last line without its vector clocks (``pytest -v`` keeps them):
    what raced and where (both lines) stays."""
    report = sys.modules.get("palladium.race_detect.report")
    errors = sys.modules.get("palladium.race_detect.errors")
    if report is None or errors is None or not isinstance(exc, errors.DataRaceError):
        return
    text = str(exc)
    head, sep, _ = text.rpartition(f"  {report.CLOCKS_PREFIX} (vector clocks ")
    if sep and len(exc.args) == 1:
        exc.args = (f"{head}  {report.CLOCKS_PREFIX} (pytest -v shows their vector clocks)",)


def _shorten_crash_line(report: pytest.TestReport, exc: BaseException,
                        without_palladium: bool) -> None:
    """The line pytest's short summary shows: a palladium error by its class name alone
    (``DataRaceError: data race on ...``, not ``palladium.race_detect.errors.DataRa...``)
    and the first line of its message; jax's refusal of a TPU kernel on a CPU, with the
    flag that runs it under palladium."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is None:
        return
    first = str(exc).split("\n", 1)[0]
    if _palladium_error(exc):
        crash.message = f"{type(exc).__name__}: {first}"
    elif without_palladium and _NO_INTERPRET_MODE in str(exc):
        crash.message = f"{type(exc).__name__} (try pytest --palladium): {first}"
        add = getattr(report.longrepr, "addsection", None)
        if add is not None:
            add("palladium", _PALLADIUM_HINT + ".")


@pytest.fixture
def palladium(request: pytest.FixtureRequest) -> KernelRecords:
    """The race reports and launch records of this test's kernels (which run under
    palladium.interpret because the test asks for this fixture)."""
    records = request.node.stash.get(_RECORDS, None)
    if records is None:  # pragma: no cover - the plugin makes it before setup
        raise pytest.UsageError("the palladium fixture needs the palladium pytest plugin")
    return records
