"""A deliberately plain transcription of docs/behaviour.md §5 (resize), used as a test oracle.

Dense integer matrices instead of loops, Python floats for the weights: structurally unlike the
numba kernels, exact by the same arithmetic. It is itself anchored to stock Pillow 12 and
torchvision through the golden fixtures (tests/test_resize.py). Which pass runs first is the
caller's (`vertical_first`); `pillow_vertical_first` is each stock Pillow's rule, transcribed apart
from mmworker.common.pillow from the sources: Image.resize (12.2.0, 12.3.0) and
ImagingResampleInner (13.0.0).
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


def pillow_vertical_first(version: str, in_w: int, in_h: int, out_w: int, out_h: int) -> bool:
    """Whether stock Pillow `version` ("12.1.1", "12.3.0", "13.0.0", ...) resizes vertically first."""
    major, minor = (int(part) for part in version.split(".")[:2])
    if major >= 13:
        # Resample.c: horizontal_first = !((imIn->ysize - ysize) > 0 && (imIn->ysize - ysize) > (imIn->xsize - xsize) * 2)
        return (in_h - out_h) > 0 and (in_h - out_h) > (in_w - out_w) * 2
    if (major, minor) >= (12, 2):
        # Image.py: if self.size[1] > self.size[0] * 100 and size[1] < self.size[1]
        return in_h > in_w * 100 and out_h < in_h
    return False


def resize(src: np.ndarray, out_w: int, out_h: int, resample: str, vertical_first: bool = False) -> np.ndarray:
    """uint8 (h, w, 3) -> (out_h, out_w, 3) for 'pil_lanczos', 'pil_bicubic' or 'aten_u8', the
    horizontal pass first unless `vertical_first`."""
    name = "lanczos" if resample == "pil_lanczos" else "bicubic"
    h, w = src.shape[:2]
    passes = [(w, out_w, 1), (h, out_h, 0)]
    out = src
    for in_size, out_size, axis in reversed(passes) if vertical_first else passes:
        if out_size != in_size:
            m = weights(in_size, out_size, name)
            out = _pass(out, m, aten_precision(m) if resample == "aten_u8" else 22, axis=axis)
    return out.copy()
