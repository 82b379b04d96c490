"""Streaming writes: every element lands where an ordinary copy would put it, at any alignment."""

import numpy as np
import pytest
from aligned import float_view_at
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit, uint64

from mmworker.common.stream import LINE_FLOATS, runs_to_lines, stream_fence, stream_out
from mmworker.inkling.patches import bf16_bits


def _bf16_view_at(shift: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(backing bytes, uint16[n] view) starting `shift` halfwords past a 64-byte boundary."""
    raw = np.full((n + 64) * 2 + 64, 0xAB, np.uint8)
    start = (-raw.ctypes.data) % 64 + 2 * shift
    return raw, raw[start : start + 2 * n].view(np.uint16)


def _awkward_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """Floats whose rounding to bf16 is hard: exact ties both ways, values just off a tie, signs, zeros, tiny ones."""
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    bits &= np.uint32(0x7F7FFFFF)  # finite: exponent never all ones
    low = rng.choice(np.array([0x8000, 0x7FFF, 0x8001, 0x0000, 0xFFFF], np.uint32), n)
    bits = (bits & np.uint32(0xFFFF0000)) | np.where(rng.random(n) < 0.6, low, bits & np.uint32(0xFFFF))
    bits |= np.where(rng.random(n) < 0.5, np.uint32(0x80000000), np.uint32(0))
    return bits.view(np.float32)


@settings(max_examples=200, deadline=None)
@given(shift=st.integers(0, 15), at=st.integers(0, 70), n=st.integers(0, 200))
def test_stream_out_writes_exactly_the_run(shift, at, n):
    raw, flat = float_view_at(shift, at + n + 20)
    before = raw.copy()
    stage = np.arange(1, n + 1, dtype=np.float32)
    stream_out(flat, at, stage, n, flat.ctypes.data)
    expected = before.copy()
    start = flat.ctypes.data - raw.ctypes.data
    expected[start + 4 * at : start + 4 * (at + n)] = stage.view(np.uint8)
    np.testing.assert_array_equal(raw, expected)  # the run, and not one byte outside it


def test_stream_out_on_an_address_that_is_not_float_aligned():
    raw = np.zeros(4 * 100 + 8, np.uint8)
    flat = raw[1 : 1 + 400].view(np.float32)  # numpy allows an unaligned view; nothing may be lost
    stage = np.arange(100, dtype=np.float32)
    stream_out(flat, 0, stage, 100, flat.ctypes.data)
    np.testing.assert_array_equal(flat, stage)


@settings(max_examples=200, deadline=None)
@given(shift=st.integers(0, 31), at=st.integers(0, 70), n=st.integers(0, 200), seed=st.integers(0, 2**16))
def test_stream_out_narrows_to_bf16_exactly_the_run(shift, at, n, seed):
    raw, flat = _bf16_view_at(shift, at + n + 40)
    before = raw.copy()
    stage = _awkward_floats(np.random.default_rng(seed), n)
    stream_out(flat, at, stage, n, flat.ctypes.data)
    expected = before.copy()
    start = flat.ctypes.data - raw.ctypes.data
    expected[start + 2 * at : start + 2 * (at + n)] = bf16_bits(stage).view(np.uint8)
    np.testing.assert_array_equal(raw, expected)  # rounded as torch rounds, and not one byte outside the run


def test_bf16_rounding_ties_to_even():
    # 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7: even (1) wins; 1 + 3 * 2^-8: 1 + 2^-6 wins.
    stage = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20, 0.0, -0.0] * 8, np.float32)
    _, flat = _bf16_view_at(0, stage.size)
    stream_out(flat, 0, stage, stage.size, flat.ctypes.data)
    assert flat.tolist() == [0x3F80, 0x3F82, 0xBF80, 0x3F81, 0x0000, 0x8000] * 8  # in lines and single stores


# Every run length runs_to_lines accepts, each with its own kernel (numba compiles one per intrinsic).
_RUN_LENGTHS = (8, 12, 14, 15, 16)


def _runs_writer(n: int):
    lines, group = runs_to_lines(n)

    @njit
    def write(dst, at, src, src_at, runs, groups):
        lines(dst, uint64(at), src, uint64(src_at), runs, uint64(groups))
        stream_fence()

    return write, group


def test_runs_to_lines_only_for_runs_a_line_and_its_successor_hold():
    assert tuple(n for n in range(-1, 40) if runs_to_lines(n) is not None) == _RUN_LENGTHS
    assert runs_to_lines(14)[1] == 224 and runs_to_lines(16)[1] == 32 and runs_to_lines(12)[1] == 96


@pytest.mark.parametrize("n", _RUN_LENGTHS)
def test_runs_to_lines_writes_the_runs_in_order_and_nothing_else(n):
    write, group = _runs_writer(n)
    rng = np.random.default_rng(n)
    src = rng.random(4000, dtype=np.float32)
    groups, src_at = 3, 7
    runs = rng.integers(0, src.size - src_at - LINE_FLOATS, groups * group // n)  # anywhere, any order
    raw, flat = float_view_at(0, (groups + 2) * group)
    before = raw.copy()
    at = group  # a whole group in: still line-aligned, with untouched floats before and after
    write(flat, at, src, src_at, runs, groups)
    expected = before.copy().view(np.float32)
    start = (flat.ctypes.data - raw.ctypes.data) // 4
    expected[start + at : start + at + groups * group] = np.concatenate(
        [src[src_at + r : src_at + r + n] for r in runs]
    )
    np.testing.assert_array_equal(raw.view(np.float32).view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("n", _RUN_LENGTHS)
def test_runs_to_lines_narrows_the_runs_to_bf16_in_order(n):
    write, group = _runs_writer(n)
    rng = np.random.default_rng(100 + n)
    src = _awkward_floats(rng, 4000)
    groups, src_at = 3, 5
    runs = rng.integers(0, src.size - src_at - LINE_FLOATS, groups * group // n)
    raw, flat = _bf16_view_at(0, (groups + 2) * group)
    before = raw.copy()
    at = group  # whole lines in
    write(flat, at, src, src_at, runs, groups)
    expected = before.copy().view(np.uint16)
    start = (flat.ctypes.data - raw.ctypes.data) // 2
    expected[start + at : start + at + groups * group] = bf16_bits(
        np.concatenate([src[src_at + r : src_at + r + n] for r in runs])
    )
    np.testing.assert_array_equal(raw.view(np.uint16), expected)


def test_other_destination_dtypes_are_refused():
    with pytest.raises(Exception, match="float32 or uint16"):
        stream_out(np.zeros(64, np.float64), 0, np.zeros(64, np.float32), 64, 0)
