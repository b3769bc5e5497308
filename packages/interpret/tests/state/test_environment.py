"""state/environment.py: the one environment digest every cache that outlives a process
keys its entries by."""

import doctest

import jax

from palladium.interpret.state import environment


def test_the_docstring_examples_run():
    failures, tried = doctest.testmod(environment)
    assert tried > 0 and failures == 0


def test_the_digest_changes_with_each_version_and_flag(monkeypatch):
    before = environment.environment_digest()
    installed = environment.version
    for dist in environment.DISTRIBUTIONS:
        monkeypatch.setattr(environment, "version",
                            lambda d, dist=dist: "9.9.9" if d == dist else installed(d))
        assert environment.environment_digest() != before, dist
        monkeypatch.undo()
    assert environment.environment_digest() == before
    monkeypatch.setattr(jax, "__version__", "0.0.1")
    assert environment.environment_digest() != before
    monkeypatch.undo()
    for variable in environment.FLAG_VARIABLES:
        monkeypatch.setenv(variable, "--some_flag=1")
        assert environment.environment_digest() != before, variable
        monkeypatch.undo()


def test_the_host_digest_adds_the_host_to_the_environment(monkeypatch):
    host = environment.host_digest()
    monkeypatch.setenv("XLA_FLAGS", "--some_flag=1")
    assert environment.host_digest() != host
