"""palladium.interpret's one disk cache: one folder, one entry format, one writer, a size
limit, and a way to see and clear it.

Where: ``$PALLADIUM_CACHE_DIR``, else the user's cache folder from ``platformdirs``
(Linux ``$XDG_CACHE_HOME/palladium`` or ``~/.cache/palladium``, macOS
``~/Library/Caches/palladium``, Windows ``%LOCALAPPDATA%\\palladium\\Cache``). Each kind
of entry has a folder of its own below it (``DiskCache(name)``): the TPU compiler's
verdicts, the accepted verdicts by call key, the clean Mosaic lowerings, the compiled
executables of segments and whole launches.

How much: ``$PALLADIUM_CACHE_SIZE`` bytes for all entries together (``K``/``M``/``G``
suffixes; ``0`` turns the disk cache off), default ``DEFAULT_SIZE`` (1 GiB). A write that
takes the total past it deletes the least recently used entries (by modification time,
which a hit refreshes) down to 90% of it.

Trust: an entry is ``MAGIC``, an HMAC-SHA256 tag, the SHA-256 of its key and the payload;
the tag covers the folder's name, the key's digest and the payload, under a secret of
32 random bytes kept in ``secret.key`` at the cache's root (created mode 0600). An entry
is returned only if its tag verifies and it names the key asked for: a renamed, rotated,
truncated or foreign file is a miss (and is deleted), never loaded. The executables'
payloads are pickles (jax's serialized executables are); nothing is unpickled before its
tag verified, so only what this user's palladium wrote is ever loaded. A secret another
user owns, or that others may read or write, makes the whole cache untrusted: nothing is
read or written, with one warning. The folder must not be writable by others: whoever can
write the secret can make entries this process will load, and loading a pickle runs code.

Writes are atomic (a temporary ``.tmp`` file in the same folder, then ``os.replace``); a
write that fails (a full disk) removes its temporary file, and temporary files older
than ``STALE_TMP`` seconds (of a process killed mid-write) are swept on the first write
of each process. A cache that cannot be read or written only costs time: results never
depend on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import os
import re
import tempfile
import threading
import time
import warnings
from pathlib import Path

__all__ = [
    "CACHE_DIR_VARIABLE",
    "CACHE_SIZE_VARIABLE",
    "DEFAULT_SIZE",
    "CacheInfo",
    "DiskCache",
    "cache_clear",
    "cache_info",
    "cache_limit",
    "cache_root",
]

CACHE_DIR_VARIABLE = "PALLADIUM_CACHE_DIR"
CACHE_SIZE_VARIABLE = "PALLADIUM_CACHE_SIZE"
#: Bytes of entries kept on disk by default. The largest entries are whole-launch
#: executables (~0.1-2 MiB each); a segment's is ~20-200 KiB, a verdict ~300 bytes.
DEFAULT_SIZE = 1 << 30
#: Seconds after which a temporary file is taken for one a killed writer left (a write
#: takes milliseconds).
STALE_TMP = 600.0
MAGIC = b"palladium-cache 1\n"
_TAG = 32  # bytes of HMAC-SHA256
_DIGEST = 32  # bytes of SHA-256
_HEADER = len(MAGIC) + _TAG + _DIGEST
_SECRET_FILE = "secret.key"
_ENTRY = ".entry"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Files of the caches palladium kept before this module (no tag, never loaded now):
# ``palladium-cache clear`` removes them too.
_LEGACY = re.compile(r"^([0-9a-f]{64}(\.bin|\.json)?|tmp\w+\.tmp)$")


def cache_root() -> Path:
    """The folder of palladium.interpret's disk cache (see the module docstring)."""
    root = os.environ.get(CACHE_DIR_VARIABLE)
    if root:
        return Path(root)
    import platformdirs

    return platformdirs.user_cache_path("palladium", appauthor=False)


def cache_limit() -> int:
    """The size limit in bytes: ``$PALLADIUM_CACHE_SIZE`` (e.g. ``500M``, ``2G``, ``0``),
    else ``DEFAULT_SIZE``. A value it cannot read is an error naming the variable."""
    text = os.environ.get(CACHE_SIZE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_SIZE
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
    if found is None:
        from palladium.interpret.errors import ConfigError

        raise ConfigError(f"{CACHE_SIZE_VARIABLE}={text!r}: expected a size in bytes such "
                          f"as 500M, 2G or 0 (0 turns palladium's disk cache off)")
    return int(float(found.group(1)) * _UNITS[found.group(2).upper()])


class _Secret:
    """The per-user key that signs entries, by cache root (made on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[Path, bytes | None] = {}
        self._warned: set[Path] = set()

    def get(self, root: Path, create: bool) -> bytes | None:
        """The secret of ``root``; None if there is none (and ``create`` is false) or it
        cannot be trusted (then warned once)."""
        with self._lock:
            if root in self._keys:
                return self._keys[root]
            path = root / _SECRET_FILE
            why = None
            try:
                key = self._read(path)
                if key is None and create:
                    key = self._create(root, path)
            except _Untrusted as e:
                key, why = None, str(e)
            except OSError:
                return None  # unreadable or unwritable: no cache this time, ask again later
            if why is not None and root not in self._warned:
                self._warned.add(root)
                warnings.warn(f"palladium's disk cache at {root} is not used: {why}. Remove "
                              f"the folder (or set {CACHE_DIR_VARIABLE} to a folder only "
                              f"you can write) to cache compiled kernels again.",
                              RuntimeWarning, stacklevel=4)
            if key is not None or why is not None:
                self._keys[root] = key
            return key

    def forget(self) -> None:
        with self._lock:
            self._keys.clear()

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if hasattr(os, "getuid"):
                if st.st_uid != os.getuid():
                    raise _Untrusted(f"its key file {path} belongs to another user")
                if st.st_mode & 0o077:
                    raise _Untrusted(f"its key file {path} is readable or writable by "
                                     f"others (mode {st.st_mode & 0o777:o}, not 600)")
            key = f.read()
        if len(key) != 32:
            raise _Untrusted(f"its key file {path} is not 32 bytes")
        return key

    @staticmethod
    def _create(root: Path, path: Path) -> bytes | None:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # (made here: this user's only)
        key = os.urandom(32)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".secret-", suffix=".tmp")
        try:
            os.write(fd, key)  # (mkstemp made it 0600)
            os.close(fd)
            fd = -1
            try:
                os.link(tmp, path)  # fails if another process made one first: use theirs
            except FileExistsError:
                return _Secret._read(path)
            return key
        finally:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)


class _Untrusted(Exception):
    pass


SECRET = _Secret()


class _Budget:
    """The bytes of entries under each root as this process last counted them, and the
    sweep of stale temporary files (once per folder and process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total: dict[Path, int] = {}
        self._swept: set[Path] = set()

    def added(self, root: Path, nbytes: int, limit: int) -> None:
        with self._lock:
            total = self._total.get(root)
            total = _scan(root)[0] if total is None else total + nbytes
            if total > limit:
                total = _evict(root, int(limit * 0.9))
            self._total[root] = total

    def sweep_once(self, folder: Path) -> None:
        with self._lock:
            if folder in self._swept:
                return
            self._swept.add(folder)
        _sweep_tmp(folder, STALE_TMP)

    def forget(self) -> None:
        with self._lock:
            self._total.clear()
            self._swept.clear()


BUDGET = _Budget()


class DiskCache:
    """The entries of one kind (a folder below ``cache_root()``): bytes by key."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def folder(self) -> Path:
        return cache_root() / self.name

    def _path(self, digest: bytes) -> Path:
        return self.folder / f"{digest.hex()}{_ENTRY}"

    def _tag(self, secret: bytes, digest: bytes, payload: bytes) -> bytes:
        mac = hmac.new(secret, self.name.encode() + b"\x00" + digest, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None: none, or not one this user's
        palladium wrote under this key (such a file is deleted)."""
        if cache_limit() == 0:
            return None
        digest = hashlib.sha256(key.encode()).digest()
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        secret = SECRET.get(cache_root(), create=False)
        if secret is None:
            return None
        tag = data[len(MAGIC):len(MAGIC) + _TAG]
        payload = data[_HEADER:]
        if (not data.startswith(MAGIC) or data[len(MAGIC) + _TAG:_HEADER] != digest
                or not hmac.compare_digest(tag, self._tag(secret, digest, payload))):
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return payload

    def put(self, key: str, payload: bytes) -> None:
        """Store ``payload`` under ``key`` (atomically; a failed write leaves no file)."""
        limit = cache_limit()
        if limit == 0 or len(payload) + _HEADER > limit:
            return
        root = cache_root()
        folder = self.folder
        try:
            secret = SECRET.get(root, create=True)
            if secret is None:
                return
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return
        BUDGET.sweep_once(folder)
        digest = hashlib.sha256(key.encode()).digest()
        data = MAGIC + self._tag(secret, digest, payload) + digest + payload
        if not _write_atomic(self._path(digest), data):
            return
        BUDGET.added(root, len(data), limit)

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None


def _write_atomic(path: Path, data: bytes) -> bool:
    """``data`` as ``path``, whole or not at all; whether it was written."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:  # a full disk, a quota, a vanished folder: no partial file stays
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _entries(root: Path) -> list[tuple[Path, os.stat_result]]:
    found = []
    try:
        folders = [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        return []
    for folder in folders:
        try:
            for p in folder.iterdir():
                if p.name.endswith(_ENTRY):
                    with contextlib.suppress(OSError):
                        found.append((p, p.stat()))
        except OSError:
            continue
    return found


def _scan(root: Path) -> tuple[int, int]:
    """Bytes and count of the entries under ``root``."""
    entries = _entries(root)
    return sum(st.st_size for _, st in entries), len(entries)


def _evict(root: Path, target: int) -> int:
    """Delete the least recently used entries until at most ``target`` bytes remain;
    the bytes that remain."""
    entries = sorted(_entries(root), key=lambda e: e[1].st_mtime)
    total = sum(st.st_size for _, st in entries)
    for path, st in entries:
        if total <= target:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            total -= st.st_size
    return total


def _sweep_tmp(folder: Path, older_than: float) -> int:
    """Delete the temporary files in ``folder`` older than ``older_than`` seconds."""
    removed = 0
    now = time.time()
    try:
        names = list(folder.iterdir())
    except OSError:
        return 0
    for p in names:
        if p.name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime >= older_than:
                    p.unlink()
                    removed += 1
    return removed


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """What ``cache_info()`` found: the folder, its entries by kind, their bytes, the
    limit, and whether the cache is used (its secret is this user's alone)."""

    path: Path
    entries: dict[str, tuple[int, int]]  # kind (folder) -> (entries, bytes)
    size_bytes: int
    limit_bytes: int
    trusted: bool

    def __str__(self) -> str:
        lines = [f"palladium cache: {self.path}",
                 f"  {_size(self.size_bytes)} of {_size(self.limit_bytes)} "
                 f"(${CACHE_SIZE_VARIABLE}; ${CACHE_DIR_VARIABLE} moves it)"]
        if not self.trusted:
            lines.append(f"  NOT USED: its {_SECRET_FILE} is not this user's alone")
        for name, (count, nbytes) in sorted(self.entries.items()):
            lines.append(f"  {name}: {count} entries, {_size(nbytes)}")
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def cache_info() -> CacheInfo:
    """The disk cache's folder, entries by kind, bytes and limit."""
    root = cache_root()
    per: dict[str, list[int]] = {}
    for path, st in _entries(root):
        count = per.setdefault(path.parent.name, [0, 0])
        count[0] += 1
        count[1] += st.st_size
    trusted = True
    if (root / _SECRET_FILE).exists():
        try:
            _Secret._read(root / _SECRET_FILE)
        except (_Untrusted, OSError):
            trusted = False
    return CacheInfo(root, {k: (c, b) for k, (c, b) in per.items()},
                     sum(b for _, b in per.values()), cache_limit(), trusted)


def cache_clear() -> int:
    """Delete every entry of the disk cache (and temporary files and the files of
    palladium's earlier cache formats); the number of files deleted. The secret stays.
    Only files palladium names so are touched, whatever the folder holds besides."""
    root = cache_root()
    removed = 0
    for path, _ in _entries(root):
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
    try:
        folders = [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        folders = []
    for folder in folders:
        removed += _sweep_tmp(folder, 0.0)
        with contextlib.suppress(OSError):
            for sub in [folder, *(p for p in folder.iterdir() if p.is_dir())]:
                for p in list(sub.iterdir()):
                    if p.is_file() and _LEGACY.match(p.name):
                        with contextlib.suppress(OSError):
                            p.unlink()
                            removed += 1
    BUDGET.forget()
    return removed
