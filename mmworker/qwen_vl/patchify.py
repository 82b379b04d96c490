"""Normalise and patchify resized RGB pixels into Qwen's pixel_values, written straight into the output buffer.

pixel_values is float32 [gh * gw, 3 * tps * ps * ps] in Hugging Face's order (behaviour.md §7.3):
patches ordered (gh/m, gw/m, m, m) so each merge block of m x m patches is contiguous, and inside
a patch (channel, temporal copy, row, column). A still image is repeated `tps` times along the
temporal axis. Values come from a per-channel 256-entry float32 table computed with the exact
float32 operations of the processor being reproduced, so normalising costs one lookup per sample
and the result is bit-identical to Hugging Face's float arithmetic.
"""

import numpy as np
from numba import njit, uint64


def normalisation_lut(mean: tuple[float, ...], std: tuple[float, ...], resample: str) -> np.ndarray:
    """float32 [3, 256]: the normalised value of every byte, per channel, as the HF processor computes it.

    - "pil" (Qwen2VLImageProcessorPil): (v / 255 - mean) / std, every operation in float32.
    - "aten_u8" (torchvision Qwen2VLImageProcessor, `_fuse_mean_std_and_rescale_factor`):
      (v - mean * 255) / (std * 255), with the fused constants as float32 products.
    """
    v = np.arange(256, dtype=np.float32)
    lut = np.empty((3, 256), np.float32)
    f255 = np.float32(255)
    for c in range(3):
        mean_c, std_c = np.float32(mean[c]), np.float32(std[c])
        if resample == "pil":
            lut[c] = (v / f255 - mean_c) / std_c
        else:
            lut[c] = (v - mean_c * f255) / (std_c * f255)
    return lut


@njit(cache=True)
def patchify_into(pixels: np.ndarray, lut: np.ndarray, patch: int, merge: int, temporal: int, out: np.ndarray) -> None:
    """Write pixel_values of (h, w, C >= 3) uint8 pixels into out (float32 [gh * gw, dim], C-contiguous).

    h and w must be multiples of patch * merge. Per row of merge blocks (merge * patch image rows),
    the pixels are first normalised into a planar band [channel][row][x] (one lookup per sample,
    contiguous writes); the output is then written strictly in order, each patch row of a channel
    a contiguous run of `patch` floats, twice for the temporal duplicate. The band is a few hundred
    KB and stays in cache, so the output is written once and the source read once.

    Indices are unsigned on purpose: numba wraps negative signed indices, and that per-access
    branch keeps LLVM from vectorising the short runs (measured: 4.5x slower copy phase).
    """
    h, w, channels = pixels.shape
    gh, gw = h // patch, w // patch
    rows = merge * patch
    src = pixels.reshape(-1)
    flat = out.reshape(-1)
    band = np.empty(3 * rows * w, np.float32)
    n_channels, n_patch, width = uint64(channels), uint64(patch), uint64(w)
    channel_stride = uint64(rows * w)
    lut0, lut1, lut2 = lut[0], lut[1], lut[2]
    o = uint64(0)
    for i in range(gh // merge):
        for r in range(rows):
            s = uint64((i * rows + r) * w * channels)
            b = uint64(r * w)
            for x in range(width):
                band[b + x] = lut0[src[s]]
                band[channel_stride + b + x] = lut1[src[s + uint64(1)]]
                band[channel_stride + channel_stride + b + x] = lut2[src[s + uint64(2)]]
                s += n_channels
        for j in range(gw // merge):
            for mh in range(merge):
                for mw in range(merge):
                    x0 = uint64((j * merge + mw) * patch)
                    for c in range(3):
                        first = uint64(c) * channel_stride + uint64(mh) * n_patch * width + x0
                        for _t in range(temporal):
                            s = first
                            for _py in range(n_patch):
                                for px in range(n_patch):
                                    flat[o + px] = band[s + px]
                                o += n_patch
                                s += width
