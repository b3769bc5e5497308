"""With libtpu installed, the TPU compiler decides whether a kernel compiles and fits on
the simulated chip, for every kind of kernel palladium runs; its failures are palladium's
typed errors with the compiler's message whole and the kernel line."""

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _launch_harness import core_map_call
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import palladium.interpret as pi
from palladium.interpret import ConfigError, TpuLoweringError, TpuResourceError
from palladium.interpret.fidelity import tpu_compiler

CHECKER = f"libtpu {tpu_compiler.compiler_version()} (jax {jax.__version__})"
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) / 128 - 3


def _call(kernel, shape, dtype, out_shape=None, **params):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(out_shape or shape, dtype),
        interpret=pi.InterpretParams(**params))


def i8_double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2  # i8 vector arithmetic: Mosaic supports i16/i32 only


def test_a_kernel_only_the_compiler_rejects_is_a_lowering_error_at_its_line():
    call = _call(i8_double, (8, 128), jnp.int8, compile_check="compiler")
    with pytest.raises(TpuLoweringError) as info:
        call(jnp.ones((8, 128), jnp.int8))
    msg = str(info.value)
    line = i8_double.__code__.co_firstlineno + 1
    assert msg.startswith(
        "kernel 'i8_double' (pallas_call at test_compiler_verdict.py:")
    assert (f"does not compile for TPU v5e at test_compiler_verdict.py:{line}: the TPU "
            f"compiler ({CHECKER}, topology v5e:2x2) says:") in msg
    # The compiler's message, whole: its words, the MLIR location and operation.
    assert ("Not implemented: Only vector<i16> and vector<i32> are supported, but got 'i8'."
            in msg)
    assert "at location: loc(" in msg and '"arith.muli"' in msg
    assert "check_lowering=False" in msg


def test_the_same_kernel_in_i32_compiles_and_runs():
    def i32_double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    x = jnp.arange(8 * 128, dtype=jnp.int32).reshape(8, 128)
    out = _call(i32_double, (8, 128), jnp.int32, compile_check="compiler")(x)
    np.testing.assert_array_equal(out, np.asarray(x) * 2)


@pytest.mark.parametrize("chip", ["v4", "v5e", "v6e"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
def test_sign_compiles_and_matches_numpy(chip, dtype):
    def sign(x_ref, o_ref):
        o_ref[...] = jnp.sign(x_ref[...])

    x = (X * 4).astype(dtype)
    out = _call(sign, (8, 128), dtype, chip=chip, compile_check="compiler")(x)
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.sign(np.asarray(x, np.float32)))


def _live_scratch_kernel(x_ref, o_ref, s):
    # Run-time rows: the compiler cannot prove the scratch dead and must allocate it.
    i = pl.program_id(0)
    s[pl.ds(i * 8, 8)] = x_ref[...]
    o_ref[...] = s[pl.ds((1 - i) * 8, 8)]


def _scratch_call(rows, kernel=_live_scratch_kernel, **params):
    """``kernel(x_ref, o_ref, s)`` on a 2-step grid with a (rows, 128) f32 VMEM scratch,
    the TPU compiler deciding (``params`` override)."""
    return pl.pallas_call(
        kernel, grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32)],
        interpret=pi.InterpretParams(**{"compile_check": "compiler", **params}))


def test_too_much_vmem_is_a_resource_error_with_the_compilers_numbers():
    with pytest.raises(TpuResourceError) as info:
        _scratch_call(24 * 2048)(X)  # 24 MiB of live scratch, v5e's default limit is 16
    msg = str(info.value)
    assert msg.startswith("kernel '_live_scratch_kernel' (pallas_call at ")
    assert f"does not fit on TPU v5e: the TPU compiler ({CHECKER}, topology v5e:2x2)" in msg
    assert "Ran out of memory in memory space vmem" in msg
    assert "Scoped allocation with size 24.00M and limit 16.00M exceeded scoped vmem limit" in msg
    assert "check_memory=False" in msg


def test_under_the_limit_it_runs_and_the_compilers_vmem_is_reported():
    with pi.timeline() as tl:
        out = _scratch_call(15 * 2048)(X)
    np.testing.assert_array_equal(out, X)
    memory = tl.launches[-1].info.memory
    assert memory.checker == CHECKER
    # the compiler's own figure: the 15 MiB scratch and the blocks, at most a little more
    assert 15 * 2**20 <= memory.compiler_vmem_bytes <= 16 * 2**20
    assert "of scoped VMEM" in memory.summary()
    assert "compiler's VMEM" in tl.launches[-1].summary()


def test_check_memory_false_runs_what_does_not_fit():
    out = _scratch_call(24 * 2048, check_memory=False)(X)
    np.testing.assert_array_equal(out, X)


def test_too_much_smem_is_a_resource_error():
    def smem_kernel(x_ref, o_ref, s):
        i = pl.program_id(0)
        s[i] = i + 5
        o_ref[...] = x_ref[...] + s[1 - i]  # the last step reads s[0] = 5

    def call(words):
        return pl.pallas_call(
            smem_kernel, grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32),
            scratch_shapes=[pltpu.SMEM((words,), jnp.int32)],
            interpret=pi.InterpretParams(compile_check="compiler"))

    x = jnp.ones((8, 128), jnp.int32)
    with pytest.raises(TpuResourceError, match="Ran out of memory in memory space smem"):
        call((2**20 - 256) // 4)(x)  # the compiler keeps some of the 1 MiB for itself
    np.testing.assert_array_equal(call(2**14)(x), np.asarray(x) + 5)


def test_core_map_kernels_are_compiled():
    def i8_core_kernel(x_ref, o_ref):
        def body(buf):
            pltpu.sync_copy(x_ref, buf)
            buf[...] = buf[...] * 2
            pltpu.sync_copy(buf, o_ref)

        pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.int8))

    params = pi.InterpretParams(compile_check="compiler")
    with pytest.raises(TpuLoweringError, match="got 'i8'") as info:
        core_map_call(i8_core_kernel, params, num_cores=1)(jnp.ones((8, 128), jnp.int8))
    assert "kernel 'i8_core_kernel'" in str(info.value)

    def copy_kernel(x_ref, o_ref):
        pltpu.sync_copy(x_ref, o_ref)

    out = core_map_call(copy_kernel, params, num_cores=1)(X)
    np.testing.assert_array_equal(out, X)


def _right_permute(x_ref, o_ref, send, recv):
    me = jax.lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(
        x_ref, o_ref, send, recv, device_id=(jax.lax.rem(me + 1, 4),),
        device_id_type=pl.DeviceIdType.MESH)
    copy.start()
    copy.wait()


def _sharded(kernel, dtype):
    mesh = jax.make_mesh((4,), ("x",))

    def per_device(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
            interpret=pi.InterpretParams(compile_check="compiler"))(x)

    f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    return f, NamedSharding(mesh, P("x"))


def test_a_multi_device_kernel_with_remote_dmas_compiles_over_a_mesh_and_runs():
    f, sharding = _sharded(_right_permute, jnp.float32)
    x = jax.device_put(jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128), sharding)
    out = np.asarray(f(x))
    np.testing.assert_array_equal(out, np.roll(np.asarray(x), 8, axis=0))


def test_a_multi_device_kernel_the_compiler_rejects_is_an_error():
    def permute_then_double(x_ref, o_ref, send, recv):
        _right_permute(x_ref, o_ref, send, recv)

        def body(buf):
            pltpu.sync_copy(o_ref, buf)
            buf[...] = buf[...] * 2
            pltpu.sync_copy(buf, o_ref)

        pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.int8))

    f, sharding = _sharded(permute_then_double, jnp.int8)
    x = jax.device_put(jnp.ones((32, 128), jnp.int8), sharding)
    with pytest.raises(TpuLoweringError, match="got 'i8'") as info:
        f(x)
    assert "topology v5e:2x2" in str(info.value)


def test_vmap_and_jit_kernels_are_compiled():
    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def f(x):
        return _call(double, x.shape, x.dtype, compile_check="compiler")(x)

    xs = jnp.ones((3, 8, 128), jnp.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(f))(xs), np.asarray(xs) * 2)
    with pytest.raises(TpuLoweringError, match="got 'i8'"):
        jax.jit(jax.vmap(f))(xs.astype(jnp.int8))


def test_grad_through_a_custom_vjp_kernel_is_compiled():
    def square(x_ref, o_ref):
        o_ref[...] = x_ref[...] * x_ref[...]

    def times2(x_ref, g_ref, o_ref):
        o_ref[...] = 2 * x_ref[...] * g_ref[...]

    params = pi.InterpretParams(compile_check="compiler")
    spec = jax.ShapeDtypeStruct(X.shape, X.dtype)

    @jax.custom_vjp
    def f(x):
        return pl.pallas_call(square, out_shape=spec, interpret=params)(x)

    f.defvjp(lambda x: (f(x), x),
             lambda x, g: (pl.pallas_call(times2, out_shape=spec, interpret=params)(x, g),))
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: f(x).sum()))(X), 2 * np.asarray(X),
                               rtol=1e-6)
    # the backward kernel was compiled (grad needs no forward output: jit drops it)
    assert len(tpu_compiler._MEMORY) == 1


def test_a_palladium_pipeline_kernel_is_compiled():
    from palladium.pipeline import emit_pipeline

    def outer(x_hbm, o_hbm):
        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1.0

        emit_pipeline(inner, grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                      out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(x_hbm, o_hbm)

    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    call = pl.pallas_call(
        outer, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        interpret=pi.InterpretParams(compile_check="compiler"))
    with pi.timeline() as tl:
        out = call(x)
    np.testing.assert_array_equal(out, np.asarray(x) + 1)
    assert tl.launches[-1].info.memory.checker == CHECKER


def test_approximate_leaves_the_compiler_out():
    # compile_check="approximate" decides without the compiler, even where it is installed.
    with pi.timeline() as tl:
        out = _scratch_call(64, compile_check="approximate")(X)
    np.testing.assert_array_equal(out, X)
    memory = tl.launches[-1].info.memory
    assert memory.checker == "approximation" and memory.compiler_vmem_bytes is None


def test_a_chip_libtpu_cannot_compile_for_is_a_config_error_when_the_compiler_is_required():
    call = _call(i8_double, (8, 128), jnp.int8, chip="v4i", compile_check="compiler")
    with pytest.raises(ConfigError) as info:
        call(jnp.ones((8, 128), jnp.int8))
    assert str(info.value) == (
        f"InterpretParams(compile_check='compiler'): libtpu {tpu_compiler.compiler_version()} "
        "cannot compile for TPU v4i; it compiles for ('v2', 'v3', 'v4', 'v5e', 'v5p', 'v6e', "
        "'v7x'). Use compile_check='auto' (palladium's approximate checks for this chip).")


def test_auto_uses_the_approximation_for_a_chip_libtpu_cannot_compile_for():
    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    with pi.timeline() as tl:
        out = _call(double, (8, 128), jnp.float32, chip="v4i")(X)
    np.testing.assert_array_equal(out, np.asarray(X) * 2)
    assert tl.launches[-1].info.memory.checker == "approximation"


def test_tpu8i_runs_with_the_approximation_and_its_messages_say_so():
    # The installed libtpu cannot compile for TPU8i: palladium simulates it (192 MiB of
    # VMEM per core, jax's tpu_info) and its verdicts say they are the approximation's.
    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    with pytest.raises(ConfigError, match="cannot compile for TPU v8i"):
        _call(double, (8, 128), jnp.float32, chip="v8i", compile_check="compiler")(X)
    with pi.timeline() as tl:
        out = _call(double, (8, 128), jnp.float32, chip="v8i")(X)
    np.testing.assert_array_equal(out, np.asarray(X) * 2)
    assert tl.launches[-1].info.memory.checker == "approximation"

    def big(x_ref, o_ref, s):
        s[...] = jnp.zeros_like(s)
        o_ref[...] = x_ref[...] + s[:8]

    rows = 200 * 2**20 // (128 * 4)  # 200 MiB: more than TPU8i's 192 MiB per core
    call = pl.pallas_call(big, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                          scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32)],
                          interpret=pi.InterpretParams(chip="v8i"))
    with pytest.raises(TpuResourceError) as info:
        call(X)
    msg = str(info.value)
    assert "of VMEM per core on TPU v8i" in msg and "192.00 MiB" in msg
    assert msg.endswith(
        f"(Checked by palladium's approximation: the installed libtpu "
        f"{tpu_compiler.compiler_version()} cannot compile for TPU v8i, so this verdict "
        "approximates the TPU compiler's.)")


_CHILD = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.experimental import pallas as pl
    import palladium.interpret as pi
    from palladium.interpret.fidelity import tpu_compiler

    def i8_double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    seen = []
    real = tpu_compiler._compile_verdict
    def spy(*args, **kwargs):
        verdict = real(*args, **kwargs)
        seen.append(verdict.source)
        return verdict
    tpu_compiler._compile_verdict = spy
    call = pl.pallas_call(i8_double, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int8),
                          interpret=pi.InterpretParams(compile_check="compiler"))
    try:
        call(jnp.ones((8, 128), jnp.int8))
    except pi.TpuLoweringError as e:
        assert "got 'i8'" in str(e), e
    else:
        raise AssertionError("not rejected")
    print("SOURCES", seen)
""")


def test_verdicts_are_cached_on_disk_across_processes(fresh_verdict_cache):
    env = dict(os.environ, PALLADIUM_CACHE_DIR=str(fresh_verdict_cache),
               JAX_PLATFORMS="cpu")

    def child():
        done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                              text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        return re.search(r"SOURCES \[(.*)\]", done.stdout).group(1)

    assert child() == "'compiled'"
    assert len(list((fresh_verdict_cache / "tpu-compiler").glob("*.entry"))) == 1
    assert child() == "'disk'"  # the second process reads the first one's verdict


def test_the_cache_key_changes_with_the_compiler_and_jax_versions(monkeypatch):
    key = tpu_compiler.module_key(b"module", "v5e", "v5e:2x2", 2)
    assert key == tpu_compiler.module_key(b"module", "v5e", "v5e:2x2", 2)
    assert key != tpu_compiler.module_key(b"module 2", "v5e", "v5e:2x2", 2)
    assert key != tpu_compiler.module_key(b"module", "v6e", "v6e:2x2", 2)
    assert key != tpu_compiler.module_key(b"module", "v5e", "v5e:2x2", 1)  # another format
    monkeypatch.setattr(jax, "__version__", "0.10.1")
    assert key != tpu_compiler.module_key(b"module", "v5e", "v5e:2x2", 2)
    monkeypatch.undo()
    from palladium.interpret.state import environment

    installed = environment.version
    monkeypatch.setattr(environment, "version",
                        lambda d: "0.0.43" if d == "libtpu" else installed(d))
    assert key != tpu_compiler.module_key(b"module", "v5e", "v5e:2x2", 2)


def test_an_in_memory_verdict_is_reused():
    call = _call(i8_double, (8, 128), jnp.int8, compile_check="compiler")
    for _ in range(2):
        with pytest.raises(TpuLoweringError):
            jax.jit(lambda x: call(x) + 0)(jnp.ones((8, 128), jnp.int8))
    assert len(tpu_compiler._MEMORY) == 1


def test_a_block_the_compiler_would_abort_on_is_not_compiled_and_the_simulation_reports_it():
    # libtpu aborts the process (a failed check in its pipeline emitter) on a first block
    # that starts past its array; palladium does not hand it such a kernel.
    from _launch_harness import out_of_bounds_block_call

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    f = out_of_bounds_block_call(copy, pi.InterpretParams(compile_check="compiler"))
    with pytest.warns(pi.TpuLoweringWarning) as warned, \
            pytest.raises(pi.OutOfBoundsError) as info, pi.errors_as_raised():
        f(X)
    assert ("not compiled for TPU v5e: block (5, 0) of 'x_ref' starts at 40 on axis 0 of its "
            "(8, 128) array at grid point (0,); the TPU compiler aborts the process on such "
            "a kernel") in str(warned[0].message)
    assert "block (5, 0)" in str(info.value) and "x_ref" in str(info.value)


@pytest.mark.parametrize("chip", tpu_compiler.compilable_chips())
def test_the_chip_facts_vmem_limits_are_the_compilers(chip):
    # palladium's chip table (jax's tpu_info, and XLA's default scoped limit kept by hand)
    # against what the compiler enforces: the default scoped limit and the capacity.
    from palladium.interpret.chip import chip_facts

    facts = chip_facts(chip)

    def verdict(nbytes):
        call = _scratch_call(nbytes // 512, chip=chip)
        try:
            call(X)
        except TpuResourceError as e:
            return str(e)
        return None

    limit = facts.default_scoped_vmem_limit_bytes
    if limit < facts.vmem_capacity_bytes:
        said = verdict(limit + 2**20)
        assert f"limit {limit / 2**20:.2f}M exceeded scoped vmem limit" in said
        assert verdict(limit - 2**20) is None
    said = verdict(facts.vmem_capacity_bytes + 2**20)
    assert f"would exceed memory (size={facts.vmem_capacity_bytes})" in said


def test_check_lowering_false_runs_a_debug_print_and_still_counts_memory():
    # Mosaic rejects a float debug_print; check_lowering=False runs it, and whether the
    # kernel fits is then the approximation's to say (the compiler stopped before).
    def printing(x_ref, o_ref, s):
        pl.debug_print("x = {}", x_ref[0, 0])
        i = pl.program_id(0)
        s[pl.ds(i * 8, 8)] = x_ref[...]
        o_ref[...] = s[pl.ds((1 - i) * 8, 8)]

    def call(rows):
        return _scratch_call(rows, printing, check_lowering=False)

    with pytest.raises(TpuLoweringError):
        _scratch_call(64, printing)(X)
    np.testing.assert_array_equal(call(64)(X), X)
    with pytest.raises(TpuResourceError, match="needs 24.01 MiB"):
        call(24 * 2048)(X)


def test_scalar_prefetch_aliases_and_every_memory_space_are_compiled():
    def kernel(idx_ref, x_ref, s_ref, h_ref, o_ref, sem):
        del h_ref
        o_ref[...] = x_ref[...] + s_ref[0, 0].astype(jnp.float32) + idx_ref[0]

    def call(dtype):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(2,),
                in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0)),
                          pl.BlockSpec(memory_space=pltpu.SMEM),
                          pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0)),
                scratch_shapes=[pltpu.SemaphoreType.DMA]),
            out_shape=jax.ShapeDtypeStruct((16, 128), dtype),
            input_output_aliases={1: 0},
            interpret=pi.InterpretParams(compile_check="compiler"))

    idx = jnp.array([0, 1], jnp.int32)  # each step reads the block it writes (aliased)
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    s = jnp.full((1, 1), 3, jnp.int32)
    out = call(jnp.float32)(idx, x, s, x)
    expected = np.asarray(x) + 3 + 0  # idx[0]
    np.testing.assert_array_equal(out, expected)
    assert len(tpu_compiler._MEMORY) == 1  # compiled (and accepted)


def test_jaxs_ragged_paged_attention_compiles_and_matches_its_reference():
    from test_jax_kernels import ragged_paged_attention_case

    with pi.force_tpu_interpret_mode(pi.InterpretParams(compile_check="compiler")), \
            pi.timeline() as tl:
        out, ref = ragged_paged_attention_case()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert tl.launches[-1].info.memory.checker == CHECKER


def test_a_compiler_crash_is_a_verdict_not_the_end_of_this_process():
    # libtpu aborts on a first block past its array; it compiles in a process of its own,
    # so the crash is reported (and cached) and this process goes on.
    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    call = pl.pallas_call(copy, grid=(1,), in_specs=[pl.BlockSpec((8, 128), lambda i: (5, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                          out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    verdict = tpu_compiler.compile_verdict(call, [spec], chip="v5e", mesh_axes={})
    assert verdict.kind == "crashed"
    assert verdict.message.startswith("the TPU compiler's process died (signal SIGABRT)")
    assert "Check failed" in verdict.message
    again = tpu_compiler.compile_verdict(call, [spec], chip="v5e", mesh_axes={})
    assert again.kind == "crashed" and again.source == "memory"
    # the compiler's process is started again for the next kernel
    fine = pl.pallas_call(copy, out_shape=spec)
    assert tpu_compiler.compile_verdict(fine, [spec], chip="v5e", mesh_axes={}).accepted
