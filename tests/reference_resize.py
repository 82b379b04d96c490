"""A deliberately plain transcription of behaviour.md §5 (resize), used as a test oracle.

Dense integer matrices instead of loops, Python floats for the weights: structurally unlike the
numba kernels, exact by the same arithmetic. It is itself anchored to stock Pillow 12 and
torchvision through the golden fixtures (tests/test_resize.py).
"""

import math

import numpy as np

SUPPORT = {"bicubic": 2.0, "lanczos": 3.0}


def _kernel(x: float, name: str) -> float:
    if name == "bicubic":
        a = -0.5
        x = abs(x)
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * a
        return 0.0

    def sinc(v: float) -> float:
        return 1.0 if v == 0.0 else math.sin(v * math.pi) / (v * math.pi)

    return sinc(x) * sinc(x / 3) if -3.0 <= x < 3.0 else 0.0


def weights(in_size: int, out_size: int, name: str) -> np.ndarray:
    """Normalised float64 weights as a dense (out_size, in_size) matrix."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = SUPPORT[name] * filterscale
    matrix = np.zeros((out_size, in_size))
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size)
        ws = [_kernel((x + xmin - center + 0.5) / filterscale, name) for x in range(xmax - xmin)]
        total = sum(ws)  # left-to-right, like the C loop
        matrix[xx, xmin:xmax] = [w / total if total != 0.0 else w for w in ws]
    return matrix


def aten_precision(matrix: np.ndarray) -> int:
    """ATen's _compute_weights_precision: largest p <= 22 with 0.5 + max|w| * 2^p < 32768."""
    wmax = float(np.abs(matrix).max())
    p = 0
    while p < 22 and int(0.5 + wmax * (1 << (p + 1))) < (1 << 15):
        p += 1
    return p


def quantise(matrix: np.ndarray, precision: int) -> np.ndarray:
    scaled = matrix * (1 << precision)
    return np.where(matrix < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled)).astype(np.int64)


def _pass(src: np.ndarray, matrix: np.ndarray, precision: int, axis: int) -> np.ndarray:
    k = quantise(matrix, precision)
    moved = np.moveaxis(src.astype(np.int64), axis, 0)
    acc = (1 << (precision - 1)) + np.tensordot(k, moved, axes=(1, 0))
    out = np.where(acc >= 1 << (precision + 8), 255, np.where(acc <= 0, 0, acc >> precision))
    return np.moveaxis(out.astype(np.uint8), 0, axis)


def resize(src: np.ndarray, out_w: int, out_h: int, resample: str) -> np.ndarray:
    """uint8 (h, w, 3) -> (out_h, out_w, 3) for 'pil_lanczos', 'pil_bicubic' or 'aten_u8'."""
    name = "lanczos" if resample == "pil_lanczos" else "bicubic"
    h, w = src.shape[:2]
    out = src
    if out_w != w:
        m = weights(w, out_w, name)
        out = _pass(out, m, aten_precision(m) if resample == "aten_u8" else 22, axis=1)
    if out_h != h:
        m = weights(h, out_h, name)
        out = _pass(out, m, aten_precision(m) if resample == "aten_u8" else 22, axis=0)
    return out.copy()
