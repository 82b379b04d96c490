"""The family contract: the carriers a model family fills and the token-layout rules every family shares.

A family describes data and never runs a request (the crate's `MmFamilyProcessor`, docs/behaviour.md §1):

    capabilities()                                   -> Capabilities
    process_item(image, alloc)                       -> ProcessedItem(feature, aux, geometry)
    process_video(data, alloc)                       -> ProcessedItem   (families whose capabilities say video)
    layout(input_ids, geometries)                    -> TokenLayout (segments)
    positions(expanded_ids, offsets, geometries)     -> Rope1D | MRope

`process_item` writes its feature into an array it gets from `alloc(shape, dtype)`: in process that
is `np.empty`, in a pool worker it is a slice of shared memory, so the feature is computed straight
into its final place. It consumes its image, which is decoded pixels (`RgbImage`) or, for a
sequential colour JPEG, the opened file (`JpegRows`: decode it whole with `load()`, or take its
rows in bands as they decode with `stream(sink)`); it may release decoded pixels
(`RgbImage.release`) as soon as it has read them, so that their memory can be reused within the
same item. The driver
(mmworker.driver) owns control flow and the failure protocol; `apply_layout` here turns a layout
into expanded ids and inclusive offsets with every coverage check the crate makes, so no family can
produce an inconsistent request.

A request's items are its images, then its videos, each in prompt order; the geometries a family's
`layout` and `positions` get follow that order, a `Grid` per image and a `VideoGrid` per video (what
the prompt needs of it beyond the grid: its timing). An item's placeholder tokens may lie in several
runs (a Qwen3 video: one run per temporal patch, timestamp text between): `Explicit.runs`.
"""

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from mmworker.common.jpeg_rows import JpegRows
from mmworker.common.pixels import RgbImage
from mmworker.common.stream import LINE_BYTES
from mmworker.errors import MmError

# alloc(shape, dtype) -> a C-contiguous array the family fills; it must not keep other references.
Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]


# Alignment of every feature allocated here, as in a shared-memory ring: kernels stream their
# output as whole cache lines only into a line-aligned buffer (malloc guarantees 16 bytes).
FEATURE_ALIGNMENT = LINE_BYTES


def numpy_allocator(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The in-process allocator: a fresh numpy array, its data 64-byte aligned."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + FEATURE_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % FEATURE_ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@dataclass(frozen=True)
class Capabilities:
    """Modalities beyond images a family accepts (MmInput's `videos` need `video`), for callers to ask."""

    video: bool = False
    audio: bool = False
    note: str = ""  # why a modality is missing (e.g. a spec key it needs), for messages


@dataclass(frozen=True)
class Grid:
    """Patch grid of one item: t (frames; 1 for stills), h and w in patches. Only families read it."""

    t: int
    h: int
    w: int


@dataclass(frozen=True)
class VideoGrid:
    """Patch grid of one video (t temporal patches, h and w in patches) and its timing: Qwen2.5-VL's
    seconds per temporal patch (`second_per_grid`), Qwen3's timestamp per temporal patch
    (`timestamps`, seconds), each None where the family does not use it. Only families read it."""

    t: int
    h: int
    w: int
    second_per_grid: float | None = None
    timestamps: tuple[float, ...] | None = None


Geometry = Grid | VideoGrid

# SGLang's Modality names of the two kinds of item a request carries (`MultimodalDataItem.modality`).
IMAGE, VIDEO = "IMAGE", "VIDEO"


@dataclass(frozen=True, eq=False)
class ProcessedItem:
    """One item's model input: `feature` (e.g. Qwen pixel_values), named aux tensors, its geometry."""

    feature: np.ndarray
    aux: dict[str, np.ndarray] = field(default_factory=dict)
    geometry: Geometry | None = None


@dataclass(frozen=True)
class Repeat:
    """n copies of one token id; the whole run is the item's span."""

    id: int
    n: int


@dataclass(frozen=True, eq=False)
class Explicit:
    """An explicit id list; only ids[content] is the item's span (wrappers like <img> stay outside).

    `runs`: where in ids[content] the item's placeholder tokens are, when they are not the whole span
    (ascending, disjoint, non-empty ranges of `ids` inside `content`, the first starting at its start
    and the last ending at its end); empty: one run, the whole span."""

    ids: tuple[int, ...] | np.ndarray
    content: range
    runs: tuple[range, ...] = ()


@dataclass(frozen=True)
class Text:
    """Source tokens `span` (a range into the prompt ids), copied unchanged."""

    span: range


@dataclass(frozen=True)
class Media:
    """Item `item`'s expansion, replacing exactly one source placeholder token."""

    item: int
    pattern: Repeat | Explicit


Segment = Text | Media
TokenLayout = tuple[Segment, ...]


@dataclass(frozen=True)
class Rope1D:
    """Plain 1-D positions: nothing to emit, the scheduler uses an arange."""


@dataclass(frozen=True, eq=False)
class MRope:
    """Multimodal RoPE positions int64 [3, L] and delta = max(positions) + 1 - L."""

    positions: np.ndarray
    delta: int


Positions = Rope1D | MRope


class Family(Protocol):
    """What a model family provides; see the module docstring.

    Beside the four steps, everything the layers above need to know of a family without knowing
    which one it is: the pool's warm-up, the load test's prompts, the CLI's description and the
    hand-off to SGLang all go through these members, never through a family's spec.
    """

    name: str
    # SGLang's Modality name for this family's items ("IMAGE"): `MultimodalDataItem.modality`.
    modality: str

    def describe(self) -> str:
        """One line for people: the family and what it reproduces (checkpoint settings, resize)."""
        ...

    def image_prompt(self) -> tuple[int, ...]:
        """The prompt tokens that stand for one image before expansion, in order: exactly one of
        them is the placeholder `layout` expands (Qwen: vision start, image pad, vision end)."""
        ...

    def video_prompt(self) -> tuple[int, ...]:
        """The prompt tokens that stand for one video before expansion, as `image_prompt` for an image
        (Qwen: vision start, video pad, vision end); only families whose capabilities say `video` have it."""
        ...

    def token_ids(self) -> dict[str, int]:
        """The special token ids SGLang's processor output carries, under SGLang's names
        (`im_token_id`, `im_start_id`, `im_end_id`, `video_token_id`), those this spec knows: the
        scheduler finds and pads an item's tokens only by these."""
        ...

    def warm_up_images(self) -> tuple[tuple[int, int, str], ...]:
        """(width, height, format) of synthetic images whose processing loads every kernel this
        family's requests touch: a pool worker runs one request of them before its first job."""
        ...

    def model_data(self, aux: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """An item's SGLang `model_specific_data` from its aux tensors (views in, views out:
        nothing is copied)."""
        ...

    def capabilities(self) -> Capabilities: ...

    def process_item(self, image: RgbImage | JpegRows, alloc: Allocator = numpy_allocator) -> ProcessedItem: ...

    def process_video(self, data: bytes | memoryview, alloc: Allocator = numpy_allocator) -> ProcessedItem:
        """One encoded video's item (geometry a VideoGrid); only families whose capabilities say
        `video` have it (the driver asks them before it calls)."""
        ...

    def layout(self, input_ids: np.ndarray, geometries: Sequence[Geometry]) -> TokenLayout: ...

    def positions(
        self, input_ids: np.ndarray, offsets: Sequence[tuple[int, int]], geometries: Sequence[Geometry]
    ) -> Positions:
        """Positions of the expanded prompt `input_ids`, given each item's inclusive span."""
        ...


def spec_mapping(spec: Mapping[str, Any] | str, named: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`spec` as a new dict: a name in `named` (bundled checkpoint specs), a JSON object's text, or a
    mapping. The one parser of spec arguments: the registry passes every family's bundled specs, a
    family's own functions its own."""
    if isinstance(spec, str):
        if spec in named:
            return json.loads(json.dumps(named[spec]))  # a deep copy the caller may change
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            if spec.strip().isidentifier():  # meant as a name, not as JSON
                raise MmError(f"unknown named spec {spec.strip()!r}; known: {', '.join(named)}") from None
            raise MmError(f"mm spec: not a spec name or a JSON object: {exc}") from exc
    if not isinstance(spec, Mapping):
        raise MmError(f"mm spec: expected a JSON object, got {type(spec).__name__}")
    return dict(spec)


def _range_text(r: range) -> str:
    return f"{r.start}..{r.stop}"  # Rust's Debug form of a Range, as in the crate's messages


Run = tuple[int, int]  # inclusive (start, end) of placeholder tokens in the expanded ids


def apply_layout(src: np.ndarray, layout: TokenLayout, n_items: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Expand `src` (int64 prompt ids) by `layout`; returns (expanded ids, inclusive offsets by item):
    each item's span, from its first placeholder token to its last (`apply_layout_runs` for its runs)."""
    out, runs = apply_layout_runs(src, layout, n_items)
    return out, [(item_runs[0][0], item_runs[-1][1]) for item_runs in runs]


def apply_layout_runs(src: np.ndarray, layout: TokenLayout, n_items: int) -> tuple[np.ndarray, list[tuple[Run, ...]]]:
    """Expand `src` (int64 prompt ids) by `layout`; returns (expanded ids, each item's placeholder runs).

    Every check of docs/behaviour.md §1.3 runs before anything is built: segments must tile the source
    exactly and in order, each item must be placed once, each expansion must be non-empty, and an
    Explicit pattern's runs must lie in order inside its content, which they must begin and end.
    """
    total = len(src)
    consumed = 0
    spans: list[tuple[Run, ...] | None] = [None] * n_items
    pieces: list[np.ndarray | tuple[int, int]] = []  # id arrays, or (id, n) runs
    out_len = 0
    for segment in layout:
        if isinstance(segment, Text):
            span = segment.span
            if span.start < 0 or span.stop > total or span.start > span.stop:
                raise MmError(f"layout: text range {_range_text(span)} out of bounds")
            if span.start != consumed:
                raise MmError(f"layout: text range {_range_text(span)} does not resume at source index {consumed}")
            pieces.append(src[span.start : span.stop])
            out_len += span.stop - span.start
            consumed = span.stop
            continue
        item, pattern = segment.item, segment.pattern
        if item < 0 or item >= n_items:
            raise MmError(f"layout: media item {item} out of range")
        if spans[item] is not None:
            raise MmError(f"layout: media item {item} placed twice")
        if consumed >= total:
            raise MmError(f"layout: media item {item} has no source placeholder at index {consumed}")
        consumed += 1
        if isinstance(pattern, Repeat):
            if pattern.n <= 0:
                raise MmError(f"layout: media item {item} expands to zero tokens")
            spans[item] = ((out_len, out_len + pattern.n - 1),)
            pieces.append((pattern.id, pattern.n))
            out_len += pattern.n
        else:
            ids, content = pattern.ids, pattern.content
            if len(ids) == 0:
                raise MmError(f"layout: media item {item} expands to zero tokens")
            if not (0 <= content.start < content.stop <= len(ids)):
                raise MmError(
                    f"layout: media item {item} content range {_range_text(content)} outside its {len(ids)} token(s)"
                )
            spans[item] = tuple((out_len + r.start, out_len + r.stop - 1) for r in _checked_runs(item, pattern))
            pieces.append(np.asarray(ids, dtype=np.int64))
            out_len += len(ids)
    if consumed != total:
        raise MmError(f"layout: covers {consumed} of {total} source token(s)")
    for i, span in enumerate(spans):
        if span is None:
            raise MmError(f"layout: media item {i} not placed")
    out = np.empty(out_len, np.int64)
    pos = 0
    for piece in pieces:
        if isinstance(piece, tuple):
            token, n = piece
            out[pos : pos + n] = token
            pos += n
        else:
            out[pos : pos + len(piece)] = piece
            pos += len(piece)
    return out, spans  # type: ignore[return-value]  # every entry was checked above


def _checked_runs(item: int, pattern: Explicit) -> tuple[range, ...]:
    content, runs = pattern.content, pattern.runs or (pattern.content,)
    at = content.start
    for k, r in enumerate(runs):
        if r.step != 1 or r.start < at or r.stop <= r.start or (k == 0 and r.start != at):
            raise MmError(f"layout: media item {item} run {_range_text(r)} not in order inside {_range_text(content)}")
        at = r.stop
    if at != content.stop:
        raise MmError(f"layout: media item {item} runs end at {at}, not at its content's end {content.stop}")
    return runs


def layout_by_placeholder(ids: np.ndarray, placeholder_id: int, counts: Sequence[int]) -> TokenLayout:
    """Each placeholder token k becomes `counts[k]` copies of itself; text between is kept.

    The Qwen rule (and SGLang's `_expand_input_ids`): the prompt holds one `<|image_pad|>` per image.
    """
    where = np.flatnonzero(np.asarray(ids) == placeholder_id)
    if len(where) != len(counts):
        raise MmError(f"prompt has {len(where)} media placeholder(s) but {len(counts)} media item(s)")
    segments: list[Segment] = []
    start = 0
    for k, index in enumerate(where.tolist()):
        if index > start:
            segments.append(Text(range(start, index)))
        segments.append(Media(k, Repeat(placeholder_id, int(counts[k]))))
        start = index + 1
    if start < len(ids):
        segments.append(Text(range(start, len(ids))))
    return tuple(segments)
