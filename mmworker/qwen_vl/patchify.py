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

from mmworker.common.stream import stream_fence, stream_out

# Floats staged in L1 between streaming writes of the output (16 KB).
_STAGE_FLOATS = 4096


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

    h and w must be multiples of patch * merge. The output is produced strictly in its own order,
    merge block by merge block, patch by patch, channel by channel: each (patch, channel) plane is
    normalised straight from the pixels into an L1-sized stage (one table lookup per sample), its
    temporal copies are copied from there, and every full stage is streamed out with non-temporal
    stores (mmworker.common.stream). A merge block's pixels span merge * patch rows and stay in
    L1/L2 while it is read three times, once per channel.

    Indices are unsigned on purpose: numba wraps negative signed indices, and that per-access
    branch keeps LLVM from vectorising the copies (measured at 1288x728: 10.5 -> 3.2 ms).
    """
    h, w, channels = pixels.shape
    gh, gw = h // patch, w // patch
    src = pixels.reshape(-1)
    flat = out.reshape(-1)
    n_channels, n_patch = uint64(channels), uint64(patch)
    plane = n_patch * n_patch
    row_stride = uint64(w) * n_channels
    # A patch's planes may overshoot a full stage: room for one more patch.
    stage = np.empty(_STAGE_FLOATS + 3 * temporal * patch * patch, np.float32)
    address = out.ctypes.data
    chunk = uint64(_STAGE_FLOATS)
    staged = uint64(0)
    at = uint64(0)
    for i in range(gh // merge):
        for j in range(gw // merge):
            for mh in range(merge):
                for mw in range(merge):
                    corner = (
                        uint64((i * merge + mh) * patch) * row_stride + uint64((j * merge + mw) * patch) * n_channels
                    )
                    for c in range(3):
                        lut_c = lut[c]
                        first = staged
                        s = corner + uint64(c)
                        for _py in range(n_patch):
                            q = s
                            for px in range(n_patch):
                                stage[staged + px] = lut_c[src[q]]
                                q += n_channels
                            staged += n_patch
                            s += row_stride
                        for _t in range(1, temporal):
                            for k in range(plane):
                                stage[staged + k] = stage[first + k]
                            staged += plane
                    if staged >= chunk:
                        stream_out(flat, at, stage, chunk, address)
                        at += chunk
                        staged -= chunk
                        for k in range(staged):
                            stage[k] = stage[chunk + k]
    stream_out(flat, at, stage, staged, address)
    stream_fence()
