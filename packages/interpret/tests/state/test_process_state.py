"""palladium.interpret's process-wide state lives in ``process_state.STATE`` and one
``reset()`` puts it back to how the import left it: failures and race reports forgotten,
rules, launch observers and mode loggers restored; registrations cannot be reset while a
launch runs; ``reset_tpu_interpret_mode_state()`` keeps registrations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import racy_call
from jax.experimental import pallas as pl
from jax.extend.core import Primitive

import palladium.interpret as pi
from palladium.interpret import ConfigError, InterpretParams, LoggingMode
from palladium.interpret.eval.registry import RULES
from palladium.interpret.hook import jax_hook
from palladium.interpret.observe.logging_observer import register_mode_logger
from palladium.interpret.observe.observers import add_launch_observer
from palladium.interpret.state import process_state
from palladium.interpret.state.process_state import STATE, reset
from palladium.shared_memory import Observer

X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)


def _copy(params=None):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                          interpret=params or InterpretParams())


def _failing():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(pl.program_id(0) + 4, 8), :]  # rows 4..11 of 8

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                          grid=(1,), interpret=InterpretParams())


def _racy():
    # (the kernel reads a DMA's destination before its wait: garbage reaches its output,
    # which uninitialized_reads would report after the races are collected)
    return racy_call(InterpretParams(detect_races=True, on_race="collect",
                                     uninitialized_reads="off"))


@pytest.fixture(autouse=True)
def _fresh():
    reset()
    yield
    reset()


def test_every_piece_of_state_is_one_field_of_state():
    assert jax_hook._FAILURES is STATE.failures
    assert jax_hook._RACES is STATE.races
    assert jax_hook._RENDEZVOUS is STATE.rendezvous
    assert RULES is STATE.rules
    assert process_state.reset is reset


def test_reset_forgets_failures_and_race_reports():
    with pytest.raises(jax.errors.JaxRuntimeError):
        jax.jit(_failing())(X)  # inside jax.jit: the failure stays in the log
    assert len(STATE.failures) == 1
    _racy()(X)
    assert len(STATE.races) >= 1
    reset()
    assert len(STATE.failures) == 0
    assert pi.collected_race_reports() == []


def test_reset_restores_the_rule_table():
    triple_p = Primitive("palladium_test_triple")
    triple_p.def_abstract_eval(lambda x: x)
    built_in = {p: RULES.get(p) for p in list(RULES._rules)}
    version = RULES.version
    pi.register_interpret_rule(triple_p, lambda x: x * 3)

    def kernel(x_ref, o_ref):
        o_ref[...] = triple_p.bind(x_ref[...])

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                          interpret=InterpretParams(check_lowering=False))
    np.testing.assert_array_equal(call(X), np.asarray(X) * 3)
    reset()
    assert triple_p not in RULES and triple_p not in RULES.external
    assert {p: RULES.get(p) for p in list(RULES._rules)} == built_in
    assert RULES.version > version  # programs compiled with the old table re-compile
    jax.clear_caches()
    with pytest.raises(pi.UnsupportedPrimitiveError, match="palladium_test_triple"):
        call(X)


def test_reset_removes_launch_observers_and_restores_mode_loggers():
    seen = []

    class Steps(Observer):
        def grid_step_begin(self, core, step, grid_point):
            seen.append(grid_point)

    add_launch_observer(lambda info: Steps())
    register_mode_logger(LoggingMode.GRID, lambda info: Steps())
    timeline_logger = STATE.mode_loggers[LoggingMode.TIMELINE]
    params = InterpretParams(logging_mode=LoggingMode.GRID)
    np.testing.assert_array_equal(_copy(params)(X), np.asarray(X) + 1)
    assert seen == [(), ()]  # the launch observer's and the GRID mode logger's
    reset()
    assert STATE.launch_observers == []
    assert STATE.mode_loggers == {LoggingMode.TIMELINE: timeline_logger}
    jax.clear_caches()
    np.testing.assert_array_equal(_copy(params)(X), np.asarray(X) + 1)
    assert seen == [(), ()]


def test_registrations_cannot_be_reset_during_a_launch():
    outcomes = []

    def recorder(point, core):
        try:
            reset()
        except ConfigError as e:
            outcomes.append(str(e))
        reset(registrations=False)  # forgetting failures and reports is always safe
        outcomes.append("ok")

    np.testing.assert_array_equal(_copy(InterpretParams(grid_point_recorder=recorder))(X),
                                  np.asarray(X) + 1)
    assert outcomes == [
        "palladium.interpret's registrations cannot be reset while launches run (0 "
        "multi-device launch(es) waiting for devices, 1 launch(es) in flight): call "
        "reset() after they finished (jax.block_until_ready on their results)",
        "ok",
    ]


def test_reset_tpu_interpret_mode_state_keeps_registrations():
    quad_p = Primitive("palladium_test_quad")
    quad_p.def_abstract_eval(lambda x: x)
    pi.register_interpret_rule(quad_p, lambda x: x * 4)
    factory = lambda info: None  # noqa: E731
    add_launch_observer(factory)
    with pytest.raises(jax.errors.JaxRuntimeError):
        jax.jit(_failing())(X)  # inside jax.jit: the failure stays in the log
    pi.reset_tpu_interpret_mode_state()
    assert len(STATE.failures) == 0
    assert quad_p in RULES and STATE.launch_observers == [factory]


def test_a_parts_store_is_registered_kept_by_reset_and_emptied_by_clear_caches():
    from palladium.interpret.fidelity import tpu_compiler

    store = {}
    try:
        assert STATE.keep("test_store", store, owner=__name__, holds="a test's entries",
                          clear=store.clear) is store
        store["k"] = 1
        assert f"test_store ({__name__}): a test's entries" in STATE.describe()
        reset()
        assert store == {"k": 1}  # a cache: reset() leaves it
        verdicts = STATE.stores["tpu_verdicts"]
        assert verdicts.owner == tpu_compiler.__name__ and verdicts.clear is not None
        STATE.clear_caches()
        assert store == {}
        with pytest.raises(ConfigError, match="a process store named 'test_store' is"):
            STATE.keep("test_store", {}, owner="another.module", holds="")
    finally:
        STATE.stores.pop("test_store", None)
