"""Ctrl-C (SIGINT) during a multi-core or ``shard_map`` launch cancels the simulation and
joins its threads. Before, the simulated cores kept spinning and, under ``shard_map``,
the process could not exit without SIGKILL (the main thread is blocked inside XLA, where
Python's ``KeyboardInterrupt`` never reaches it)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.serial  # signals and deadlines: not beside a parallel run

# What every interrupted child shares: the recorder that prints "running" once the first
# grid point runs (the cores are in the kernel), its params, a launch over n devices.
_PREAMBLE = textwrap.dedent("""
    import sys, threading, time
    import jax, jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import NamedSharding, PartitionSpec as P
    from palladium.interpret import InterpretParams

    MODE = sys.argv[1]
    started = threading.Event()

    def recorder(point, core):
        if not started.is_set():
            started.set()
            print("running", flush=True)

    def params_of(cores):
        return InterpretParams(watchdog_timeout=None, rendezvous_timeout=600,
                               num_cores_or_threads=cores, grid_point_recorder=recorder)

    def on_devices(call, n, x):
        mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
        x = jax.device_put(x, NamedSharding(mesh, P("x")))
        return jax.jit(jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                     check_vma=False))(x)
""")


def _interrupted(tmp_path, child, mode, devices, timeout):
    """Run ``child`` (after the preamble) with ``MODE = mode`` on ``devices`` host devices;
    Ctrl-C it 1 s after it printed "running". Its return code, stdout and stderr."""
    script = tmp_path / "child.py"
    script.write_text(_PREAMBLE + child)
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        time.sleep(1.0)  # the cores are in the kernel (they printed "running" from it)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


_CHILD = textwrap.dedent("""
    import signal
    # palladium's watcher (installed at import) sees SIGINT through the wakeup fd and
    # cancels the launch; a no-op Python handler keeps a second KeyboardInterrupt (from
    # Python's own handler, once XLA returns) from racing the report below.
    signal.signal(signal.SIGINT, lambda *args: None)
    params = params_of(2 if MODE == "megacore" else 1)

    def spin_kernel(x_ref, o_ref, flag):
        def spin(n):
            pl.delay(10)
            return n + 1
        flag[0] = jax.lax.while_loop(lambda n: n >= 0, spin, 0)
        o_ref[...] = x_ref[...]

    def call(x):
        return pl.pallas_call(spin_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              scratch_shapes=[pltpu.SMEM((1,), jnp.int32)],
                              interpret=params)(x)

    try:
        if MODE == "megacore":
            x = jnp.ones((16, 128))
            out = pl.pallas_call(
                spin_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                scratch_shapes=[pltpu.SMEM((1,), jnp.int32)],
                compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
                interpret=params)(x)
        else:
            out = on_devices(call, 4, jnp.ones((32, 128)))
        out.block_until_ready()
    except BaseException as e:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("palladium device")]
        cancelled = "cancelled by Ctrl-C" in str(e)
        print("interrupted", cancelled, "threads", alive, flush=True)
        sys.exit(3)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["megacore", "shard_map"])
def test_ctrl_c_cancels_the_launch_and_joins_its_threads(mode, tmp_path):
    returncode, out, _ = _interrupted(tmp_path, _CHILD, mode, devices=8, timeout=60)
    assert returncode == 3, out
    assert "interrupted True threads []" in out, out


_QUIET_EXIT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.experimental import pallas as pl
    from palladium.interpret import InterpretParams
    from palladium.interpret.run import interrupts

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         interpret=InterpretParams())(jnp.zeros((8, 128), jnp.float32))
    print("watching", bool(interrupts._installed), float(out[0, 0]), flush=True)
""")


@pytest.mark.timeout(120)
def test_the_watcher_closes_its_sockets_at_exit(tmp_path):
    """The watcher's socket pair is closed at exit: no ``ResourceWarning`` (seen with
    ``-X dev``) for an unclosed socket, and the wakeup fd is given back."""
    script = tmp_path / "child.py"
    script.write_text(_QUIET_EXIT)
    done = subprocess.run([sys.executable, "-X", "dev", str(script)], capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "watching True 1.0"
    assert "unclosed <socket" not in done.stderr, done.stderr


# A grid of 10^6 steps whose kernel has no scheduling point of its own (no loop, no DMA,
# no semaphore): Ctrl-C and the watchdog must be seen between grid steps.
_GRID_CHILD = textwrap.dedent("""
    params = params_of(2 if MODE == "2 cores" else 1)

    def step_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    def call(x):
        return pl.pallas_call(
            step_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(10**6,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel",) if MODE == "2 cores" else ("arbitrary",)),
            interpret=params)(x)

    try:
        if MODE == "2 devices":
            out = on_devices(call, 2, jnp.ones((16, 128)))
        else:
            out = call(jnp.ones((8, 128)))
        out.block_until_ready()
        print("finished", flush=True)
    except BaseException as e:
        print("caught", type(e).__name__, "after", type(e.__context__).__name__, flush=True)
        for _ in range(40):  # a second exception (a late KeyboardInterrupt) would come here
            time.sleep(0.01)
        print("handled", flush=True)
""")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("shape", ["1 core", "2 cores", "2 devices"])
def test_ctrl_c_between_grid_steps_is_one_keyboard_interrupt_and_the_process_exits(
        shape, tmp_path):
    """Before, the launch ran on after Ctrl-C (a full core busy) and a 2-device process
    could not exit; a 1-core launch surfaced as ``JaxRuntimeError``; a 2-device one raised
    ``JaxRuntimeError``, then a ``KeyboardInterrupt`` in the caller's ``except`` block, then
    "Exception ignored in atexit callback" at exit."""
    returncode, out, err = _interrupted(tmp_path, _GRID_CHILD, shape, devices=2, timeout=90)
    assert out.splitlines() == ["caught KeyboardInterrupt after NoneType", "handled"], (out, err)
    assert returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cores", [1, 2])
def test_the_watchdog_is_checked_between_grid_steps(cores):
    """A grid of 10^6 steps whose kernel has no loop used to run past its watchdog."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from palladium.interpret import InterpretParams, WatchdogError, errors_as_raised

    def step_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    call = pl.pallas_call(
        step_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=(10**6,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",) if cores == 2 else ("arbitrary",)),
        interpret=InterpretParams(watchdog_timeout=0.5, num_cores_or_threads=cores))
    with pytest.raises(WatchdogError, match=r"^watchdog: the run is still going after 0.5 s (?s:.*)"
                                            r"\n  device 0 core [01] is looping at kernel "
                                            r"'step_kernel', grid step, grid point \(\d+,\)"), \
            errors_as_raised():
        jax.block_until_ready(call(jnp.zeros((8, 128))))
