"""Interpreter rules from ``palladium.interpret_rules`` entry points (fake distributions)."""

import importlib.metadata
import sys
import textwrap
import warnings

import jax
import numpy as np
import pytest
from jax.experimental import pallas as pl

import palladium.interpret as pi
from palladium.interpret.eval.registry import RULES
from palladium.interpret.rule_plugins import ENTRY_POINT_GROUP

X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)

PROVIDER = '''
from jax.extend.core import Primitive

triple_p = Primitive("palladium_plugin_test_triple")
triple_p.def_abstract_eval(lambda x: x)


def rules():
    return {triple_p: lambda x: x * 3}


def raises():
    raise RuntimeError("provider exploded")


def not_a_mapping():
    return [triple_p]


# The form "evaluate": the rule declares a jaxpr and its arguments (no tracing).
quadruple_p = Primitive("palladium_plugin_test_quadruple")
quadruple_p.def_abstract_eval(lambda x, *, times4: x)


def evaluations():
    return {quadruple_p: ("evaluate", lambda x, times4: (times4, [x]))}


def bad_form():
    return {quadruple_p: ("lower", lambda x, times4: (times4, [x]))}
'''


@pytest.fixture
def provider(tmp_path, monkeypatch):
    """A provider module on sys.path, and ``entry_points`` faked for our group only."""
    name = f"fake_rules_provider_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PROVIDER))
    monkeypatch.syspath_prepend(str(tmp_path))
    installed: list[importlib.metadata.EntryPoint] = []
    real_entry_points = importlib.metadata.entry_points

    def fake_entry_points(**selection):
        if selection != {"group": ENTRY_POINT_GROUP}:  # jax looks up its own plugins
            return real_entry_points(**selection)
        return list(installed)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)

    def add(ep_name, attr, module=name):
        installed.append(importlib.metadata.EntryPoint(ep_name, f"{module}:{attr}",
                                                       ENTRY_POINT_GROUP))

    yield name, add, tmp_path
    sys.modules.pop(name, None)


def _run_triple(triple_p):
    def kernel(x_ref, o_ref):
        o_ref[...] = triple_p.bind(x_ref[...])

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                          interpret=pi.InterpretParams())(X)


def test_entry_point_rules_are_registered_and_run(provider):
    module, add, _ = provider
    add("fake-dist", "rules")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pi.load_entry_point_rules() == ["fake-dist"]
    triple_p = sys.modules[module].triple_p
    assert triple_p in RULES
    np.testing.assert_array_equal(_run_triple(triple_p), X * 3)


@pytest.mark.parametrize("attr,module,why", [
    ("raises", None, "RuntimeError: provider exploded"),
    ("not_a_mapping", None, "TypeError: it returned list, not a mapping"),
    ("rules", "no_such_module_for_palladium_tests", "ModuleNotFoundError"),
])
def test_broken_entry_point_warns_naming_it_and_others_still_load(provider, attr, module, why):
    name, add, _ = provider
    add("broken-dist", attr, module or name)
    add("good-dist", "rules")
    with pytest.warns(pi.InterpretRuleWarning) as record:
        loaded = pi.load_entry_point_rules()
    assert loaded == ["good-dist"]
    (warning,) = record
    message = str(warning.message)
    assert "'broken-dist'" in message and ENTRY_POINT_GROUP in message, message
    assert why in message, message
    np.testing.assert_array_equal(_run_triple(sys.modules[name].triple_p), X * 3)


def test_entry_point_rules_of_form_evaluate_are_evaluated(provider):
    module, add, _ = provider
    add("evaluating-dist", "evaluations")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pi.load_entry_point_rules() == ["evaluating-dist"]
    quadruple_p = sys.modules[module].quadruple_p
    times4 = jax.make_jaxpr(lambda x: x * 4)(X)

    def kernel(x_ref, o_ref):
        o_ref[...] = quadruple_p.bind(x_ref[...], times4=times4)

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                         interpret=pi.InterpretParams())(X)
    np.testing.assert_array_equal(out, X * 4)


def test_an_unknown_rule_form_is_broken(provider):
    _, add, _ = provider
    add("bad-form", "bad_form")
    with pytest.warns(pi.InterpretRuleWarning, match=r"'bad-form'.*\('evaluate', callable\)"):
        assert pi.load_entry_point_rules() == []


def test_a_mapping_to_a_non_callable_is_broken(provider):
    name, add, path = provider
    bad = f"{name}_bad"
    (path / f"{bad}.py").write_text(
        f"from {name} import triple_p\n\ndef rules():\n    return {{triple_p: 3}}\n")
    add("non-callable", "rules", bad)
    with pytest.warns(pi.InterpretRuleWarning,
                      match=r"'non-callable'.*expected primitive \(or primitive name\) -> callable"):
        assert pi.load_entry_point_rules() == []
    sys.modules.pop(bad, None)


def test_every_registered_rule_sees_only_a_kernel_context():
    # The typed seam: a rule's first parameter is the KernelContext Protocol, never the
    # launch or Any (mypy checks the bodies against it; this checks nothing slipped by).
    import inspect

    from palladium.interpret.eval.registry import RULES

    rules = list(RULES._rules.values())
    assert len(rules) > 20
    for fn in rules:
        first = next(iter(inspect.signature(fn).parameters.values()))
        assert "KernelContext" in str(first.annotation), (fn, first.annotation)
