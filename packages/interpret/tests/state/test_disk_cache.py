"""palladium's one disk cache (state/disk_cache.py): entries verified against their key
and signed with the user's secret (a rotated, renamed or foreign file is a miss, never
loaded or unpickled), atomic writes that leave no temporary file on a full disk, a size
limit, and ``cache_info`` / ``cache_clear`` / ``palladium-cache``."""

import builtins
import hashlib
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import platformdirs
import pytest

import palladium.interpret as pi
from palladium.interpret import ConfigError
from palladium.interpret.state import disk_cache
from palladium.interpret.state.disk_cache import DiskCache
from palladium.interpret.state.segment_cache import SegmentExecutables

pytestmark = pytest.mark.timeout(120)
TESTS = os.path.dirname(os.path.dirname(__file__))


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("PALLADIUM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PALLADIUM_CACHE_SIZE", raising=False)
    return tmp_path / "cache"


def _files(root):
    """Every file the caches wrote (whatever their format), but the secret."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "secret.key")


def test_the_test_suite_uses_a_temporary_cache_never_the_users():
    assert os.environ["PALLADIUM_CACHE_DIR"]
    assert disk_cache.cache_root() != platformdirs.user_cache_path("palladium", appauthor=False)


def test_the_cache_is_in_the_users_cache_folder_unless_the_variable_moves_it(monkeypatch):
    monkeypatch.delenv("PALLADIUM_CACHE_DIR")
    assert disk_cache.cache_root() == platformdirs.user_cache_path("palladium",
                                                                    appauthor=False)


def test_an_entry_comes_back_under_its_key_only(root):
    cache = DiskCache("things")
    cache.put("key one", b"payload one")
    assert cache.get("key one") == b"payload one"
    assert cache.get("key two") is None
    assert "key one" in cache and "key two" not in cache
    assert DiskCache("other things").get("key one") is None
    secret = root / "secret.key"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert len(secret.read_bytes()) == 32


def _two_executables(root):
    """Two segments' executables compiled and written to disk (x * 2 and x + 1)."""
    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    compiles = []

    def compiler(fn, name):
        def compile_fn():
            compiles.append(name)
            return jax.jit(fn).lower(spec).compile()
        return compile_fn

    double = compiler(lambda x: x * 2, "double")
    plus_one = compiler(lambda x: x + 1, "plus_one")
    first = SegmentExecutables()
    first.get("double", double)
    first.get("plus_one", plus_one)
    assert compiles == ["double", "plus_one"] and len(_files(root)) == 2
    return double, plus_one, compiles


def test_rotated_entries_are_misses_never_run(root):
    """Issue 42 item 9: files swapped on disk (valid executables under each other's
    names) were loaded and run; they are misses, compiled again, and right."""
    double, plus_one, compiles = _two_executables(root)
    a, b = _files(root)
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    fresh = SegmentExecutables()  # a new process
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    np.testing.assert_array_equal(np.asarray(fresh.get("double", double)(x)), x * 2)
    np.testing.assert_array_equal(np.asarray(fresh.get("plus_one", plus_one)(x)), x + 1)
    assert compiles == ["double", "plus_one", "double", "plus_one"]


class _Payload:
    """A pickle that runs code when loaded."""

    def __reduce__(self):
        return (exec, ("import builtins; builtins.palladium_test_pwned = True",))


def test_a_foreign_entry_is_never_unpickled(root):
    """Issue 42 item 9: the cache's files were ``pickle.loads``-ed, so whoever could
    write the folder could run code. A file palladium did not sign is not unpickled."""
    double, plus_one, compiles = _two_executables(root)
    evil = pickle.dumps(_Payload())
    for path in _files(root):
        path.write_bytes(evil)
    fresh = SegmentExecutables()
    fresh.get("double", double)
    assert not getattr(builtins, "palladium_test_pwned", False)
    assert compiles[-1] == "double"  # a miss: compiled again
    # Knowing the format is not enough without the secret: the tag does not verify.
    for path in _files(root):
        key_digest = bytes.fromhex(path.name.split(".")[0])
        path.write_bytes(disk_cache.MAGIC + bytes(32) + key_digest + evil)
    SegmentExecutables().get("plus_one", plus_one)
    assert not getattr(builtins, "palladium_test_pwned", False)
    assert compiles[-1] == "plus_one"


def test_a_secret_others_can_read_disables_the_cache_with_one_warning(root):
    cache = DiskCache("things")
    cache.put("k", b"v")
    (root / "secret.key").chmod(0o644)
    disk_cache.SECRET.forget()
    with pytest.warns(RuntimeWarning, match=r"readable or writable by others \(mode 644"):
        assert cache.get("k") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get("k") is None  # (warned once)
        cache.put("k2", b"v")
    assert cache.get("k2") is None
    assert not pi.cache_info().trusted
    (root / "secret.key").chmod(0o600)
    disk_cache.SECRET.forget()
    assert cache.get("k") == b"v"


@pytest.mark.timeout(240)
def test_a_full_disk_leaves_no_temporary_files(tmp_path):
    """Issue 42 item 9: a full disk left the partial ``.tmp`` files of every failed write
    (4 -> 8 -> 12 per run). Here every write past 16 KiB fails (RLIMIT_FSIZE, as a full
    disk does with EFBIG/ENOSPC): the kernel's results are right, no ``.tmp`` stays."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
        sys.path.insert(0, {os.path.join(TESTS, "eval")!r})
        import numpy as np
        import palladium.interpret as pi
        from palladium.interpret.compiled import compiled_launch
        from test_compiled_segments import _inputs, _reference, _scan
        compiled_launch.MIN_EQUATIONS_PER_LAUNCH = 1 << 60  # (segments only)
        x, a = _inputs()
        out = np.asarray(_scan(pi.InterpretParams(), x, a))
        np.testing.assert_allclose(out, _reference(x, a), rtol=1e-5, atol=1e-5)
        print(pi.STATE.segments.compiled)
    """)
    env = {**os.environ, "PALLADIUM_CACHE_DIR": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=200)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["1"]  # compiled each time: nothing could be kept
    assert [p.name for p in (tmp_path / "cache").rglob("*.tmp")] == []


def test_stale_temporary_files_are_swept_on_the_first_write(root):
    folder = root / "things"
    folder.mkdir(parents=True)
    stale, fresh = folder / ".killed-writer.tmp", folder / ".writing-now.tmp"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    old = time.time() - disk_cache.STALE_TMP - 60
    os.utime(stale, (old, old))
    disk_cache.BUDGET.forget()
    DiskCache("things").put("k", b"v")
    assert not stale.exists() and fresh.exists()


def test_a_failed_write_removes_its_temporary_file(root, monkeypatch):
    cache = DiskCache("things")
    cache.put("first", b"v")  # (the folder and the secret exist)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_cache.os, "replace", full)
    cache.put("second", b"v" * 1000)
    assert [p.name for p in root.rglob("*.tmp")] == []
    assert cache.get("second") is None and cache.get("first") == b"v"


def test_the_size_limit_evicts_the_least_recently_used_entries(root, monkeypatch):
    monkeypatch.setenv("PALLADIUM_CACHE_SIZE", "5K")
    assert disk_cache.cache_limit() == 5 * 1024
    disk_cache.BUDGET.forget()
    cache = DiskCache("things")
    for i in range(4):
        cache.put(f"k{i}", bytes(1000))
    # k0 is the oldest written but just used; k1 is the least recently used
    for i, age in ((0, 10), (1, 400), (2, 300), (3, 200)):
        path = cache._path(hashlib.sha256(f"k{i}".encode()).digest())
        t = time.time() - age
        os.utime(path, (t, t))
    cache.put("k4", bytes(1000))
    cache.put("k5", bytes(1000))
    kept = [k for k in (f"k{i}" for i in range(6)) if cache.get(k) is not None]
    assert "k1" not in kept and "k0" in kept and "k5" in kept
    assert pi.cache_info().size_bytes <= 5 * 1024


def test_a_size_of_zero_turns_the_disk_cache_off(root, monkeypatch):
    monkeypatch.setenv("PALLADIUM_CACHE_SIZE", "0")
    DiskCache("things").put("k", b"v")
    assert DiskCache("things").get("k") is None and not root.exists()


def test_a_size_it_cannot_read_names_the_variable(root, monkeypatch):
    monkeypatch.setenv("PALLADIUM_CACHE_SIZE", "lots")
    with pytest.raises(ConfigError, match=r"PALLADIUM_CACHE_SIZE='lots': expected a size in "
                                          r"bytes such as 500M, 2G or 0"):
        disk_cache.cache_limit()


def test_cache_info_and_cache_clear(root):
    DiskCache("things").put("a", b"x" * 100)
    DiskCache("things").put("b", b"x" * 100)
    DiskCache("verdicts").put("c", b"{}")
    (root / "segments").mkdir()
    legacy = root / "segments" / (64 * "a" + ".bin")  # an earlier format's file
    legacy.write_bytes(b"old")
    mine = root / "notes.txt"  # not palladium's: left alone
    mine.write_text("keep")
    info = pi.cache_info()
    assert info.path == root and info.trusted
    assert info.entries == {"things": (2, 2 * (100 + disk_cache._HEADER)),
                            "verdicts": (1, 2 + disk_cache._HEADER)}
    assert info.size_bytes == 3 * disk_cache._HEADER + 202
    assert info.limit_bytes == disk_cache.DEFAULT_SIZE
    text = str(info)
    assert text.splitlines()[0] == f"palladium cache: {root}"
    assert "things: 2 entries" in text and "of 1.0 GiB" in text
    assert pi.cache_clear() == 4
    assert pi.cache_info().entries == {} and not legacy.exists()
    assert mine.read_text() == "keep" and (root / "secret.key").exists()


def test_the_palladium_cache_command(root):
    DiskCache("things").put("a", b"x")
    env = {**os.environ, "PALLADIUM_CACHE_DIR": str(root), "JAX_PLATFORMS": "cpu"}
    run = [sys.executable, "-m", "palladium.interpret.cache_cli"]
    info = subprocess.run([*run, "info"], env=env, capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[0] == f"palladium cache: {root}"
    assert "things: 1 entries" in info.stdout
    cleared = subprocess.run([*run, "clear"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert cleared.stdout.strip() == f"removed 1 files from {root}"
    assert DiskCache("things").get("a") is None
    bad = subprocess.run([*run, "info"], env={**env, "PALLADIUM_CACHE_SIZE": "lots"},
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.startswith("palladium-cache: PALLADIUM_CACHE_SIZE='lots': expected")
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="palladium-cache")
    assert script.value == "palladium.interpret.cache_cli:main"
