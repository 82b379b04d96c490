"""Qwen-VL prompts with videos: placeholder expansion (Qwen3's timestamp text included), offsets and M-RoPE.

mmworker works on token ids: the prompt holds one `<|image_pad|>` per image and one `<|video_pad|>`
per video, and this module expands them as transformers 5.19's processors expand the text before
tokenizing it (docs/behaviour.md §15):

- Qwen2-VL, Qwen2.5-VL: a video's pad becomes `gt * gh * gw / merge^2` copies of itself, as an
  image's does;
- Qwen3-VL, Qwen3.5: it becomes, per temporal patch k, the text `f"<{t_k:.1f} seconds>"` then
  `<|vision_start|>`, `gh * gw / merge^2` pads and `<|vision_end|>`; the chat template's own start and
  end tokens around the pad stay, so the blocks nest inside them.

Workers hold no tokenizer, so the timestamp text's ids are composed from a table of thirteen pieces
("<", each digit, ".", " seconds>") that `timestamp_token_table` builds from the checkpoint's
tokenizer once and verifies: Qwen's pre-tokenizer splits "<12.5 seconds>" into "<", "1", "2", ".",
"5", " seconds", ">" (its regex isolates every digit, and a byte-level BPE never merges across those
splits), so the ids of the whole are the ids of the pieces, concatenated. A tokenizer for which that
does not hold is refused by name. The positions are SGLang 0.5.23's: `get_rope_index` on the expanded
ids when there is a video, the offsets walk of `mrope_image_only` otherwise (mmworker.qwen_vl.mrope).
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mmworker.errors import MmError
from mmworker.pipeline import Explicit, Media, Repeat, Segment, Text, TokenLayout, apply_layout_runs
from mmworker.qwen_vl.mrope import (
    ROPE_MODEL_TYPES,
    SPLIT_VIDEO_MODEL_TYPES,
    TIMED_MODEL_TYPES,
    mrope_image_only,
    mrope_rope_index,
)
from mmworker.qwen_vl.spec import QwenSpec

# The text pieces a timestamp's ids are composed of, in the order a table lists them.
TIMESTAMP_PIECES = ("<", *"0123456789", ".", " seconds>")
# The timestamps (in tenths of a second) every built table is checked on: every value 0.0 .. 99.9,
# integer parts of three and four digits with every digit in every place (a stride of 97 tenths
# cycles each place through all ten digits), repeated digits and the ends of the range. A video
# within mmworker's decode budget (an hour) stays below 3600 s; 9999.9 leaves room.
_SAMPLE_TENTHS = (
    *range(1000),
    *range(1000, 100_000, 97),
    *(d * 1111 for d in range(1, 10)),
    *(d * 11111 for d in range(1, 10)),
    99_999,
)

TimestampTable = Mapping[str, Sequence[int]]


def timestamp_text(seconds: float) -> str:
    """The text transformers 5.19's Qwen3-VL processor writes before a temporal patch's block."""
    # A Python float (or numpy float64, its subclass): transformers computes timestamps in double, and
    # a float32 would print differently ("{:.1f}" of 0.15 is "0.1", of float32(0.15) "0.2").
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise MmError(f"video timestamp: expected a finite Python float of seconds, got {seconds!r}")
    if seconds < 0:
        raise MmError(f"video timestamp: {seconds!r} is negative")
    return f"<{seconds:.1f} seconds>"


def check_timestamp_table(table: TimestampTable) -> dict[str, tuple[int, ...]]:
    """`table` checked and normalised (tuples of int), e.g. as read from a spec's JSON: exactly the keys
    of TIMESTAMP_PIECES, each a non-empty list of non-negative token ids. Composition is not checked
    here (no tokenizer): `timestamp_token_table` does that when it builds one."""
    if not isinstance(table, Mapping):
        raise MmError(f"timestamp token table: expected a mapping, got {type(table).__name__}")
    keys = set(table)
    if keys != set(TIMESTAMP_PIECES):
        missing = [k for k in TIMESTAMP_PIECES if k not in keys]
        extra = sorted(repr(k) for k in keys - set(TIMESTAMP_PIECES))
        raise MmError(
            f"timestamp token table: missing {', '.join(map(repr, missing)) or 'nothing'}, "
            f"unexpected {', '.join(extra) or 'nothing'}"
        )
    out = {}
    for piece in TIMESTAMP_PIECES:
        ids = table[piece]
        if (
            isinstance(ids, (str, bytes))
            or not isinstance(ids, Sequence)
            or not ids
            or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i >= 0 for i in ids)
        ):
            raise MmError(f"timestamp token table: {piece!r} must be a non-empty list of token ids, got {ids!r}")
        out[piece] = tuple(int(i) for i in ids)
    return out


def timestamp_tokens(seconds: float, table: Mapping[str, tuple[int, ...]]) -> list[int]:
    """The ids of `timestamp_text(seconds)`, composed piece by piece from a checked table."""
    text = timestamp_text(seconds)
    ids = list(table["<"])
    for char in text[1 : -len(" seconds>")]:
        ids += table[char]
    ids += table[" seconds>"]
    return ids


def timestamp_token_table(tokenize: Callable[[str], Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """The table of TIMESTAMP_PIECES' ids under `tokenize` (text -> ids, no special tokens added: e.g.
    `lambda s: tokenizer.encode(s, add_special_tokens=False)`), verified on about 2,000 timestamps from
    0.0 to 9999.9: each must tokenize exactly as the table composes it, else MmError naming the first
    that does not (a pre-tokenizer that keeps digits together, as GPT-2's does, fails on "<10.0 seconds>"
    once its BPE has merged "10")."""
    table = check_timestamp_table({piece: list(tokenize(piece)) for piece in TIMESTAMP_PIECES})
    for tenths in _SAMPLE_TENTHS:
        text = f"<{tenths // 10}.{tenths % 10} seconds>"
        expected = [int(i) for i in tokenize(text)]
        composed = timestamp_tokens(tenths / 10, table)
        if composed != expected:
            raise MmError(
                f"timestamp token table: this tokenizer does not compose {text!r}: it gives {expected}, "
                f"the pieces give {composed}"
            )
    return table


@dataclass(frozen=True)
class VideoPromptRules:
    """What expanding and positioning a prompt with videos needs to know of the checkpoint.

    `model_type` is SGLang's (the HF config's): it picks the video expansion (timestamped blocks for
    Qwen3-VL/3.5) and get_rope_index's time axis. `tokens_per_second` is the vision config's
    (Qwen2.5-VL only; 2 in the released checkpoints), `timestamp_table` the checked table of
    `timestamp_token_table` (Qwen3-VL/3.5 only).
    """

    model_type: str
    merge_size: int
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    tokens_per_second: float | None = None
    timestamp_table: Mapping[str, tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        if self.model_type not in ROPE_MODEL_TYPES:
            raise MmError(
                f"video prompt: unknown model type {self.model_type!r} (known: {', '.join(ROPE_MODEL_TYPES)})"
            )
        for name in ("merge_size", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
            value, least = getattr(self, name), 1 if name == "merge_size" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise MmError(f"video prompt: `{name}` must be an integer >= {least}, got {value!r}")
        specials = (self.image_token_id, self.video_token_id, self.vision_start_token_id, self.vision_end_token_id)
        if len(set(specials)) != 4:
            raise MmError(f"video prompt: the image, video, vision start and end token ids must differ, got {specials}")
        if self.model_type in TIMED_MODEL_TYPES:
            tps = self.tokens_per_second
            if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not math.isfinite(tps) or tps <= 0:
                raise MmError(f"video prompt: {self.model_type} needs a positive `tokens_per_second`, got {tps!r}")
        if self.model_type in SPLIT_VIDEO_MODEL_TYPES:
            if self.timestamp_table is None:
                raise MmError(f"video prompt: {self.model_type} needs a `timestamp_table` (timestamp_token_table)")
            object.__setattr__(self, "timestamp_table", check_timestamp_table(self.timestamp_table))

    @classmethod
    def from_spec(
        cls,
        spec: QwenSpec,
        model_type: str | None = None,
        tokens_per_second: float | None = None,
        timestamp_table: TimestampTable | None = None,
    ) -> "VideoPromptRules":
        """The rules for a QwenSpec, which must name the vision start, end and video token ids; the
        model type, tokens_per_second and timestamp table are the spec's unless given here."""
        model_type = spec.model_type if model_type is None else model_type
        if model_type is None:
            raise MmError("video prompt: the spec names no `model_type`")
        missing = [name for name in ("vision_start_token_id", "vision_end_token_id", "video_token_id")
                   if getattr(spec, name) is None]  # fmt: skip
        if missing:
            raise MmError(f"video prompt: the spec has no {', '.join(missing)}")
        return cls(
            model_type=model_type,
            merge_size=spec.merge_size,
            image_token_id=spec.image_token_id,
            video_token_id=spec.video_token_id,  # type: ignore[arg-type]  # checked above
            vision_start_token_id=spec.vision_start_token_id,  # type: ignore[arg-type]
            vision_end_token_id=spec.vision_end_token_id,  # type: ignore[arg-type]
            tokens_per_second=spec.tokens_per_second if tokens_per_second is None else tokens_per_second,
            timestamp_table=spec.timestamp_table if timestamp_table is None else timestamp_table,
        )


@dataclass(frozen=True)
class VideoItem:
    """One video of a prompt: its `video_grid_thw` (gt, gh, gw) in patches; for Qwen2.5-VL its
    `second_per_grid_ts` entry (`second_per_grid`), for Qwen3-VL/3.5 one timestamp in seconds per
    temporal patch (`timestamps`, as the processor computes them). Fields a model type does not use
    are ignored, as the processors and get_rope_index ignore them. From mmworker.qwen_vl.video's
    `VideoFeatures` f: `VideoItem(tuple(f.video_grid_thw), f.second_per_grid_ts, f.timestamps)`."""

    grid: tuple[int, int, int]
    second_per_grid: float | None = None
    timestamps: Sequence[float] | None = None


@dataclass(frozen=True, eq=False)
class VideoPrompt:
    """An expanded prompt: ids int64 [L], offsets, M-RoPE positions int64 [3, L] and delta.

    Offsets are inclusive (start, end) index pairs of placeholder runs in `input_ids`, as SGLang's
    `MultimodalDataItem.offsets` holds them: one per image; per video one (Qwen2/2.5-VL) or one per
    temporal patch (Qwen3-VL/3.5, whose blocks are separate runs). docs/behaviour.md §15.3 says how
    SGLang groups them into items.
    """

    input_ids: np.ndarray
    image_offsets: tuple[tuple[int, int], ...]
    video_offsets: tuple[tuple[tuple[int, int], ...], ...]
    positions: np.ndarray
    delta: int


def prompt_layout(
    input_ids: np.ndarray,
    images: Sequence[tuple[int, int, int]],
    videos: Sequence[VideoItem],
    rules: VideoPromptRules,
) -> TokenLayout:
    """The layout (mmworker.pipeline) of a prompt holding one `<|image_pad|>` per entry of `images`
    (grids (t, gh, gw)) and one `<|video_pad|>` per entry of `videos`, each list in prompt order:
    items 0 .. len(images) - 1 are the images, the videos follow. Every placeholder and grid is
    checked here (docs/behaviour.md §15.2); `apply_layout_runs` checks the coverage."""
    ids = input_ids
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise MmError(f"video prompt: input_ids must be a 1-D integer sequence, got {ids.dtype} of shape {ids.shape}")
    image_at = np.flatnonzero(ids == rules.image_token_id)
    video_at = np.flatnonzero(ids == rules.video_token_id)
    if len(image_at) != len(images):
        raise MmError(f"prompt has {len(image_at)} image placeholder(s) but {len(images)} image(s)")
    if len(video_at) != len(videos):
        raise MmError(f"prompt has {len(video_at)} video placeholder(s) but {len(videos)} video(s)")
    patterns: dict[int, tuple[int, Repeat | Explicit]] = {}  # placeholder index -> (item, its expansion)
    for k, (where, grid) in enumerate(zip(image_at.tolist(), images, strict=True)):
        patterns[where] = (k, Repeat(rules.image_token_id, _tokens(grid, rules.merge_size, f"image {k}")))
    split = rules.model_type in SPLIT_VIDEO_MODEL_TYPES
    for k, (where, video) in enumerate(zip(video_at.tolist(), videos, strict=True)):
        if not isinstance(video, VideoItem):
            raise MmError(f"video {k}: expected a VideoItem, got {type(video).__name__}")
        gt, gh, gw = _checked_grid(video.grid, rules.merge_size, f"video {k}")
        if rules.model_type in TIMED_MODEL_TYPES:
            _second_per_grid(video, k)
        if not split:
            pattern: Repeat | Explicit = Repeat(rules.video_token_id, gt * gh * gw // rules.merge_size**2)
        else:
            if where > 0 and int(ids[where - 1]) not in (rules.vision_start_token_id, rules.vision_end_token_id,
                                                         rules.image_token_id, rules.video_token_id):  # fmt: skip
                # HF tokenizes the timestamp text together with whatever text precedes the pad (":<" is one
                # pre-token), which ids cannot show; after a special token it is tokenized on its own.
                raise MmError(
                    f"video {k}: the token before its <|video_pad|> (index {where}) is {int(ids[where - 1])}, not "
                    "<|vision_start|>: its timestamp text would be tokenized together with the text before it "
                    "(the chat template writes <|vision_start|><|video_pad|><|vision_end|>)"
                )
            blocks, runs = _timestamped_blocks(video, (gt, gh, gw), rules, f"video {k}")
            pattern = Explicit(blocks, range(runs[0].start, runs[-1].stop), runs)
        patterns[where] = (len(images) + k, pattern)
    segments: list[Segment] = []
    start = 0
    for where in sorted(patterns):
        if where > start:
            segments.append(Text(range(start, where)))
        segments.append(Media(*patterns[where]))
        start = where + 1
    if start < len(ids):
        segments.append(Text(range(start, len(ids))))
    return tuple(segments)


def expand_prompt(
    input_ids: np.ndarray | Sequence[int],
    images: Sequence[tuple[int, int, int]],
    videos: Sequence[VideoItem],
    rules: VideoPromptRules,
) -> tuple[np.ndarray, tuple[tuple[int, int], ...], tuple[tuple[tuple[int, int], ...], ...]]:
    """(expanded ids int64, image offsets, video offsets: each video's runs) of `prompt_layout`'s
    prompt. Everything is checked before anything is built."""
    ids = np.asarray(input_ids)
    ids = ids.astype(np.int64, copy=False) if ids.ndim == 1 and ids.dtype.kind in "iu" else ids
    layout = prompt_layout(ids, images, videos, rules)
    expanded, runs = apply_layout_runs(ids, layout, len(images) + len(videos))
    return expanded, tuple(r[0] for r in runs[: len(images)]), tuple(runs[len(images) :])


def prompt_positions(
    expanded: np.ndarray,
    image_offsets: Sequence[tuple[int, int]],
    images: Sequence[tuple[int, int, int]],
    videos: Sequence[VideoItem],
    rules: VideoPromptRules,
) -> tuple[np.ndarray, int]:
    """The M-RoPE positions and delta SGLang 0.5.23 computes for an expanded prompt: with videos its
    get_rope_index (`mrope_rope_index`), without its image-only walk over the offsets
    (`mrope_image_only`, byte for byte the image path's)."""
    if not videos:
        items = [(s, e, tuple(grid)) for (s, e), grid in zip(image_offsets, images, strict=True)]
        return mrope_image_only(len(expanded), items, rules.merge_size)
    seconds = None
    if rules.model_type in TIMED_MODEL_TYPES:
        seconds = [_second_per_grid(video, k) for k, video in enumerate(videos)]
    return mrope_rope_index(
        expanded,
        [tuple(grid) for grid in images],
        [tuple(video.grid) for video in videos],
        model_type=rules.model_type,
        merge_size=rules.merge_size,
        image_token_id=rules.image_token_id,
        video_token_id=rules.video_token_id,
        vision_start_token_id=rules.vision_start_token_id,
        second_per_grid_ts=seconds,
        tokens_per_second=rules.tokens_per_second,
    )


def video_prompt(
    input_ids: np.ndarray | Sequence[int],
    images: Sequence[tuple[int, int, int]],
    videos: Sequence[VideoItem],
    rules: VideoPromptRules,
) -> VideoPrompt:
    """`expand_prompt`, then `prompt_positions`."""
    expanded, image_offsets, video_offsets = expand_prompt(input_ids, images, videos, rules)
    positions, delta = prompt_positions(expanded, image_offsets, images, videos, rules)
    return VideoPrompt(expanded, image_offsets, video_offsets, positions, delta)


def _checked_grid(grid: Sequence[int], merge_size: int, what: str) -> tuple[int, int, int]:
    values = tuple(grid) if isinstance(grid, (tuple, list, np.ndarray)) else ()
    if (
        len(values) != 3
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
        or values[0] < 1
        or min(values[1:]) < 1
        or values[1] % merge_size
        or values[2] % merge_size
    ):
        raise MmError(f"{what}: grid must be 3 positive integers (t, h, w), h and w multiples of "
                      f"merge {merge_size}, got {grid!r}")  # fmt: skip
    t, h, w = (int(v) for v in values)
    return t, h, w


def _tokens(grid: Sequence[int], merge_size: int, what: str) -> int:
    t, h, w = _checked_grid(grid, merge_size, what)
    return t * h * w // merge_size**2


def _timestamped_blocks(
    video: VideoItem, grid: tuple[int, int, int], rules: VideoPromptRules, what: str
) -> tuple[np.ndarray, tuple[range, ...]]:
    """A Qwen3 video's replacement ids and where its pad runs are in them: per temporal patch the
    timestamp's ids, <|vision_start|>, the pads, <|vision_end|>."""
    gt, gh, gw = grid
    stamps = video.timestamps
    if stamps is None or isinstance(stamps, (str, bytes)) or len(stamps) != gt:
        got = "none" if stamps is None else (repr(stamps) if isinstance(stamps, (str, bytes)) else len(stamps))
        raise MmError(f"{what}: {rules.model_type} needs one timestamp per temporal patch ({gt}), got {got}")
    table = rules.timestamp_table
    assert table is not None  # VideoPromptRules requires it for these model types
    try:
        texts = [timestamp_tokens(seconds, table) for seconds in stamps]
    except MmError as exc:
        raise MmError(f"{what}: {exc}") from exc
    pads = gh * gw // rules.merge_size**2
    out = np.empty(sum(len(t) for t in texts) + gt * (pads + 2), np.int64)
    runs = []
    at = 0
    for text in texts:
        out[at : at + len(text)] = text
        at += len(text)
        out[at] = rules.vision_start_token_id
        out[at + 1 : at + 1 + pads] = rules.video_token_id
        runs.append(range(at + 1, at + 1 + pads))
        out[at + 1 + pads] = rules.vision_end_token_id
        at += pads + 2
    return out, tuple(runs)


def _second_per_grid(video: VideoItem, k: int) -> float:
    value = video.second_per_grid
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value):
        raise MmError(f"video {k}: qwen2_5_vl needs its second_per_grid (a finite number), got {value!r}")
    return float(value)
