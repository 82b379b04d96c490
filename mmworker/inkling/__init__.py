"""Inkling: the family the pool serves (`Inkling`, mmworker.inkling.family) and the crate's library API.

| function | does |
|---|---|
| `patchify_rgb(arr, ps)` | uint8 [h, w, 3] -> flat uint16 bf16 bits (mmworker.inkling.patches) |
| `decode_patchify(data, ps, frac, cap)` | decode, rescale the long edge (Pillow LANCZOS), patchify: (h', w', bits) |
| `decode_patchify_batch`, `preprocess_images`, `rescale_patchify_hash` | the same per image, with hashes |
"""

from collections.abc import Sequence

import numpy as np

from mmworker.common.decode import decode_image
from mmworker.common.hashing import content_hash
from mmworker.common.pixels import RgbImage
from mmworker.errors import MmError
from mmworker.inkling.family import NAMED_SPECS, Inkling, InklingSpec, rescaled
from mmworker.inkling.patches import bf16_bits, check_patch_size, grid, patchify_into

__all__ = ["NAMED_SPECS", "Inkling", "InklingSpec", "bf16_bits", "decode_patchify", "decode_patchify_batch", "grid",
           "patchify_rgb", "preprocess_images", "rescale_patchify_hash"]  # fmt: skip


def _patchify(pixels: np.ndarray, patch_size: int) -> np.ndarray:
    rows, cols = grid(pixels.shape[0], pixels.shape[1], patch_size)
    out = np.empty(rows * cols * patch_size * patch_size * 3, np.uint16)
    patchify_into(pixels, patch_size, out)
    return out


def _check_rgb(arr: np.ndarray) -> None:
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise MmError("expected a uint8 HWC RGB array with 3 channels")


def patchify_rgb(arr: np.ndarray, patch_size: int) -> np.ndarray:
    """Flat uint16 bf16 bits of uint8 [h, w, 3] pixels (see the module docstring for the layout)."""
    check_patch_size(patch_size)
    _check_rgb(arr)
    return _patchify(arr, patch_size)


def decode_patchify(
    data: bytes, patch_size: int, rescale_frac: float | None = None, rescale_cap: int | None = None
) -> tuple[int, int, np.ndarray]:
    """Decode, rescale the long edge (PIL Lanczos) if asked, patchify: (h', w', flat uint16 bits)."""
    check_patch_size(patch_size)
    image = rescaled(decode_image(data), rescale_frac, rescale_cap)
    return image.height, image.width, _patchify(image.pixels, patch_size)


def decode_patchify_batch(
    datas: Sequence[bytes], patch_size: int, rescale_frac: float | None = None, rescale_cap: int | None = None
) -> list[tuple[int, int, np.ndarray]]:
    """decode_patchify for each image, in order (inline, no threads)."""
    return [decode_patchify(d, patch_size, rescale_frac, rescale_cap) for d in datas]


def preprocess_images(
    datas: Sequence[bytes], patch_size: int, rescale_frac: float | None = None, rescale_cap: int | None = None
) -> list[tuple[int, int, np.ndarray, int]]:
    """Per image (h', w', flat uint16 bits, content hash of the raw encoded bytes)."""
    return [(*decode_patchify(d, patch_size, rescale_frac, rescale_cap), content_hash(d)) for d in datas]


def rescale_patchify_hash(
    arr: np.ndarray,
    raw_bytes: bytes,
    patch_size: int,
    rescale_frac: float | None = None,
    rescale_cap: int | None = None,
) -> tuple[int, int, np.ndarray, int]:
    """Already-decoded pixels: rescale, patchify, and hash the raw bytes they came from."""
    check_patch_size(patch_size)
    _check_rgb(arr)
    image = rescaled(RgbImage(pixels=np.ascontiguousarray(arr)), rescale_frac, rescale_cap)
    return image.height, image.width, _patchify(image.pixels, patch_size), content_hash(raw_bytes)
