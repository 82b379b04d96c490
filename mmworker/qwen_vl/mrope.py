"""Qwen's multimodal RoPE positions for image-only prompts (the image branch of SGLang's get_rope_index)."""

from collections.abc import Sequence

import numpy as np

from mmworker.errors import MmError


def mrope_image_only(
    input_len: int, items: Sequence[tuple[int, int, tuple[int, int, int]]], merge_size: int
) -> tuple[np.ndarray, int]:
    """(positions int64 [3, input_len], delta) for `items` = [(start, end inclusive, (t, h, w))].

    docs/behaviour.md §1.5: text tokens count up on all three rows; an image's tokens get
    (next + ti, next + hi, next + wi) over its merged grid, after which counting resumes at
    next + max(t, h/merge, w/merge). delta = max(positions) + 1 - input_len (-1 for an empty prompt).
    Identical for qwen2_vl, qwen2_5_vl, qwen3_vl and qwen3_5 (t = 1 for stills).
    """
    pos = np.empty((3, input_len), np.int64)
    st = 0
    nxt = 0
    for start, end, (t, h, w) in items:
        if start < st or end >= input_len or end < start:
            raise MmError(f"mrope: item range ({start},{end}) out of order/bounds")
        pos[:, st:start] = np.arange(nxt, nxt + start - st)
        nxt += start - st
        gh, gw = h // merge_size, w // merge_size
        if t * gh * gw != end - start + 1:
            raise MmError("mrope: token span does not match grid")
        block = pos[:, start : end + 1].reshape(3, t, gh, gw)
        block[0] = nxt + np.arange(t)[:, None, None]
        block[1] = nxt + np.arange(gh)[None, :, None]
        block[2] = nxt + np.arange(gw)[None, None, :]
        nxt += max(t, gh, gw)
        st = end + 1
    pos[:, st:] = np.arange(nxt, nxt + input_len - st)
    delta = int(pos.max()) + 1 - input_len if input_len else -1
    return pos, delta
