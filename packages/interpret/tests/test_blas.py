"""BLAS runs single-threaded while a kernel is interpreted, and is restored afterwards."""

import threading

import numpy as np

from palladium.interpret.blas import blas_threads, single_threaded_blas


def test_single_threaded_inside_and_restored_after():
    before = blas_threads()
    with single_threaded_blas():
        assert blas_threads() in (0, 1)  # 0: numpy does not use OpenBLAS here
        with single_threaded_blas():  # nested launches (several devices) keep the limit
            assert blas_threads() in (0, 1)
        assert blas_threads() in (0, 1)
    assert blas_threads() == before


def test_limit_held_until_the_last_concurrent_launch_leaves():
    before = blas_threads()
    entered, release = threading.Event(), threading.Event()

    def other_launch():
        with single_threaded_blas():
            entered.set()
            release.wait(30)

    t = threading.Thread(target=other_launch)
    t.start()
    entered.wait(30)
    with single_threaded_blas():
        pass
    assert blas_threads() in (0, 1)  # the other launch is still running
    release.set()
    t.join(30)
    assert blas_threads() == before


def test_products_are_bit_identical_single_threaded():
    rng = np.random.default_rng(0)
    for m, k, n in [(128, 128, 128), (256, 128, 512), (7, 300, 129)]:
        a = rng.standard_normal((3, m, k), dtype=np.float32)
        b = rng.standard_normal((3, k, n), dtype=np.float32)
        expected = np.matmul(a, b)
        with single_threaded_blas():
            got = np.matmul(a, b)
        np.testing.assert_array_equal(got, expected)
