"""A host callback as an XLA FFI handler of palladium's own: the operands as views of
XLA's buffers, with no copy.

jax's CPU callback handler (``xla_ffi_python_cpu_callback``) builds each operand's numpy
array without a base object, and numpy then copies it: a 2 MiB operand costs ~50 us
before the callback even starts, and the copy lands at a 16-byte address, so a compiled
launch handing it to XLA again pays a second copy (XLA's CPU client reads only 64-byte
aligned host memory in place). This handler reads XLA's FFI call frame itself (``ctypes``
over the C API's structs, ``xla/ffi/api/c_api.h`` of the jaxlib installed) and hands the
function read-only numpy views of the operand buffers, valid during the call only.

One handler serves every call: the lowering passes the call's key as the ``index``
attribute, and the key's entry (the function, its result types) lives as long as the
executable: a sentinel kept in the module's host callbacks removes it when jax drops
the executable. A failing function's exception becomes the FFI error's message (its
type, message and traceback as text; no frame is kept); a kernel's failure recorded in
the failure log, its message alone (which names its type: ``state.failures``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import math
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.state.failures import is_recorded
from palladium.interpret.state.process_state import STATE

__all__ = ["available", "lower_ffi_callback", "supports"]

TARGET = "palladium_host_call"
_METADATA = 1  # XLA_FFI_Extension_Metadata
_EXECUTE = 3  # XLA_FFI_ExecutionStage_EXECUTE
_INTERNAL = 13  # XLA_FFI_Error_Code_INTERNAL
_ATTR_SCALAR = 3  # XLA_FFI_AttrType_SCALAR


class _ExtensionBase(ctypes.Structure):
    pass


_ExtensionBase._fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                           ("next", ctypes.POINTER(_ExtensionBase))]


class _ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


_ErrorCreate = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorCreateArgs))


class _Api(ctypes.Structure):  # the leading fields of XLA_FFI_Api
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("api_version", _ApiVersion), ("internal_api", ctypes.c_void_p),
                ("error_create", _ErrorCreate)]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion),
                ("traits", ctypes.c_uint32)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _ExtensionBase), ("metadata", ctypes.POINTER(_Metadata))]


class _Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("dtype", ctypes.c_int), ("data", ctypes.c_void_p), ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


class _List(ctypes.Structure):  # XLA_FFI_Args and XLA_FFI_Rets
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                ("items", ctypes.POINTER(ctypes.c_void_p))]


class _Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                ("names", ctypes.c_void_p), ("attrs", ctypes.POINTER(ctypes.c_void_p))]


class _Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.POINTER(ctypes.c_uint64))]


class _CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", ctypes.POINTER(_ExtensionBase)),
                ("api", ctypes.POINTER(_Api)), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int),
                ("args", _List), ("rets", _List), ("attrs", _Attrs), ("future", ctypes.c_void_p)]


class _Array:
    """How to view a buffer of one operand's or result's type: its shape, dtype and the
    ctypes type of its bytes (made once, at lowering: a call builds each view from a
    pointer in ~0.8 us, where ``ctypes.cast`` and a new array type took ~1.6 us)."""

    __slots__ = ("dtype", "empty", "raw", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)
        nbytes = math.prod(shape) * self.dtype.itemsize  # (Python ints: no overflow)
        self.empty = nbytes == 0
        self.raw = ctypes.c_char * nbytes

    def view(self, item: int, writeable: bool) -> np.ndarray:
        """The buffer at ``item`` (an ``XLA_FFI_Buffer*``) as an array."""
        if self.empty:
            return np.zeros(self.shape, self.dtype)
        data = ctypes.c_void_p.from_address(item + _DATA).value
        array = np.frombuffer(self.raw.from_address(data), self.dtype).reshape(self.shape)
        if not writeable:
            array.flags.writeable = False
        return array


@dataclasses.dataclass(frozen=True)
class _Call:
    fn: Callable[..., Sequence[np.ndarray]]
    operands: tuple[_Array, ...]
    results: tuple[_Array, ...]


_CALLS: dict[int, _Call] = STATE.keep(
    "ffi_host_calls", {}, owner=__name__,
    holds="the host callbacks of the compiled calls alive now, by key")
_KEYS = itertools.count(1)
_LOCK = threading.Lock()
_DATA = _Buffer.data.offset


def _run(frame: _CallFrame) -> None:
    attrs = frame.attrs
    if attrs.size != 1 or attrs.types[0] != _ATTR_SCALAR:
        raise RuntimeError(f"{TARGET}: expected one scalar attribute, the call's key")
    key = int(ctypes.cast(attrs.attrs[0], ctypes.POINTER(_Scalar)).contents.value[0])
    call = _CALLS.get(key)
    if call is None:
        raise RuntimeError(f"{TARGET}: call {key} is not registered (its executable is gone)")
    args, rets = frame.args, frame.rets
    if args.size != len(call.operands) or rets.size != len(call.results):
        raise RuntimeError(f"{TARGET}: {args.size} operands and {rets.size} results, "
                           f"expected {len(call.operands)} and {len(call.results)}")
    items = args.items
    results = call.fn(*[a.view(items[i], False) for i, a in enumerate(call.operands)])
    if len(results) != len(call.results):
        raise RuntimeError(f"{TARGET}: {len(results)} results, expected {len(call.results)}")
    items = rets.items
    for i, (a, value) in enumerate(zip(call.results, results)):
        value = np.asarray(value)
        if value.shape != a.shape or value.dtype != a.dtype:
            raise RuntimeError(f"{TARGET}: result {i} is {value.dtype}{list(value.shape)}, "
                               f"expected {a.dtype}{list(a.shape)}")
        if not a.empty:
            np.copyto(a.view(items[i], True), value)


def _handle(pointer: Any) -> int | None:
    frame = pointer.contents
    try:
        ext = frame.extension_start
        if ext and ext.contents.type == _METADATA:  # registration asks for the API version
            meta = ctypes.cast(ext, ctypes.POINTER(_MetadataExtension)).contents.metadata.contents
            version = frame.api.contents.api_version
            meta.api_version.major_version = version.major_version
            meta.api_version.minor_version = version.minor_version
            meta.traits = 0
            return None
        if frame.stage != _EXECUTE:
            return None
        _run(frame)
        return None
    except BaseException as error:  # noqa: BLE001 - every failure becomes the FFI's error
        if is_recorded(error):
            # A kernel's failure (failures.FailureLog): its text already names its type
            # and says how to get it typed; the traceback is palladium's frames only.
            text = str(error)
        else:  # what failed first, then where (the traceback as text: no frame is kept)
            text = ("".join(traceback.format_exception_only(error)).rstrip() + "\n\n"
                    + "".join(traceback.format_exception(error)))
        del error
        args = _ErrorCreateArgs(ctypes.sizeof(_ErrorCreateArgs), None,
                                text.encode("utf-8", "replace"), _INTERNAL)
        return frame.api.contents.error_create(ctypes.byref(args))


_HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_CallFrame))(_handle)
_REGISTERED: list[bool] = []


def available() -> bool:
    """Whether the handler is registered (once per process; False where jax's FFI API
    is not the one these structs were written for: jax's own callback then serves)."""
    with _LOCK:
        if not _REGISTERED:
            try:
                pointer = ctypes.cast(_HANDLER, ctypes.c_void_p).value
                assert pointer is not None
                jc.register_cpu_ffi_target(TARGET, pointer)
                _REGISTERED.append(True)
            except Exception:  # noqa: BLE001 - not this jaxlib's API
                _REGISTERED.append(False)
        return _REGISTERED[0]


def _whole_bytes(dtype: Any) -> bool:
    """Whether XLA stores ``dtype`` one element per ``itemsize`` bytes (not the packed
    sub-byte types: int4, uint4, float4, ... hold two or more elements per byte)."""
    return jc.itemsize_bits(dtype) == 8 * np.dtype(dtype).itemsize


def supports(avals: Sequence[Any]) -> bool:
    """Whether the handler can pass operands and results of these types (it reads and
    writes whole-byte elements only; the others go through jax's callback)."""
    return all(_whole_bytes(a.dtype) for a in avals)


class _Release:
    """Kept among the module's host callbacks (so by the executable): forgets the call
    when jax drops the executable. Never called."""

    def __init__(self, key: int) -> None:
        self.key = key

    def __call__(self, *args: Any) -> None:
        raise RuntimeError("not a callback")

    def __del__(self) -> None:
        calls = globals().get("_CALLS")  # (None or gone at interpreter exit)
        if calls is not None:
            calls.pop(self.key, None)


def lower_ffi_callback(ctx: Any, fn: Callable[..., Sequence[np.ndarray]],
                       operands: Sequence[Any]) -> Any:
    """Lower a call of ``fn(*read-only views of the operands) -> arrays`` (the views
    are valid during the call only); ``ctx``'s avals give the operand and result types."""
    key = next(_KEYS)
    _CALLS[key] = _Call(fn, tuple(_Array(tuple(a.shape), a.dtype) for a in ctx.avals_in),
                        tuple(_Array(tuple(a.shape), a.dtype) for a in ctx.avals_out))
    jc.keep_with_executable(ctx, _Release(key))
    return jc.lower_ffi_call(ctx, TARGET, operands, index=np.uint64(key))
