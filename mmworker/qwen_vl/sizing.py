"""Qwen's smart_resize: the target size of an image under the spec's factor and pixel budget."""

import math

from mmworker.errors import MmError

MAX_ASPECT_RATIO = 200


def _ratio_text(ratio: float) -> str:
    text = repr(ratio)  # Rust prints f64 like Python's repr, minus a trailing ".0"
    return text[:-2] if text.endswith(".0") else text


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height', width'): multiples of factor, pixel count inside [min_pixels, max_pixels] where possible.

    SGLang's Python smart_resize in f64 (docs/behaviour.md §7.2): Python's round (ties to even), a
    `max(factor, .)` clamp, then the beta rescale; no "smaller than factor" error. Unlike Python,
    an image too thin for the budget is refused here instead of crashing inside PIL.
    """
    if height <= 0 or width <= 0:
        raise MmError("empty image")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise MmError(f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got {_ratio_text(ratio)}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    if h_bar == 0 or w_bar == 0:
        raise MmError(
            f"smart_resize: {height}x{width} degenerates to {h_bar}x{w_bar} at max_pixels={max_pixels}; "
            "image is too thin for this pixel budget"
        )
    return h_bar, w_bar
