"""The qwen_vl family: Qwen2-VL, 2.5-VL, 3-VL and 3.5 image preprocessing described as data.

An image is resized in one of three ways, each giving the bytes of its HF processor's resize:
- streamed: a large colour JPEG is resized horizontally band by band as it decodes, and the
  patchify applies the vertical pass as rows arrive (no whole image ever exists);
- whole, horizontal first: decoded whole, its horizontal pass in place, the vertical pass in the
  patchify (mmworker.qwen_vl.patchify);
- whole, vertical first: the `pil` mode reproducing a stock Pillow that runs the vertical pass
  first for this size (spec `pillow`; mmworker.common.pillow.vertical_first: Pillow 12.2-12.3 on
  images over 100 times taller than wide, Pillow 13 whenever the height shrinks by more than twice
  as many pixels as the width). Decoded whole (such a JPEG is not streamed, however large), its
  vertical pass, then its horizontal pass, then the patchify with the identity vertical pass.
Each writes the feature in the spec's `feature_dtype` (float32, or bf16 bits in uint16), in the
patchify's stores: no way computes a float32 copy first.

Videos (mmworker.qwen_vl.video) need the spec's `model_type` (and what that model type needs:
qwen_vl.spec): then `process_video` gives `pixel_values_videos` as the feature, and a prompt with
videos is laid out and positioned as SGLang's path does (mmworker.qwen_vl.video_layout).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmworker.common.jpeg_rows import JpegRows
from mmworker.common.pillow import vertical_first
from mmworker.common.pixels import RgbImage
from mmworker.common.resize import horizontal_resize, horizontal_rows, vertical_coefficients, vertical_resize
from mmworker.common.video import video_decoding_available
from mmworker.errors import MmError
from mmworker.pipeline import (
    Allocator,
    Capabilities,
    Geometry,
    Grid,
    MRope,
    ProcessedItem,
    TokenLayout,
    VideoGrid,
    layout_by_placeholder,
    numpy_allocator,
)
from mmworker.qwen_vl.mrope import SPLIT_VIDEO_MODEL_TYPES, TIMED_MODEL_TYPES, mrope_image_only
from mmworker.qwen_vl.patchify import PatchifyRows, normalisation, patchify_into
from mmworker.qwen_vl.sizing import smart_resize
from mmworker.qwen_vl.spec import QwenSpec
from mmworker.qwen_vl.video import model_kind, preprocess_video
from mmworker.qwen_vl.video_layout import VideoItem, VideoPromptRules, prompt_layout, prompt_positions

# spec.resample -> the resampler whose output equals that HF processor's resize.
_RESAMPLER = {"aten_u8": "aten_u8", "pil": "pil_bicubic"}


class QwenVL:
    """smart_resize -> bicubic resize -> normalise -> patchify; placeholder layout; image M-RoPE."""

    name = "qwen_vl"
    modality = "IMAGE"

    def __init__(self, spec: QwenSpec) -> None:
        self.spec = spec
        self._norm = normalisation(spec.image_mean, spec.image_std, spec.resample)
        # The video rules, or why this spec serves no videos; a spec whose video keys are wrong (an
        # unknown model type, a malformed table) is refused here, not at its first video.
        self._video_rules: VideoPromptRules | None = None
        self.video_problem: str | None = _video_problem(spec)
        if self.video_problem is None:
            self._video_rules = VideoPromptRules.from_spec(spec)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> "QwenVL":
        return cls(QwenSpec.from_mapping(spec))

    def __repr__(self) -> str:
        return f"QwenVL({self.spec})"

    def describe(self) -> str:
        spec = self.spec
        resize = {"aten_u8": "torchvision's uint8 BICUBIC (Qwen2VLImageProcessor)",
                  "pil": f"stock Pillow {spec.pillow}'s BICUBIC (Qwen2VLImageProcessorPil)"}[spec.resample]  # fmt: skip
        return (f"qwen_vl: patch {spec.patch_size}, merge {spec.merge_size}, "
                f"{spec.min_pixels}..{spec.max_pixels} pixels, resize {resize}, "
                f"{spec.feature_dtype} features")  # fmt: skip

    def image_prompt(self) -> tuple[int, ...]:
        spec = self.spec
        wrappers = (spec.vision_start_token_id, spec.image_token_id, spec.vision_end_token_id)
        return tuple(token for token in wrappers if token is not None)

    def video_prompt(self) -> tuple[int, ...]:
        if self._video_rules is None:  # a video's tokens are known only to a spec that serves videos
            raise MmError(f"qwen_vl: this spec serves no videos: {self.video_problem}")
        rules = self._video_rules
        return rules.vision_start_token_id, rules.video_token_id, rules.vision_end_token_id

    def token_ids(self) -> dict[str, int]:
        spec = self.spec
        named = {"im_token_id": spec.image_token_id, "im_start_id": spec.vision_start_token_id,
                 "im_end_id": spec.vision_end_token_id, "video_token_id": spec.video_token_id}  # fmt: skip
        return {key: token for key, token in named.items() if token is not None}

    def warm_up_images(self) -> tuple[tuple[int, int, str], ...]:
        # A PNG, and a JPEG whose width narrows under every bundled spec: 1124 is 4 past a
        # multiple of 28 and of 32, the case mmworker.common.aten_horizontal's narrowing kernel takes.
        return (64, 48, "PNG"), (1124, 224, "JPEG")

    def model_data(self, aux: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "video_grid_thw" in aux:
            data = {"video_grid_thw": aux["video_grid_thw"].reshape(1, 3)}
            if "second_per_grid_ts" in aux:
                data["second_per_grid_ts"] = aux["second_per_grid_ts"].reshape(1)
            return data
        return {"image_grid_thw": aux["image_grid_thw"].reshape(1, 3)}

    def capabilities(self) -> Capabilities:
        return Capabilities(video=self._video_rules is not None, note=self.video_problem or "")

    def grid_for(self, height: int, width: int) -> tuple[int, int, int]:
        """(t, gh, gw) of an image of this size, or MmError if it cannot be processed."""
        spec = self.spec
        th, tw = smart_resize(height, width, spec.factor, spec.min_pixels, spec.max_pixels)
        # smart_resize returns positive multiples of factor = patch_size * merge_size (or raises), so
        # the grid is never empty and always whole merge blocks.
        return 1, th // spec.patch_size, tw // spec.patch_size

    def feature_shape(self, grid: tuple[int, int, int]) -> tuple[int, int]:
        t, gh, gw = grid
        return t * gh * gw, self.spec.feature_dim

    def process_item(self, image: RgbImage | JpegRows, alloc: Allocator = numpy_allocator) -> ProcessedItem:
        spec = self.spec
        grid = self.grid_for(image.height, image.width)
        th, tw = grid[1] * spec.patch_size, grid[2] * spec.patch_size
        resampler = _RESAMPLER[spec.resample]
        shape = self.feature_shape(grid)
        patch = (spec.patch_size, spec.merge_size, spec.temporal_patch_size)
        if spec.resample == "pil" and vertical_first(spec.pillow, image.width, image.height, tw, th):
            # This Pillow resizes vertically first (module docstring): both passes here, the
            # patchify's vertical pass the identity.
            decoded = image.load() if isinstance(image, JpegRows) else image
            shrunk = vertical_resize(decoded, th, resampler, consume=True)
            resized = horizontal_resize(shrunk, tw, resampler, consume=True)
            feature = alloc(shape, spec.feature_storage)
            patchify_into(resized.pixels, vertical_coefficients(th, th, resampler), self._norm, *patch, feature)
            return self._item(feature, grid)
        # The resize's vertical pass runs inside the patchify (see its module), on the rows of the
        # horizontal one.
        vertical = vertical_coefficients(image.height, th, resampler)
        if isinstance(image, JpegRows) and image.height * image.width * 2 > shape[0] * shape[1]:
            # Decoded pixels (4 bytes each) outweighing half the feature would set the item's
            # peak memory: rows are resized and patchified as they are decoded, and no whole
            # image ever exists (a 12 MP photo's peak falls to about 1.3x its feature). The feature is lent to the
            # decode, which may hold a 4:2:0 file's planes in what the patchify has not yet written. A bf16
            # feature is half as large, and a 12 MP photo's planes do not fit in it at the default budget: its
            # decode then streams through Pillow's ring of rows (mmworker.common.jpeg_rows), the slower way.
            feature = alloc(shape, spec.feature_storage)
            rows = PatchifyRows(vertical, self._norm, *patch, (image.height, tw), feature)
            horizontal_rows(image, tw, resampler, rows.overlap, rows, rows.lent())
            rows.finish()
        else:
            # Smaller: decoded whole, which is faster (one band, no ring of rows to manage),
            # and resized in place, so that the feature allocated after it can reuse the memory.
            decoded = image.load() if isinstance(image, JpegRows) else image
            resized = horizontal_resize(decoded, tw, resampler, consume=True)
            feature = alloc(shape, spec.feature_storage)
            patchify_into(resized.pixels, vertical, self._norm, *patch, feature)
        return self._item(feature, grid)

    @staticmethod
    def _item(feature: np.ndarray, grid: tuple[int, int, int]) -> ProcessedItem:
        return ProcessedItem(
            feature=feature,
            aux={"image_grid_thw": np.array(grid, np.int64)},
            geometry=Grid(*grid),
        )

    def process_video(self, data: bytes | memoryview, alloc: Allocator = numpy_allocator) -> ProcessedItem:
        """pixel_values_videos of one encoded video, as SGLang's Qwen path computes them."""
        if self._video_rules is None:
            raise MmError(f"qwen_vl: this spec serves no videos: {self.video_problem}")
        spec = self.spec
        video = preprocess_video(data, spec, self._video_rules.model_type, alloc)
        grid = video.video_grid_thw
        aux = {"video_grid_thw": grid}
        second = None
        if video.second_per_grid_ts is not None:
            aux["second_per_grid_ts"] = np.array([video.second_per_grid_ts], np.float32)
            second = float(video.second_per_grid_ts)
        geometry = VideoGrid(int(grid[0]), int(grid[1]), int(grid[2]), second, video.timestamps)
        return ProcessedItem(feature=video.pixel_values_videos, aux=aux, geometry=geometry)

    def tokens(self, geometry: Grid) -> int:
        """Placeholder tokens one image expands to: t * gh * gw / merge^2."""
        return geometry.t * geometry.h * geometry.w // (self.spec.merge_size**2)

    def layout(self, input_ids: np.ndarray, geometries: Sequence[Geometry]) -> TokenLayout:
        images, videos = _split(geometries)
        if not videos:
            counts = [t * h * w // self.spec.merge_size**2 for t, h, w in images]
            return layout_by_placeholder(input_ids, self.spec.image_token_id, counts)
        return prompt_layout(input_ids, images, videos, self._rules_for_videos())

    def positions(
        self, input_ids: np.ndarray, offsets: Sequence[tuple[int, int]], geometries: Sequence[Geometry]
    ) -> MRope:
        images, videos = _split(geometries)
        if not videos:
            items = [(s, e, grid) for (s, e), grid in zip(offsets, images, strict=True)]
            positions, delta = mrope_image_only(len(input_ids), items, self.spec.merge_size)
        else:
            image_offsets = offsets[: len(images)]
            positions, delta = prompt_positions(input_ids, image_offsets, images, videos, self._rules_for_videos())
        return MRope(positions=positions, delta=delta)

    def _rules_for_videos(self) -> VideoPromptRules:
        if self._video_rules is None:
            raise MmError(f"qwen_vl: this spec serves no videos: {self.video_problem}")
        return self._video_rules


def _split(geometries: Sequence[Geometry]) -> tuple[list[tuple[int, int, int]], list[VideoItem]]:
    """The grids of the images and the VideoItems of the videos (images come first: mmworker.pipeline)."""
    images, videos = [], []
    for g in geometries:
        if isinstance(g, VideoGrid):
            videos.append(VideoItem((g.t, g.h, g.w), g.second_per_grid, g.timestamps))
        elif videos:
            raise MmError("qwen_vl: an image item after a video item (images come first)")
        else:
            images.append((g.t, g.h, g.w))
    return images, videos


def _video_problem(spec: QwenSpec) -> str | None:
    """Why this spec cannot serve videos, or None; MmError for an unknown model type."""
    if spec.model_type is None:
        return 'the spec names no `model_type` (SGLang\'s hf_config.model_type, e.g. "qwen2_5_vl")'
    model_kind(spec.model_type)  # refuses an unknown one
    if not video_decoding_available():
        return "videos need PyAV, the `video` extra: pip install 'mmworker[video]'"
    missing = [name for name in ("vision_start_token_id", "vision_end_token_id", "video_token_id")
               if getattr(spec, name) is None]  # fmt: skip
    if missing:
        return f"the spec has no {', '.join(missing)}"
    if spec.model_type in SPLIT_VIDEO_MODEL_TYPES and spec.timestamp_table is None:
        return (f"{spec.model_type} needs the spec's `timestamp_table` (the ids of its timestamp text's pieces, "
                "mmworker.qwen_vl.video_layout.timestamp_token_table(tokenizer.encode))")  # fmt: skip
    if spec.model_type in TIMED_MODEL_TYPES and spec.tokens_per_second is None:
        return f"{spec.model_type} needs the spec's `tokens_per_second` (its vision config's; 2 in the released ones)"
    return None
