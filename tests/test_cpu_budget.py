"""The worker's CPU budget (mmworker.pool.cpu_budget), in this process: where its signal may strike and where not."""

import re
import signal
import sys
import time

import numba
import numpy as np
import pytest
from jpegcases import encoded
from PIL.JpegImagePlugin import JpegImageFile

from mmworker.common.jpeg_planes import turbojpeg
from mmworker.corpus import encode, photo_like
from mmworker.driver import MmInput, process
from mmworker.errors import BudgetExceeded
from mmworker.pool.cpu_budget import MESSAGE, CpuBudget
from mmworker.registry import named_spec, pipeline_from_spec


@pytest.fixture
def budget():
    budget = CpuBudget()
    try:
        yield budget
    finally:
        budget.close()


def burn(seconds: float) -> int:
    """Python-level busy work for `seconds` of wall time, inside an except clause that takes a ValueError
    for its own failure (as Pillow's and our decoders do): an MmError striking there would be lost."""
    spins, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            while time.monotonic() < until:
                spins += 1
        except ValueError:
            pass
    return spins


def blocked() -> bool:
    return signal.SIGVTALRM in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_the_budget_interrupts_python_work_through_except_clauses(budget):
    started = time.process_time()
    with pytest.raises(BudgetExceeded, match=f"^{re.escape(MESSAGE)}$"):
        budget.run(0.05, lambda: burn(10.0))
    # At about the budget, not at once: the kernel fires ITIMER_VIRTUAL on its own (scaled, sampled)
    # user time, which can run a few ms ahead of the precise clock process_time reads (0.0496 s seen).
    assert 0.04 <= time.process_time() - started < 5.0
    assert blocked() and signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0)


def test_within_the_budget_the_result_comes_back_and_the_timer_is_off(budget):
    assert budget.run(30.0, lambda: burn(0.01)) > 0
    assert blocked() and signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0)


def test_an_expiry_inside_held_strikes_when_the_block_ends(budget):
    steps = []

    def compute():
        with budget.held():
            signal.raise_signal(signal.SIGVTALRM)  # as if the timer expired right here
            steps.append("bookkeeping finished")
        steps.append("after the block")

    with pytest.raises(BudgetExceeded):
        budget.run(30.0, compute)
    assert steps == ["bookkeeping finished"]


def test_an_expiry_while_raising_inside_held_replaces_nothing_it_should_not(budget):
    # An error inside the block still leaves it whole, and the budget then wins.
    def compute():
        with budget.held():
            signal.raise_signal(signal.SIGVTALRM)
            raise RuntimeError("ring full")

    with pytest.raises(BudgetExceeded) as info:
        budget.run(30.0, compute)
    assert isinstance(info.value.__context__, RuntimeError)
    assert blocked()


def test_a_signal_between_jobs_neither_strikes_nor_reaches_the_next_job(budget):
    signal.raise_signal(signal.SIGVTALRM)  # blocked here: waits, and must not count
    assert signal.SIGVTALRM in signal.sigpending()
    assert budget.run(30.0, lambda: burn(0.01)) > 0
    assert signal.SIGVTALRM not in signal.sigpending()


def test_close_gives_the_signal_back():
    before_handler = signal.getsignal(signal.SIGVTALRM)
    before_blocked = blocked()
    budget = CpuBudget()
    assert blocked() and signal.getsignal(signal.SIGVTALRM) is not before_handler
    budget.close()
    assert blocked() == before_blocked and signal.getsignal(signal.SIGVTALRM) is before_handler


@pytest.mark.parametrize("case", ["grey, opened to decode", "colour, opened to stream"])
def test_a_budget_striking_in_pillows_open_names_the_image_not_a_decode_error(budget, monkeypatch, case):
    # Pillow's open and our decode step catch ValueError (an MmError is one) as the file's failure:
    # the budget's exception must come through them as itself, with the image named by the driver.
    # Pillow opens a grey JPEG where it is found to be one, a colour one only to stream it (a
    # 640x480 one does at this pixel budget: its decoded rows outweigh half the feature), when
    # TurboJPEG's planes do not take it: 4:4:4 (mmworker.common.jpeg_planes).
    original = JpegImageFile._open

    def striking(self):
        signal.raise_signal(signal.SIGVTALRM)  # as if the timer expired while Pillow parses markers
        original(self)

    monkeypatch.setattr(JpegImageFile, "_open", striking)
    family = pipeline_from_spec({**named_spec("qwen2_vl"), "max_pixels": 100352})
    pixels = photo_like(640, 480, seed=1)
    data = encode(pixels[..., 0], "JPEG") if case.startswith("grey") else encoded(pixels, quality=90, subsampling=0)
    with pytest.raises(BudgetExceeded, match=f"^image 0: {re.escape(MESSAGE)}$"):
        budget.run(30.0, lambda: process(family, MmInput([151655], [data])))


@pytest.mark.skipif(turbojpeg() is None, reason="libturbojpeg.so.0 is not installed (Debian's libturbojpeg0)")
def test_a_budget_striking_in_turbojpegs_planes_decode_names_the_image_and_frees_the_decompressor(budget, monkeypatch):
    lib = turbojpeg()
    decode, destroy = lib.tjDecompressToYUVPlanes, lib.tjDestroy
    destroyed = []

    def striking(*args):
        status = decode(*args)
        signal.raise_signal(signal.SIGVTALRM)  # the timer expired during the call: it strikes on return
        return status

    def counted(handle):
        destroyed.append(handle)
        destroy(handle)

    monkeypatch.setattr(lib, "tjDecompressToYUVPlanes", striking)
    monkeypatch.setattr(lib, "tjDestroy", counted)
    family = pipeline_from_spec({**named_spec("qwen2_vl"), "max_pixels": 100352})
    data = encode(photo_like(640, 480, seed=1), "JPEG")  # 4:2:0, streamed at this budget: planes
    with pytest.raises(BudgetExceeded, match=f"^image 0: {re.escape(MESSAGE)}$"):
        budget.run(30.0, lambda: process(family, MmInput([151655], [data])))
    assert len(destroyed) == 1


@numba.njit(cache=True)
def _spin_then_new_arrays(iterations: int) -> tuple[np.ndarray, np.ndarray]:
    total = 0.0
    for i in range(iterations):
        total += (i % 7) * 0.5
    bounds = np.zeros((2, 2), np.int32)
    weights = np.full((2, 3), total)
    return bounds, weights  # as mmworker.common.resample.axis_weights does


def test_an_expiry_during_a_numba_call_strikes_after_it_not_inside_numbas_callbacks(budget):
    # Returning new arrays from nopython code calls back into Python (numba.core.serialize's
    # _numba_unpickle, for each dtype): the first bytecode after a long kernel is there, and an
    # exception raised in it reached numba's C code, which then swallowed it (the job ran on past
    # its budget) or turned it into a SystemError ("returned a result with an exception set").
    _spin_then_new_arrays(10)  # compiled (or loaded from the cache) before the budget starts
    iterations = 1
    while True:  # enough work to take ~50 ms of CPU: the timer expires inside the kernel
        started = time.process_time()
        _spin_then_new_arrays(iterations)
        if time.process_time() - started > 0.05:
            break
        iterations *= 2
    for _ in range(5):
        with pytest.raises(BudgetExceeded, match=f"^{re.escape(MESSAGE)}$"):
            budget.run(0.002, lambda: [_spin_then_new_arrays(iterations) for _ in range(3)])
        assert blocked() and signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0)
        assert sys.gettrace() is None  # the strike that waited for a line left no tracing behind
    # A job whose last act is the kernel is struck as the kernel's caller returns.
    with pytest.raises(BudgetExceeded, match=f"^{re.escape(MESSAGE)}$"):
        budget.run(0.002, lambda: _spin_then_new_arrays(iterations))
    assert sys.gettrace() is None and burn(0.01) > 0
