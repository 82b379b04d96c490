"""Streaming writes: every element lands where an ordinary copy would put it, at any alignment."""

import numpy as np
import pytest
from aligned import float_view_at
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit, uint64

from mmworker.common.stream import LINE_FLOATS, runs_to_lines, stream_fence, stream_out


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
    assert runs_to_lines(14)[1] == 112 and runs_to_lines(16)[1] == 16 and runs_to_lines(12)[1] == 48


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
