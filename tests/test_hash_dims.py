"""content_hash (blake3 u64) and scaled_dims (Inkling long-edge rescale)."""

import os

import numpy as np
import pytest
from blake3 import blake3

from mmworker import MmError
from mmworker.common import content_hash, scaled_dims


def test_content_hash_known_vectors():
    # blake3("") and blake3("abc") from the BLAKE3 reference vectors, first 8 bytes big-endian.
    assert content_hash(b"") == 0xAF1349B9F5F9A1A6
    assert content_hash(b"abc") == 0x6437B3AC38465133


def test_content_hash_takes_any_buffer():
    data = os.urandom(100_000)
    expected = int.from_bytes(blake3(data).digest()[:8], "big")
    for view in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert content_hash(view) == expected


def test_content_hash_starts_no_threads():
    before = set(os.listdir("/proc/self/task"))
    content_hash(bytes(64 << 20))
    assert set(os.listdir("/proc/self/task")) == before


def test_content_hash_parity_with_rust_extension(rust_ext):
    for n in (0, 1, 1023, 1024, 1025, 70_000):
        data = os.urandom(n)
        assert content_hash(data) == rust_ext.common.content_hash(data)


# docs/behaviour.md §12 TV-S1, verbatim.
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((80, 60, None), (80, 60)),
        ((80, 60, 0.5), (40, 30)),
        ((3, 1, 0.1), (1, 1)),
        ((0, 0, 0.5), (0, 0)),
        ((80, 60, 2.0), (160, 120)),
        ((80, 60, 2.0, 120), (120, 90)),
        ((80, 60, 0.9, 40), (72, 54)),
    ],
)
def test_scaled_dims_vectors(args, expected):
    assert scaled_dims(*args) == expected


def test_scaled_dims_rounds_half_up_not_to_even():
    # 5 * 0.5 = 2.5 -> 3 (Python's round would give 2).
    assert scaled_dims(5, 4, 0.5) == (3, 2)


@pytest.mark.parametrize(
    ("frac", "cap"), [(0.0, None), (-1.0, None), (float("nan"), None), (float("inf"), None), (2.0, 0)]
)
def test_scaled_dims_refuses_nonsense(frac, cap):
    with pytest.raises(MmError, match="scaled_dims"):
        scaled_dims(80, 60, frac, cap)


def test_scaled_dims_parity_with_rust_extension(rust_ext):
    rng = np.random.default_rng(0)
    sizes = [(int(w), int(h)) for w, h in rng.integers(1, 4000, (500, 2))] + [
        (1, 1),
        (2, 1),
        (1, 2),
        (7, 3),
        (0, 5),
    ]
    for frac, cap in ((2.0, 2048), (1.5, 2048), (3.0, None), (None, None), (2.0, 1)):
        for w, h in sizes:
            assert scaled_dims(w, h, frac, cap) == tuple(rust_ext.common.scaled_dims(w, h, frac, cap)), (w, h)
