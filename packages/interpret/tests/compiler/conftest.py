"""The TPU compiler's tests: each test gets an empty verdict cache on disk and in memory,
so that every verdict is the compiler's own (``PALLADIUM_CACHE_DIR``)."""

import pytest

from palladium.interpret.fidelity import tpu_compiler


@pytest.fixture(autouse=True)
def fresh_verdict_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PALLADIUM_CACHE_DIR", str(tmp_path / "cache"))
    tpu_compiler.clear_memory_cache()
    yield tmp_path / "cache"
    tpu_compiler.clear_memory_cache()
