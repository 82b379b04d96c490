"""Qwen's multimodal RoPE positions: image-only prompts, and SGLang's get_rope_index for prompts with videos.

Two functions because SGLang 0.5.23 takes two paths (`QwenVLImageProcessor._process_mm_data_uncached`):
a request without videos gets `_compute_image_only_mrope_positions_from_offsets`, which walks the
items' offsets (`mrope_image_only` here); one with videos gets `MRotaryEmbedding.get_rope_index` on
the expanded ids, which finds items by their `<|vision_start|>` tokens (`mrope_rope_index` here, a port
that keeps its search order and its arithmetic, float32 for Qwen2.5-VL's time axis included).
"""

from collections.abc import Sequence

import numpy as np

from mmworker.errors import MmError

# Model types whose videos get_rope_index splits into one (1, h, w) item per temporal patch
# (Qwen3-VL's processor gives each its own timestamp and vision block), and the one whose time axis is
# scaled by seconds (Qwen2.5-VL). Plain Qwen2-VL is neither. SGLang's own lists, the Qwen ones only.
SPLIT_VIDEO_MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
TIMED_MODEL_TYPES = ("qwen2_5_vl",)
ROPE_MODEL_TYPES = ("qwen2_vl", *TIMED_MODEL_TYPES, *SPLIT_VIDEO_MODEL_TYPES)


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


def mrope_rope_index(
    input_ids: np.ndarray | Sequence[int],
    image_grids: Sequence[tuple[int, int, int]],
    video_grids: Sequence[tuple[int, int, int]],
    *,
    model_type: str,
    merge_size: int,
    image_token_id: int,
    video_token_id: int,
    vision_start_token_id: int,
    second_per_grid_ts: Sequence[float] | None = None,
    tokens_per_second: float | None = None,
) -> tuple[np.ndarray, int]:
    """(positions int64 [3, L], delta) for expanded `input_ids`, as SGLang's get_rope_index gives them.

    The arguments are get_rope_index's (grids in patches, `(t, h, w)` per image and per video, in
    prompt order; `second_per_grid_ts` one per video, Qwen2.5-VL only). docs/behaviour.md §15.4 states
    the rule: the items are those whose placeholder directly follows a `<|vision_start|>`; they are
    visited in prompt order by searching, from the end of the previous item, for the next image and the
    next video placeholder; each item's tokens get (base + t, base + h, base + w) over its merged grid,
    text counts up on all three rows, and counting resumes after an item at one past its largest
    position. Qwen3-VL/3.5 treat every temporal patch of a video as a (1, h, w) item of its own;
    Qwen2.5-VL's time index is `int(float32(float32(t * second_per_grid) * tokens_per_second))`, the
    float32 arithmetic of the torch code (its `second_per_grid_ts` tensor is float32).
    """
    if model_type not in ROPE_MODEL_TYPES:
        raise MmError(f"mrope: unknown model type {model_type!r} (known: {', '.join(ROPE_MODEL_TYPES)})")
    if isinstance(merge_size, bool) or not isinstance(merge_size, int) or merge_size <= 0:
        raise MmError(f"mrope: merge_size must be a positive integer, got {merge_size!r}")
    ids = np.asarray(input_ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise MmError(f"mrope: input_ids must be a 1-D integer sequence, got {ids.dtype} of shape {ids.shape}")
    ids = ids.astype(np.int64, copy=False)
    n = len(ids)
    images = [_grid(grid, f"image {k}", merge_size) for k, grid in enumerate(image_grids)]
    videos = [_grid(grid, f"video {k}", merge_size) for k, grid in enumerate(video_grids)]
    seconds = np.ones(len(videos), np.float32)  # get_rope_index's 1.0 when the processor gave none
    tokens_per_second32 = np.float32(1)
    if model_type in TIMED_MODEL_TYPES:
        if tokens_per_second is None:
            raise MmError(f"mrope: {model_type} needs tokens_per_second (its vision config's)")
        tokens_per_second32 = np.float32(tokens_per_second)
        if second_per_grid_ts is not None:
            if len(second_per_grid_ts) != len(videos):
                raise MmError(f"mrope: {len(second_per_grid_ts)} second_per_grid_ts for {len(videos)} video(s)")
            # The processor's Python floats become a float32 tensor: round each once, as torch.tensor does.
            seconds = np.asarray(second_per_grid_ts, np.float64).astype(np.float32)
    elif model_type in SPLIT_VIDEO_MODEL_TYPES:
        videos = [(1, h, w) for t, h, w in videos for _ in range(t)]

    # Items are counted by the token after each <|vision_start|> (a Qwen3 video's outer start is
    # followed by its first timestamp, so only the inner ones count), then found by searching.
    starts = np.flatnonzero(ids[:-1] == vision_start_token_id)
    following = ids[starts + 1]
    image_nums = int(np.count_nonzero(following == image_token_id))
    video_nums = int(np.count_nonzero(following == video_token_id))
    if image_nums > len(images) or video_nums > len(videos):
        raise MmError(
            f"mrope: the prompt has {image_nums} image and {video_nums} video placeholder(s) after "
            f"<|vision_start|>, but {len(images)} image and {len(videos)} video grid(s) were given"
        )
    image_at = np.flatnonzero(ids == image_token_id)
    video_at = np.flatnonzero(ids == video_token_id)
    pos = np.empty((3, n), np.int64)
    st = nxt = 0
    image_index = video_index = 0
    for _ in range(image_nums + video_nums):
        ed_image = _next_at(image_at, st, "image") if image_index < image_nums else n + 1
        ed_video = _next_at(video_at, st, "video") if video_index < video_nums else n + 1
        if ed_image < ed_video:
            ed, (t, h, w), kind = ed_image, images[image_index], f"image {image_index}"
            # An image's time index on Qwen2.5-VL is arange(t) * 0 * tokens_per_second: all zero.
            t_index = np.zeros(t, np.int64) if model_type in TIMED_MODEL_TYPES else np.arange(t)
            image_index += 1
        else:
            ed, (t, h, w), kind = ed_video, videos[video_index], f"video item {video_index}"
            if model_type in TIMED_MODEL_TYPES:
                t_index = ((np.arange(t, dtype=np.float32) * seconds[video_index]) * tokens_per_second32).astype(
                    np.int64
                )
            else:
                t_index = np.arange(t)
            video_index += 1
        mh, mw = h // merge_size, w // merge_size
        size = t * mh * mw
        if ed + size > n:
            raise MmError(f"mrope: {kind} at index {ed} spans {size} token(s), the prompt has {n - ed} from there")
        pos[:, st:ed] = np.arange(nxt, nxt + ed - st)
        base = nxt + ed - st
        block = pos[:, ed : ed + size].reshape(3, t, mh, mw)
        block[0] = base + t_index[:, None, None]
        block[1] = base + np.arange(mh)[None, :, None]
        block[2] = base + np.arange(mw)[None, None, :]
        nxt = base + max(int(t_index.max()), mh - 1, mw - 1) + 1
        st = ed + size
    pos[:, st:] = np.arange(nxt, nxt + n - st)
    delta = int(pos.max()) + 1 - n if n else -1
    return pos, delta


def _grid(grid: Sequence[int], what: str, merge_size: int) -> tuple[int, int, int]:
    values = tuple(grid)
    if (
        len(values) != 3
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
        or values[0] < 1
        or min(values[1:]) < merge_size
    ):
        raise MmError(f"mrope: {what}: grid must be 3 integers (t >= 1, h and w >= merge {merge_size}), got {grid!r}")
    t, h, w = (int(v) for v in values)
    return t, h, w


def _next_at(where: np.ndarray, start: int, kind: str) -> int:
    """The first index in sorted `where` at or after `start` (get_rope_index's `list.index(token, st)`)."""
    k = int(np.searchsorted(where, start))
    if k == len(where):
        raise MmError(f"mrope: no {kind} placeholder at or after index {start}")
    return int(where[k])
