"""The TPU compiler's own verdict on a kernel, on a CPU: libtpu compiles it for a TPU
topology of the simulated chip (no TPU needed), exactly as ``jax.jit`` would on a TPU.

``pip install 'palladium-interpret[compiler]'`` installs the libtpu that the installed
jax pins (``jax[tpu]``: jax 0.10.2 -> libtpu 0.0.42.*, 0.10.0 -> 0.0.40.*). With it, a
``pallas_call`` (or ``core_map``, or a ``shard_map``-ped multi-device kernel, compiled over
a mesh of the topology's devices of the launch's mesh shape) is bound again with
``interpret=False`` and lowered by ``jax.jit(...).trace(...).lower(lowering_platforms=
("tpu",))`` with a topology device as jax's default device, here; libtpu compiles the
lowered program in a process of its own (``compiler_process``: it aborts its process on
some kernels).

A verdict is cached in memory and in palladium's disk cache (``state.disk_cache``,
folder ``tpu-compiler``; one small JSON entry per kernel), keyed by the lowered TPU module (MLIR bytecode, with its source locations), the chip, the topology
and the versions of libtpu, jax and jaxlib: another libtpu or jax, or a kernel moved to
other lines, misses.

What the compiler knows on acceptance is kept: the scoped VMEM the kernel uses (from the
compiled ``tpu_custom_call``'s ``used_scoped_memory_configs``). An accepted verdict is
also kept under the call's key (``call_key``: its parameters and operand types, in
folder ``tpu-compiler-calls``), which costs no TPU lowering to make: a known kernel's check then takes a
few milliseconds instead of a Mosaic lowering, and a process whose kernels are all known
never loads libtpu's topology.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import CHIPS, chip_record
from palladium.interpret.fidelity.call_key import call_key
from palladium.interpret.fidelity.compiler_process import COMPILER_PROCESS, PRESTART_VARIABLE
from palladium.interpret.fidelity.compiler_protocol import describe_failure
from palladium.interpret.state.disk_cache import DiskCache
from palladium.interpret.state.environment import environment_digest, version
from palladium.interpret.state.process_state import STATE

__all__ = [
    "INSTALL_COMMAND",
    "Verdict",
    "can_compile_for",
    "compilable_chips",
    "compile_verdict",
    "compiler_version",
    "module_key",
    "topology_device",
    "topology_name",
]

INSTALL_COMMAND = "pip install 'palladium-interpret[compiler]'"

#: The chips libtpu compiles for (``chip.Chip.compiler_topology``: the family libtpu knows
#: each by, and whether its topologies are 3-D); for the others, the verdict is the
#: approximation's.
_COMPILED_CHIPS = tuple(c for c in CHIPS if chip_record(c).compiler_topology is not None)
_SHAPES_2D = ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
_SHAPES_3D = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8")

# Resource failures (the compiler's codes and words for "does not fit").
_RESOURCE = re.compile(r"E1001|[Rr]an out of memory|would exceed memory|exceeds? the "
                       r"(?:scoped )?(?:vmem|smem|memory) limit|RESOURCE_EXHAUSTED")
_LOCATION = re.compile(r'"([^"]+\.py)":(\d+):\d+')


@functools.cache
def compiler_version() -> str | None:
    """The installed libtpu's version, or None when there is none (or this jax cannot
    compile for a topology without devices)."""
    if importlib.util.find_spec("libtpu") is None:
        return None
    try:
        from jax.experimental import topologies  # noqa: F401
    except ImportError:
        return None
    return version("libtpu") or "unknown"


def prestart() -> None:
    """Where libtpu is installed, start the compiler's process in the background (unless
    ``PALLADIUM_COMPILER_PRESTART=0``): the first new kernel then does not wait for its
    imports."""
    if compiler_version() is not None and os.environ.get(PRESTART_VARIABLE, "1") != "0":
        COMPILER_PROCESS.prestart()


def checker_name() -> str:
    """How reports name the compiler: ``libtpu 0.0.42.1 (jax 0.10.2)``."""
    return f"libtpu {compiler_version()} (jax {jax.__version__})"


def can_compile_for(chip: str) -> bool:
    """Whether the installed libtpu compiles for ``chip``."""
    return compiler_version() is not None and chip in _COMPILED_CHIPS


def compilable_chips() -> list[str]:
    """The chips the installed libtpu compiles for (none without libtpu)."""
    return list(_COMPILED_CHIPS) if compiler_version() is not None else []


def topology_name(chip: str, num_devices: int) -> str:
    """The smallest topology of ``chip`` with at least ``num_devices`` devices."""
    topology = chip_record(chip).compiler_topology
    if topology is None:
        raise ValueError(f"the installed libtpu does not compile for TPU {chip}")
    family, three_d = topology
    for shape in (_SHAPES_3D if three_d else _SHAPES_2D):
        name = f"{family}:{shape}"
        if len(_topology(name).devices) >= num_devices:
            return name
    raise ValueError(f"no {chip} topology has {num_devices} devices")


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """libtpu writes warnings about the missing TPU host straight to file descriptor 2
    when it starts; they do not reach the user."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


_TOPOLOGY_LOCK = threading.Lock()


@functools.cache
def _topology(name: str) -> Any:
    from jax.experimental import topologies

    # Several processes (pytest-xdist workers) may load libtpu at once on a CPU box.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with _TOPOLOGY_LOCK, _quiet_stderr():
        return topologies.get_topology_desc(platform="tpu", topology_name=name)


def topology_device(name: str) -> Any:
    """The first device of libtpu's topology ``name`` (lowering for it needs no TPU)."""
    return _topology(name).devices[0]


STATE.keep("tpu_topologies", _topology, owner=__name__,
           holds="libtpu's topologies by name (made once: they take seconds)",
           clear=_topology.cache_clear)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the TPU compiler said of one kernel.

    ``kind``: "accepted", "resource" (does not fit: VMEM/SMEM), "lowering" (Mosaic or
    jax's TPU lowering rejects it), "other" (another compiler error), "crashed" (the
    compiler's process died on it) or "timeout". ``message`` is the compiler's, whole.
    ``error`` is the exception of a failure raised while lowering (not cached), for the
    kernel line it was lowering. ``vmem_bytes``: the scoped VMEM the compiled kernel
    uses. ``source``: "compiled", "memory" or "disk" (where the verdict came from).
    """

    kind: str
    message: str
    checker: str
    topology: str
    seconds: float
    vmem_bytes: int | None = None
    source: str = "compiled"
    error: BaseException | None = None

    @property
    def accepted(self) -> bool:
        return self.kind == "accepted"

    @property
    def location(self) -> str | None:
        """``file.py:line`` of the kernel line the compiler's MLIR location names."""
        found = _LOCATION.search(self.message.split("at location:", 1)[-1])
        return f"{os.path.basename(found.group(1))}:{found.group(2)}" if found else None


# Bumped whenever what a cached verdict holds, or how its message is made, changes.
_FORMAT = 2

_MEMORY: dict[str, Verdict] = STATE.keep(
    "tpu_verdicts", {}, owner=__name__, holds="the TPU compiler's verdicts by module key",
    clear=lambda: clear_memory_cache())
# Accepted verdicts by the call's key (``call_key``: the pallas_call's parameters and
# operand types, not its lowered module): a call seen before skips its TPU lowering.
_CALLS: dict[str, Verdict] = STATE.keep(
    "tpu_accepted_calls", {}, owner=__name__,
    holds="the TPU compiler's accepted verdicts by call key", clear=lambda: clear_memory_cache())
_MEMORY_LOCK = threading.Lock()


#: Verdicts across processes, by the lowered module's key and (accepted ones) by the call's.
VERDICTS = DiskCache("tpu-compiler")
ACCEPTED_CALLS = DiskCache("tpu-compiler-calls")


def clear_memory_cache() -> None:
    """Forget the verdicts kept in this process (the disk cache stays)."""
    with _MEMORY_LOCK:
        _MEMORY.clear()
        _CALLS.clear()


_WORKER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="palladium-tpu-compiler")


def compile_verdict(bind: Callable[..., Any], avals_in: Sequence[Any], *, chip: str,
                    mesh_axes: dict[str, int], use_disk: bool = True,
                    host: tuple[Sequence[bool], Sequence[bool]] = ((), ()),
                    call: Mapping[str, Any] | None = None) -> Verdict:
    """Compile ``bind`` (the kernel's primitive bound with ``interpret=False``) for
    ``chip`` with operands ``avals_in`` (per device), over a mesh of ``mesh_axes`` when
    there is one; return the compiler's verdict. ``host``: which operands and which
    results live in the host's memory (``pl.HOST``): they are placed in pinned host
    memory, as a TPU program must place them (the compiler aborts otherwise).

    It is traced, lowered and compiled on a thread of its own: jax's trace state and
    context meshes are per thread, and the caller (a lowering rule, possibly inside a
    ``shard_map``) is in the middle of another trace.

    ``call``: the ``pallas_call``'s parameters. An accepted verdict is also kept (in
    memory and on disk) under their ``call_key``, and a call found there is not lowered
    for the TPU again (the lowering, which makes the module's key, is most of what a
    known kernel's check costs). A rejection is never kept so: it is lowered and
    reported as before.
    """
    return _WORKER.submit(_known_or_compiled, bind, avals_in, chip=chip,
                          mesh_axes=mesh_axes, use_disk=use_disk, host=host,
                          call=call).result()


def _known_or_compiled(bind: Callable[..., Any], avals_in: Sequence[Any], *, chip: str,
                       mesh_axes: dict[str, int], use_disk: bool,
                       host: tuple[Sequence[bool], Sequence[bool]],
                       call: Mapping[str, Any] | None) -> Verdict:
    """An accepted verdict kept under the call's key, else ``_compile_verdict``'s. On the
    compiler's thread: the key holds jax's configuration as its lowering sees it."""
    start = time.perf_counter()
    by_call = None if call is None else call_key(
        call, avals_in, "tpu-compiler-accepted", _FORMAT, environment_digest(), chip,
        sorted(mesh_axes.items()), [list(h) for h in host], sorted(jax.config.values.items()))
    if by_call is not None:
        known = _accepted_call(by_call, use_disk)
        if known is not None:
            return dataclasses.replace(known, seconds=time.perf_counter() - start)
    verdict = _compile_verdict(bind, avals_in, chip=chip, mesh_axes=mesh_axes,
                               use_disk=use_disk, host=host)
    if by_call is not None and verdict.accepted:
        with _MEMORY_LOCK:
            _CALLS[by_call] = verdict
        if use_disk:
            _write_disk(by_call, verdict, ACCEPTED_CALLS)
    return verdict


def _accepted_call(key: str, use_disk: bool) -> Verdict | None:
    with _MEMORY_LOCK:
        known = _CALLS.get(key)
    if known is not None:
        return dataclasses.replace(known, source="memory")
    found = _read_disk(key, ACCEPTED_CALLS) if use_disk else None
    if found is None or not found.accepted:
        return None
    with _MEMORY_LOCK:
        _CALLS[key] = found
    return found


def _compile_verdict(bind: Callable[..., Any], avals_in: Sequence[Any], *, chip: str,
                     mesh_axes: dict[str, int], use_disk: bool,
                     host: tuple[Sequence[bool], Sequence[bool]] = ((), ())) -> Verdict:
    start = time.perf_counter()
    num_devices = int(np.prod(list(mesh_axes.values()))) if mesh_axes else 1
    topo_name = topology_name(chip, num_devices)
    devices = _topology(topo_name).devices
    checker = checker_name()
    fn, shardings = _program(bind, mesh_axes, devices)
    host_in, host_out = host
    placed = [s.with_memory_kind("pinned_host") if i < len(host_in) and host_in[i] else s
              for i, s in enumerate(shardings(len(avals_in)))]
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
               for a, s in zip(avals_in, placed)]
    jit_args: dict[str, Any] = {}
    if any(host_out):
        result_shardings = shardings(len(host_out))
        jit_args["out_shardings"] = [
            s.with_memory_kind("pinned_host") if on_host else s
            for s, on_host in zip(result_shardings, host_out)]
    with jax.default_device(devices[0]):
        try:
            lowered = jax.jit(fn, **jit_args).trace(*structs).lower(
                lowering_platforms=("tpu",))
        except Exception as exc:  # noqa: BLE001  (jax's TPU lowering rejects the kernel)
            return Verdict(_kind(exc), describe_failure(exc), checker, topo_name,
                           time.perf_counter() - start, error=exc)
        bytecode = jc.module_bytecode(lowered)  # with its source locations
        key = module_key(bytecode, chip, topo_name, _FORMAT)
        with _MEMORY_LOCK:
            known = _MEMORY.get(key)
        if known is not None:
            return dataclasses.replace(known, source="memory",
                                       seconds=time.perf_counter() - start)
        found = _read_disk(key) if use_disk else None
        if found is not None:
            verdict = dataclasses.replace(found, seconds=time.perf_counter() - start)
        else:
            outcome, message, vmem, _ = COMPILER_PROCESS.compile(
                bytecode, topo_name, num_devices, len(avals_in),
                len(jax.tree_util.tree_leaves(lowered.out_info)))
            seconds = time.perf_counter() - start
            if outcome == "accepted":
                verdict = Verdict("accepted", "", checker, topo_name, seconds,
                                  vmem_bytes=vmem)
            elif outcome == "failed":
                verdict = Verdict(_kind_of_text(message), message, checker, topo_name,
                                  seconds)
            else:  # the compiler's process died, or took longer than COMPILE_TIMEOUT
                verdict = Verdict(outcome, message, checker, topo_name, seconds)
            if verdict.kind == "timeout":
                return verdict  # not a verdict on the kernel: ask again next time
            if use_disk:
                _write_disk(key, verdict)
    with _MEMORY_LOCK:
        _MEMORY[key] = verdict
    return verdict


def _program(bind: Callable[..., Any], mesh_axes: dict[str, int],
             devices: Sequence[Any]) -> tuple[Callable[..., Any], Callable[[int], list[Any]]]:
    """The function to compile and the shardings of its operands."""
    if not mesh_axes:
        single = jax.sharding.SingleDeviceSharding(devices[0])
        return bind, lambda n: [single] * n
    sizes = tuple(mesh_axes.values())
    mesh = jax.sharding.Mesh(np.array(devices[: int(np.prod(sizes))]).reshape(sizes),
                             tuple(mesh_axes))
    spec = jax.sharding.PartitionSpec()
    # Replicated operands: every device sees the per-device shapes the kernel was traced
    # with, as under the user's shard_map.
    fn = jax.shard_map(bind, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    named = jax.sharding.NamedSharding(mesh, spec)
    return fn, lambda n: [named] * n


def _kind(exc: BaseException) -> str:
    """The kind of a failure raised while lowering (jax's TPU lowering, in this process)."""
    text = describe_failure(exc)
    return "resource" if _RESOURCE.search(text) else "lowering"


def _kind_of_text(message: str) -> str:
    """The kind of a compiler failure, from its message (``"Type: text"``)."""
    if _RESOURCE.search(message):
        return "resource"
    name = message.split(":", 1)[0]
    if "Mosaic" in message or "verif" in message.lower() or name != "JaxRuntimeError":
        return "lowering"
    return "other"


def module_key(module: bytes, chip: str, topology: str, version: int) -> str:
    """The disk-cache key of what libtpu said of a lowered ``module`` (its MLIR
    bytecode) for ``chip`` on ``topology``: the versions (libtpu, jax, jaxlib) and the
    entry format's ``version`` included."""
    h = hashlib.sha256()
    h.update(repr((version, environment_digest(), chip, topology)).encode())
    h.update(module)
    return h.hexdigest()


def _read_disk(key: str, cache: DiskCache = VERDICTS) -> Verdict | None:
    found = cache.get(key)
    if found is None:
        return None
    try:
        data = json.loads(found)
        return Verdict(kind=data["kind"], message=data["message"], checker=data["checker"],
                       topology=data["topology"], seconds=0.0, vmem_bytes=data["vmem_bytes"],
                       source="disk")
    except (ValueError, KeyError, TypeError):
        return None


def _write_disk(key: str, verdict: Verdict, cache: DiskCache = VERDICTS) -> None:
    data = {"kind": verdict.kind, "message": verdict.message, "checker": verdict.checker,
            "topology": verdict.topology, "vmem_bytes": verdict.vmem_bytes}
    cache.put(key, json.dumps(data).encode())
