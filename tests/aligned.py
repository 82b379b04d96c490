"""Test buffers placed at a chosen distance from a cache-line boundary."""

import numpy as np


def float_view_at(shift_floats: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(backing bytes, float32[n] view) starting `shift_floats` floats past a 64-byte boundary."""
    raw = np.full((n + 32) * 4 + 64, 0xAB, np.uint8)
    start = (-raw.ctypes.data) % 64 + 4 * shift_floats
    return raw, raw[start : start + 4 * n].view(np.float32)
