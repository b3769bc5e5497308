"""A kernel's failure reaches a plain script as palladium's own exception where jax lets
it (a ``pallas_call``'s function called on its own), and as one clean ``JaxRuntimeError``
where it does not (inside the caller's ``jax.jit``): the message once, the user's frames
only, the reason on the first line and the way to get the typed exception on the last;
a caught multi-device failure is not raised again by jax's exit barriers."""

import os
import subprocess
import sys
import textwrap
import traceback

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palladium.interpret as pi

pytestmark = pytest.mark.timeout(120)

X = jnp.ones((64, 128), jnp.float32)
PALLADIUM_SRC = os.path.dirname(os.path.dirname(os.path.abspath(pi.__file__)))


def _one_block_ahead(i):
    return (i + 1, 0)  # BUG: block 8 of an 8-block input at the last grid point


def _oob_call():
    def copy_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    return pl.pallas_call(
        copy_kernel, grid=(8,), in_specs=[pl.BlockSpec((8, 128), _one_block_ahead)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32), interpret=pi.InterpretParams())


def _deadlock_call():
    def waiting_kernel(x_ref, o_ref, sem):
        pl.semaphore_wait(sem, 1)  # nobody signals it
        o_ref[...] = x_ref[...]

    return pl.pallas_call(waiting_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          scratch_shapes=[pltpu.SemaphoreType.REGULAR],
                          interpret=pi.InterpretParams())


def _racy_call():
    def racy_kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        o_ref[...] = buf[...] * 2.0  # reads the DMA's destination before the wait
        copy.wait()

    return pl.pallas_call(
        racy_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=pi.InterpretParams(detect_races=True))


def _frames_in_palladium(exc):
    return [f for f in traceback.extract_tb(exc.__traceback__)
            if f.filename.startswith(PALLADIUM_SRC)]


@pytest.mark.parametrize("make, operand, error", [
    (_oob_call, X, pi.OutOfBoundsError),
    (_deadlock_call, X[:8], pi.DeadlockError),
    (_racy_call, X[:8], pi.DataRaceError),
])
def test_a_kernel_called_on_its_own_raises_the_palladium_type(make, operand, error):
    call = make()
    for _ in range(2):  # the first call (traced) and a warm one (jax's C++ dispatch)
        try:
            call(operand)
        except error as e:
            text = str(e)
            assert "palladium failure #" not in text and "JaxRuntimeError" not in text
            assert e.__cause__ is None and e.__context__ is None
            assert _frames_in_palladium(e) == []  # the caller's frames only
            assert any(f.name == "execute_devices" for f in e.launch_traceback)
        else:
            pytest.fail(f"no {error.__name__}")


def test_jax_jit_of_the_call_also_raises_the_palladium_type_after_errors_as_raised():
    with pytest.raises(pi.OutOfBoundsError), pi.errors_as_raised():
        jax.jit(_oob_call())(X)


def test_inside_the_callers_jit_the_wrapper_says_why_first_and_how_last():
    call = _oob_call()

    @jax.jit
    def step(x):
        return call(x) + 1

    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        step(X)
    text = str(info.value)
    lines = text.splitlines()
    assert lines[0].startswith(
        "INTERNAL: palladium.interpret.OutOfBoundsError (a kernel's failure inside jax.jit "
        "reaches Python as jax's JaxRuntimeError; see the last line): "), lines[0]
    assert lines[-1].startswith("[palladium failure #") and lines[-1].endswith(
        "palladium.interpret.errors_as_raised() around the jitted call raises the "
        "palladium.interpret.OutOfBoundsError itself]")
    assert "Traceback" not in text and text.count("Out-of-bounds block index (8, 0)") == 1
    assert _frames_in_palladium(info.value) == []
    with pytest.raises(pi.OutOfBoundsError), pi.errors_as_raised():
        step(X)


def _run_script(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu
        from jax.sharding import PartitionSpec as P
        import palladium.interpret as pi
    """) + textwrap.dedent(body)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    path = tmp_path / "broken.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          env=env, timeout=100)


def test_an_uncaught_failure_prints_the_users_frames_and_the_message_once(tmp_path):
    done = _run_script(tmp_path, """
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...]
        call = pl.pallas_call(kernel, grid=(8,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i + 1, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32),
            interpret=pi.InterpretParams())
        call(jnp.ones((64, 128), jnp.float32))
    """)
    lines = done.stderr.splitlines()
    assert done.returncode == 1
    assert lines[0] == "Traceback (most recent call last):", lines
    assert "broken.py" in lines[1] and lines[1].endswith("in <module>")
    assert lines[2] == "    call(jnp.ones((64, 128), jnp.float32))"
    assert lines[3].startswith("palladium.shared_memory.errors.OutOfBoundsError: ")
    # 53 lines before (the message twice among 27 frames of palladium and jax); now the
    # message's own lines and jax's two-line note on its filtering
    assert len(lines) <= 8 and done.stderr.count("Out-of-bounds block index") == 1, lines


def test_a_caught_multi_device_failure_is_not_raised_again_at_exit(tmp_path):
    # Before: jax's two exit barriers raised the failed computation's error again, 44
    # lines of "Exception ignored in atexit callback" (issue 42 item 11).
    done = _run_script(tmp_path, """
        mesh = jax.make_mesh((2,), ("x",))

        def waiting_kernel(x_ref, o_ref, sem):
            pl.semaphore_wait(sem, 1)
            o_ref[...] = x_ref[...]

        def shard(x):
            return pl.pallas_call(waiting_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  scratch_shapes=[pltpu.SemaphoreType.REGULAR],
                                  interpret=pi.InterpretParams())(x)

        f = jax.jit(jax.shard_map(shard, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                  check_vma=False))
        x = jax.device_put(jnp.ones((16, 128), jnp.float32),
                           jax.sharding.NamedSharding(mesh, P("x")))
        try:
            jax.block_until_ready(f(x))
        except jax.errors.JaxRuntimeError as e:
            assert "DeadlockError" in str(e)
        try:
            with pi.errors_as_raised():
                jax.block_until_ready(f(x))
        except pi.DeadlockError:
            print("typed")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "typed\n"
    assert done.stderr == ""


def test_a_script_ending_while_multi_device_launches_run_exits_cleanly(tmp_path):
    # Before: jax's dispatch returns before a launch runs, so a script that ends right
    # after its calls finalised the interpreter while palladium's host callbacks ran:
    # SIGABRT ("terminate called without an active exception") in 5 of 5 runs.
    done = _run_script(tmp_path, """
        mesh = jax.make_mesh((2,), ("x",))

        def plus_one(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        def shard(x):
            return pl.pallas_call(plus_one, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  interpret=pi.InterpretParams())(x)

        f = jax.jit(jax.shard_map(shard, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                  check_vma=False))
        x = jax.device_put(jnp.ones((16, 128), jnp.float32),
                           jax.sharding.NamedSharding(mesh, P("x")))
        first, second = f(x), f(x)  # never waited for
        print("end")
    """)
    assert (done.returncode, done.stdout, done.stderr) == (0, "end\n", "")
