"""Inkling's patch layout: bf16 bits of normalised pixels, patch by patch, padded to whole patches.

docs/behaviour.md §8. Per channel, a 256-entry table maps each byte to bf16 bits of
`(f32(v) * INV255 - MEAN_c) / STD_c` (float32 arithmetic, round-to-nearest-even to bf16). The grid
is ceil(h / ps) rows by floor(w / ps) + 1 columns (always one extra column, pure padding when
w % ps == 0, as the Python reference does); patches are row-major, pixels inside a patch HWC, and
positions outside the image get the per-channel pad value bf16((PAD_RAW - MEAN_c) / STD_c).
"""

import functools

import numpy as np
from numba import njit

from mmworker.errors import MmError

# f32 casts of the Python reference's f64 literals; STD[1:] have fewer digits than CLIP's on purpose.
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
STD = np.array([0.26862954, 0.2613026, 0.2757771], np.float32)
INV255 = np.float32(1.0 / 255.0)
PAD_RAW = np.float32(-1.0 / 255.0)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns of finite float32 values, rounded to nearest, ties to even (as torch)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


@functools.cache  # a function of module constants only: built once, not per image
def _tables() -> tuple[np.ndarray, np.ndarray]:
    raw = np.arange(256, dtype=np.float32) * INV255
    lut = bf16_bits((raw[None, :] - MEAN[:, None]) / STD[:, None])
    pad = bf16_bits((PAD_RAW - MEAN) / STD)
    return lut, pad


def grid(height: int, width: int, patch_size: int) -> tuple[int, int]:
    """(rows, columns) of patches: ceil(h / ps) by floor(w / ps) + 1."""
    return -(-height // patch_size), width // patch_size + 1


@njit(cache=True)
def _patchify_into(pixels: np.ndarray, lut: np.ndarray, pad: np.ndarray, ps: int, out: np.ndarray) -> None:
    h, w, channels = pixels.shape
    src = pixels.reshape(-1)
    rows = (h + ps - 1) // ps
    cols = w // ps + 1
    o = 0
    for i in range(rows):
        for j in range(cols):
            for y in range(ps):
                yy = i * ps + y
                for x in range(ps):
                    xx = j * ps + x
                    if yy < h and xx < w:
                        s = (yy * w + xx) * channels
                        out[o] = lut[0, src[s]]
                        out[o + 1] = lut[1, src[s + 1]]
                        out[o + 2] = lut[2, src[s + 2]]
                    else:
                        out[o] = pad[0]
                        out[o + 1] = pad[1]
                        out[o + 2] = pad[2]
                    o += 3


def check_patch_size(patch_size: int) -> None:
    if patch_size <= 0:
        raise MmError("patch_size must be greater than zero")


def patchify_into(pixels: np.ndarray, patch_size: int, out: np.ndarray) -> None:
    """Write the patches of uint8 [h, w, 3] pixels into `out` (uint16, grid(h, w) patches' worth)."""
    lut, pad = _tables()
    _patchify_into(np.ascontiguousarray(pixels), lut, pad, patch_size, out.reshape(-1))
