"""Deterministic source images for the golden fixtures (plain numpy, no Pillow, no torch).

Shared by ``generate_golden.py`` (run in the reference env ``.venv-ref``) and by the test suite
(run in ``.venv``): a fixture case names its source as a small JSON dict (``{"kind": ..., ...}``)
and ``make_source(spec)`` rebuilds the identical uint8 HWC array in either environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "TV_R1_SOURCE",
    "make_source",
    "photo_like",
    "random_rgb",
    "tv_r1_source",
    "tv_r4_source",
]


def random_rgb(h: int, w: int, seed: int) -> np.ndarray:
    """Uniform random uint8 RGB, shape (h, w, 3)."""
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def photo_like(h: int, w: int, seed: int) -> np.ndarray:
    """Smooth, photo-like uint8 RGB (docs/behaviour.md §12 ``make_photo_like``).

    Per-channel sinusoidal base plus N(0, 12) noise that is constant on 8x8 blocks (``np.kron`` of a
    (ceil(h/8), ceil(w/8), 3) normal draw), clipped to [0, 255] and truncated to uint8.
    """
    y = np.arange(h, dtype=np.float64)[:, None]
    x = np.arange(w, dtype=np.float64)[None, :]
    base = np.empty((h, w, 3), dtype=np.float64)
    base[..., 0] = 127 + 100 * np.sin(y / 97) * np.cos(x / 131)
    base[..., 1] = 127 + 100 * np.cos(y / 61) * np.sin(x / 89)
    base[..., 2] = 127 + 100 * np.sin((x + y) / 149)
    rng = np.random.default_rng(seed)
    bh, bw = -(-h // 8), -(-w // 8)
    noise = rng.normal(0.0, 12.0, (bh, bw, 3))
    # == np.kron(noise, np.ones((8, 8, 1)))[:h, :w] (exact: x1.0), but much faster.
    noise = np.repeat(np.repeat(noise, 8, axis=0), 8, axis=1)[:h, :w]
    base += noise
    return np.clip(base, 0, 255, out=base).astype(np.uint8)


# docs/behaviour.md §12 TV-R1: H=6, W=8, RGB (144 bytes).
# fmt: off
TV_R1_SOURCE = (
    190, 59, 63, 127, 17, 131, 195, 223, 131, 117, 197, 23, 180, 231, 134, 169, 170, 223, 116, 136,
    248, 146, 177, 33, 145, 56, 122, 216, 106, 202, 86, 216, 83, 28, 146, 123, 147, 31, 232, 241,
    110, 121, 91, 155, 51, 23, 103, 231, 18, 219, 232, 245, 51, 29, 217, 145, 127, 1, 230, 71, 16,
    221, 60, 37, 244, 210, 22, 144, 160, 73, 69, 49, 53, 85, 14, 192, 25, 58, 139, 237, 23, 131,
    213, 62, 201, 68, 101, 141, 29, 40, 150, 12, 68, 176, 56, 46, 147, 67, 142, 96, 120, 141, 81,
    226, 121, 161, 49, 248, 19, 11, 62, 164, 189, 47, 93, 149, 229, 123, 215, 145, 67, 109, 132, 15,
    78, 102, 84, 96, 129, 53, 187, 251, 136, 93, 52, 105, 89, 164, 155, 54, 64, 42, 79, 61
)
# fmt: on


def tv_r1_source() -> np.ndarray:
    """TV-R1: the 6x8 RGB source of the resize test vectors."""
    return np.array(TV_R1_SOURCE, dtype=np.uint8).reshape(6, 8, 3)


def tv_r4_source() -> np.ndarray:
    """TV-R4: 1x1024 RGB; byte i = low 8 bits of ((i + 134623)*2654435761 + 1649) >> 20 (u64)."""
    i = np.arange(1024 * 3, dtype=np.uint64)
    v = ((i + np.uint64(134623)) * np.uint64(2654435761) + np.uint64(1649)) >> np.uint64(20)
    return (v & np.uint64(0xFF)).astype(np.uint8).reshape(1, 1024, 3)


def make_source(spec: Mapping[str, Any]) -> np.ndarray:
    """Rebuild a source image from its fixture spec, e.g. ``{"kind": "random_rgb", "h": 6, "w": 8,
    "seed": 60008}``, ``{"kind": "photo_like", ...}``, ``{"kind": "tv_r1"}``, ``{"kind": "tv_r4"}``."""
    kind = spec["kind"]
    if kind == "random_rgb":
        return random_rgb(int(spec["h"]), int(spec["w"]), int(spec["seed"]))
    if kind == "photo_like":
        return photo_like(int(spec["h"]), int(spec["w"]), int(spec["seed"]))
    if kind == "tv_r1":
        return tv_r1_source()
    if kind == "tv_r4":
        return tv_r4_source()
    raise ValueError(f"unknown source kind {kind!r}")
