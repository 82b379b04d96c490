"""Long-edge rescale arithmetic (the crate's `scaled_dims`, used by the Inkling family)."""

import math

from mmworker.errors import MmError


def scaled_dims(w: int, h: int, rescale_frac: float | None = None, rescale_cap: int | None = None) -> tuple[int, int]:
    """(w', h') after scaling the long edge by rescale_frac, capped (upscaling only) at rescale_cap.

    docs/behaviour.md §6: sides round half up (floor(v * ratio + 0.5), not Python's round) and never go
    below 1; the cap only limits upscaling and never forces a downscale. Unlike the crate, which
    does not validate, nonsensical arguments are refused instead of producing arbitrary sizes.
    """
    if w < 0 or h < 0:
        raise MmError(f"scaled_dims: sizes must be non-negative, got {w}x{h}")
    if rescale_frac is None:
        return w, h
    if not (math.isfinite(rescale_frac) and rescale_frac > 0):
        raise MmError(f"scaled_dims: rescale_frac must be a positive finite number, got {rescale_frac}")
    if rescale_cap is not None and rescale_cap <= 0:
        raise MmError(f"scaled_dims: rescale_cap must be positive, got {rescale_cap}")
    long_edge = max(w, h)
    if long_edge == 0:
        return w, h
    target = long_edge * rescale_frac
    if rescale_cap is not None:
        target = min(target, max(rescale_cap, long_edge))
    ratio = target / long_edge
    if ratio == 1.0:
        return w, h
    return max(1, math.floor(w * ratio + 0.5)), max(1, math.floor(h * ratio + 0.5))
