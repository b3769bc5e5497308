"""The failure registry behind ``errors_as_raised``: launch exceptions by failure id.

A kernel failing inside a host callback reaches jax as the callback's error, which jax
raises as its ``JaxRuntimeError`` carrying the exception's text only. At the callback
boundary each exception is given a failure id and its text is reworded for that wrapper:
the first line names palladium's type and why jax's is raised instead, the last line
carries the id (``[palladium failure #N: palladium.interpret.errors_as_raised() around the
jitted call raises the palladium.interpret.DeadlockError itself]``). The exception is
kept here so that a caller (``errors_as_raised``, a kernel called eagerly:
``hook.jax_hook``, the pytest plugin) can re-raise that very exception, found by id, not
by matching message text. The same exception raised by every device of a multi-device
launch keeps one id.

What is kept is only what re-raising needs: a copy of the exception (type, message,
attributes such as a ``DataRaceError``'s report, chained causes) without its traceback,
whose frames held the launch's whole simulation and, through their callers, its
operands (100 failing launches of a 64 MiB input kept ~4 GiB alive). Where it failed
stays readable as ``exc.launch_traceback`` (a ``traceback.StackSummary``). At most ``capacity`` failures are kept (oldest forgotten first); an
entry is removed when claimed. A failure's ``snapshot`` (its simulated state, bounded by
``InterpretParams.failure_snapshot_bytes``) keeps its buffers' contents only in the
newest ``snapshots_with_contents`` entries; older ones keep the rest (cores, semaphores,
DMAs, buffer names and shapes), so the log holds at most that many snapshots' arrays.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import re
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FailureLog", "is_recorded"]

# What jax's JaxRuntimeError shows of the exception: its first line says which palladium
# type it is and why it is not raised as that type (jaxlib keeps only a host callback's
# text), its last line the failure id and how to get the typed exception.
_WHY = ("{} (a kernel's failure inside jax.jit reaches Python as jax's JaxRuntimeError; "
        "see the last line): ")
_TAG = ("[palladium failure #{}: palladium.interpret.errors_as_raised() around the jitted "
        "call raises the {} itself]")
_TAG_RE = re.compile(r"\[palladium failure #(\d+)[:\]]")
_ID_ATTR = "_palladium_failure_id"


def _clone(exc: BaseException, depth: int = 0) -> BaseException:
    """A copy of ``exc`` (type, args, attributes, chained causes alike) with no traceback.

    A kept traceback would keep the failed launch alive: its frames hold the simulation
    in their locals, and through ``f_back`` every caller's frame, up to jax's callback
    machinery holding the operands. ``launch_traceback`` keeps where it failed as text
    (a ``traceback.StackSummary``: file, line, function).
    """
    cls = type(exc)
    try:
        clone = cls.__new__(cls, *exc.args)
        clone.args = exc.args
        clone.__dict__.update(exc.__dict__)
    except Exception:  # an exception type that cannot be made without its __init__
        return exc
    clone.launch_traceback = traceback.extract_tb(exc.__traceback__)  # type: ignore[attr-defined]
    if depth < 8:
        if exc.__cause__ is not None:
            clone.__cause__ = _clone(exc.__cause__, depth + 1)
        if exc.__context__ is not None and not exc.__suppress_context__:
            clone.__context__ = _clone(exc.__context__, depth + 1)
    clone.__suppress_context__ = exc.__suppress_context__
    return clone


class FailureLog:
    """Recently failed launches' exceptions, by failure id (thread-safe, bounded)."""

    def __init__(self, capacity: int = 32, snapshots_with_contents: int = 1) -> None:
        self._with_contents = snapshots_with_contents
        self._entries: collections.OrderedDict[int, tuple[BaseException, tuple]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    @contextmanager
    def tagging(self) -> Iterator[None]:
        """Record any ``Exception`` leaving the block and tag its message with its id."""
        try:
            yield
        except Exception as e:
            self.record(e)
            raise

    def record(self, exc: BaseException) -> int:
        """Keep what re-raising ``exc`` needs and tag its message; returns its id."""
        with self._lock:
            fid = getattr(exc, _ID_ATTR, None)
            if fid is not None and fid in self._entries:
                return fid  # raised again by another device of the same launch
            fid = next(self._ids)
            kept = _clone(exc)
            try:
                setattr(exc, _ID_ATTR, fid)
            except AttributeError:
                return fid  # an exception type without a __dict__: cannot be claimed
            self._entries[fid] = (kept, kept.args)
            name = _type_name(exc)
            exc.args = _tagged(exc.args, _WHY.format(name), _TAG.format(fid, name))
            while len(self._entries) > self._capacity:
                old, old_args = self._entries.popitem(last=False)[1]
                old.args = old_args
            if len(self._entries) > self._with_contents:
                # The entry that just left the newest ones: its snapshot's arrays go.
                _drop_contents(list(self._entries.values())[-1 - self._with_contents][0])
        return fid

    @staticmethod
    def carries_id(message: str) -> bool:
        """Whether ``message`` carries a failure id (a kernel's failure, as jax shows it)."""
        return _TAG_RE.search(message) is not None

    def claim(self, message: str) -> BaseException | None:
        """The recorded exception whose failure id ``message`` carries (the last one
        named), with its own message restored; None if there is none."""
        ids = _TAG_RE.findall(message)
        if not ids:
            return None
        with self._lock:
            entry = self._entries.pop(int(ids[-1]), None)
        if entry is None:
            return None
        exc, original_args = entry
        exc.args = original_args
        return exc


def _type_name(exc: BaseException) -> str:
    """``palladium.interpret.DeadlockError`` for palladium's types (every one of them
    is exported there), the bare name for others."""
    cls = type(exc)
    if cls.__module__.startswith("palladium."):
        return f"palladium.interpret.{cls.__name__}"
    return cls.__name__


def _drop_contents(exc: BaseException) -> None:
    """Replace ``exc.snapshot`` by the same snapshot without its buffers' contents."""
    snapshot = getattr(exc, "snapshot", None)
    if snapshot is not None and hasattr(snapshot, "without_contents"):
        with contextlib.suppress(AttributeError):
            exc.snapshot = snapshot.without_contents()  # type: ignore[attr-defined]


def _tagged(args: tuple, why: str, tag: str) -> tuple:
    """``args`` with ``why`` before the message and ``tag`` on the line after it (the
    text jax shows)."""
    if len(args) == 1 and isinstance(args[0], str):
        return (f"{why}{args[0]}\n{tag}",)
    return (why, *args, tag)


def is_recorded(exc: BaseException) -> bool:
    """Whether ``exc`` is a recorded failure: its text (``str(exc)``) names its type and
    says how to get it typed, so a host callback reports that text alone."""
    return getattr(exc, _ID_ATTR, None) is not None
