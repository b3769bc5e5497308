"""``sweep``: predict many configurations of a kernel, ranked by predicted time.

Each configuration is checked and predicted by :func:`palladium.interpret.predict`; the
result is a :class:`SweepResult`: the accepted ones sorted by predicted time (ties: the
order the configurations were given), the rejected ones with their reasons. Everything
in the table is simulated (time, bytes, verdict), so the same sweep gives the same table
on every run and machine; only ``wall_seconds`` (what predicting cost here) varies.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import jax

from palladium.interpret.chip import DEFAULT_CHIP
from palladium.interpret.errors import ConfigError, PalladiumError
from palladium.interpret.tune.measure import NO_TPU
from palladium.interpret.tune.measure import measure as measure_on_chip
from palladium.interpret.tune.predict import Prediction, predict, short_reason
from palladium.interpret.tune.sweep_result import SweepResult, SweepRow, config_label
from palladium.interpret.tune.zero_operands import concrete_operand

__all__ = ["SweepResult", "SweepRow", "sweep"]


def _one(
    make_call: Callable[[Any], Callable[..., Any]],
    config: Any,
    args: tuple[Any, ...],
    chip: str,
    compile_check: str,
    params: dict[str, Any],
    keep_launches: bool = True,
) -> SweepRow:
    t0 = time.perf_counter()
    try:
        # make_call runs inside predict: pl.pallas_call reads the interpret mode predict
        # sets when it is constructed.
        p = predict(lambda *a: make_call(config)(*a), *args, chip=chip,
                    compile_check=compile_check, **params)
    except (PalladiumError, ValueError, TypeError) as e:
        # A configuration jax or the kernel refuses (a block that does not divide the
        # array, an out-of-bounds block index): rejected, with the error's first line.
        return SweepRow(
            config=config,
            prediction=None,
            reason=short_reason(e),
            error=type(e).__name__,
            wall_seconds=time.perf_counter() - t0,
        )
    if keep_launches:
        for record in p.launches:  # a sweep keeps every record: their summaries, not spans
            record.drop_detail()
    p_row: Prediction = p if keep_launches else dataclasses.replace(p, launches=())
    return SweepRow(
        config=config,
        prediction=p_row,
        reason=p_row.reason,
        error=p_row.error,
        wall_seconds=time.perf_counter() - t0,
    )


class _Progress:
    """A one-line progress bar on a terminal (nothing when ``stream`` is not a TTY)."""

    def __init__(self, total: int, stream: TextIO | None, enabled: bool | None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = enabled if enabled is not None else bool(isatty and isatty())
        self.done = 0

    def update(self, row: SweepRow) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // max(self.total, 1)
        seconds = row.predicted_seconds
        what = f"{seconds * 1e6:,.1f} us" if row.accepted and seconds is not None else "rejected"
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{config_label(row.config)}: {what}\033[K"
        )
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def sweep(
    make_call: Callable[[Any], Callable[..., Any]],
    configs: Iterable[Any],
    *args: Any,
    chip: str = DEFAULT_CHIP,
    compile_check: str = "auto",
    processes: int = 1,
    progress: bool | None = None,
    progress_stream: TextIO | None = None,
    measure: bool = False,
    measure_iters: int = 20,
    **params: Any,
) -> SweepResult:
    """Check and predict ``make_call(config)(*args)`` for every ``config`` on TPU ``chip``
    (``make_call(**config)`` when the configs are dicts).

    ``make_call`` returns the function to predict (it calls ``pl.pallas_call``;
    see :func:`palladium.interpret.predict` for ``args``, ``compile_check`` and the other
    keyword arguments, ``InterpretParams`` fields). A configuration the compiler (or the
    approximation) rejects, or that jax or palladium refuses to run (``ValueError``,
    ``TypeError`` or a palladium error), is listed in ``result.rejected`` with the reason;
    other exceptions propagate.

    ``processes > 1`` predicts in that many worker processes (``make_call`` and every
    config must pickle: a module-level function and plain values); it pays for sweeps
    whose configurations each take seconds, not for quick ones (each worker imports jax
    first; their rows carry no launch records). In one process each row's prediction keeps
    its launch records' summaries (their spans are dropped: ``predict`` one configuration
    again for its trace). ``progress``: a progress bar on stderr (None: only when stderr
    is a terminal).

    ``measure=True`` (on a TPU host, in one process) also runs every accepted
    configuration compiled on the chip and puts its device time beside the prediction
    (``SweepRow.measured_seconds``, the ``measured_us`` column, ``rank_agreement``):
    :func:`palladium.interpret.measure`, median of ``measure_iters`` calls; arguments
    given as ``jax.ShapeDtypeStruct`` run as zeros.

    >>> import jax, jax.numpy as jnp
    >>> from jax.experimental import pallas as pl
    >>> def make(rows):
    ...     spec = pl.BlockSpec((rows, 1024), lambda i: (i, 0))
    ...     return pl.pallas_call(lambda x, o: o.__setitem__(..., x[...] + 1),
    ...         out_shape=jax.ShapeDtypeStruct((4096, 1024), jnp.float32),
    ...         grid=(4096 // rows,), in_specs=[spec], out_specs=spec)
    >>> r = sweep(make, [{"rows": 64}, {"rows": 512}, {"rows": 4096}],
    ...           jax.ShapeDtypeStruct((4096, 1024), jnp.float32),
    ...           compile_check="approximate")
    >>> [row.label for row in r.ranked], [row.label for row in r.rejected]
    (['rows=512', 'rows=64'], ['rows=4096'])
    """
    configs = list(configs)
    if processes < 1:
        raise ConfigError(f"sweep(processes={processes!r}): pass 1 (in this process) or more.")
    if measure:
        if jax.default_backend() != "tpu":
            raise ConfigError("sweep(measure=True): " + NO_TPU.format(
                backend=jax.default_backend()))
        if processes != 1:
            raise ConfigError("sweep(measure=True) runs in one process (one process at a "
                              "time can hold a TPU): pass processes=1")
    call = make_call if not configs or not isinstance(configs[0], dict) else _Kwargs(make_call)
    bar = _Progress(len(configs), progress_stream, progress)
    t0 = time.perf_counter()
    rows: list[SweepRow | None] = [None] * len(configs)
    if processes == 1 or len(configs) <= 1:
        for i, config in enumerate(configs):
            row = _one(call, config, args, chip, compile_check, params)
            if measure and row.accepted:
                chip_args = [concrete_operand(a) for a in args]
                timed = measure_on_chip(call(config), *chip_args, iters=measure_iters)
                row = dataclasses.replace(row, measured_seconds=timed.seconds)
            rows[i] = row
            bar.update(row)
    else:
        ctx = multiprocessing.get_context("spawn")  # jax's threads do not survive fork
        with concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx) as pool:
            futures = {
                pool.submit(_one, call, config, args, chip, compile_check, params, False): i
                for i, config in enumerate(configs)
            }
            for future in concurrent.futures.as_completed(futures):
                row = future.result()
                rows[futures[future]] = row
                bar.update(row)
    done = [r for r in rows if r is not None]
    return SweepResult(rows=tuple(done), chip=chip, wall_seconds=time.perf_counter() - t0)


class _Kwargs:
    """``make_call(**config)`` for dict configs (a class, so it pickles for workers)."""

    def __init__(self, make_call: Callable[..., Callable[..., Any]]) -> None:
        self.make_call = make_call

    def __call__(self, config: dict[str, Any]) -> Callable[..., Any]:
        return self.make_call(**config)
