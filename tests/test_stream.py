"""Streaming writes: every element lands where an ordinary copy would put it, at any alignment."""

import numpy as np
from aligned import float_view_at
from hypothesis import given, settings
from hypothesis import strategies as st

from mmworker.common.stream import stream_out


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
