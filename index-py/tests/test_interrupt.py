"""Ctrl-C interrupts a long build: KeyboardInterrupt arrives quickly and the module keeps
working."""

import _thread
import signal
import threading
import time

import numpy as np
import pytest

import qkindex


@pytest.fixture(autouse=True)
def python_handles_sigint():
    """Background jobs of a non-interactive shell (CI runners, `cmd &`) start with SIGINT
    ignored, and then `_thread.interrupt_main` does nothing: give SIGINT Python's own handler
    for these tests, as an interactive session has."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_interrupts_a_long_build():
    rng = np.random.default_rng(0)
    # Big enough that the exact kNN alone takes many seconds on two cores.
    keys = rng.standard_normal((60000, 64)).astype(np.float32)
    train = rng.standard_normal((60000, 64)).astype(np.float32)
    fired = []

    def interrupt():
        fired.append(time.perf_counter())
        _thread.interrupt_main()

    timer = threading.Timer(0.3, interrupt)
    start = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            qkindex.AttentionIndex.build(keys, train, kq=100)
        done = time.perf_counter()
    finally:
        timer.cancel()
    assert fired, "the timer did not fire: the build finished first"
    # Cancellation is checked between kNN tiles (128 queries × 4096 keys each).
    assert done - fired[0] < 3.0, f"KeyboardInterrupt took {done - fired[0]:.2f}s"
    assert done - start < 4.0
    # The module still works after an interrupted build.
    small = qkindex.AttentionIndex.build(keys[:500], train[:200], kq=20)
    assert small.search(train[0], k=5).ids.shape == (5,)


def test_ctrl_c_interrupts_exact_topk():
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((60000, 64)).astype(np.float32)
    queries = rng.standard_normal((60000, 64)).astype(np.float32)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            qkindex.exact_topk(queries, keys, 100)
    finally:
        timer.cancel()
    assert time.perf_counter() - start < 4.0
