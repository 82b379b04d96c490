"""A model family defined outside mmworker, as a new family's author would write one: the whole of it.

Not a model anyone serves: each image becomes its per-channel mean colour (one float32 row) and its
size, and stands in the prompt as `<start> <tok> <tok> <end>` with only the two `<tok>`s its span
(an Explicit pattern, unlike Qwen's and Inkling's Repeat). Positions are plain 1-D. It imports
only what a family may import: mmworker.common, mmworker.pipeline and mmworker.errors.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmworker.common.jpeg_rows import JpegRows
from mmworker.common.pixels import RgbImage
from mmworker.errors import MmError
from mmworker.pipeline import (
    Allocator,
    Capabilities,
    Explicit,
    Grid,
    Media,
    ProcessedItem,
    Rope1D,
    Text,
    TokenLayout,
    numpy_allocator,
)


class Toy:
    name = "toy"
    modality = "IMAGE"

    def __init__(self, start: int, token: int, end: int) -> None:
        self.start, self.token, self.end = start, token, end

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> "Toy":
        try:
            return cls(int(spec["start_id"]), int(spec["token_id"]), int(spec["end_id"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise MmError(f"toy spec: {exc!r}") from None

    def describe(self) -> str:
        return "toy: mean colour per image"

    def image_prompt(self) -> tuple[int, ...]:
        return (self.token,)

    def token_ids(self) -> dict[str, int]:
        return {"im_token_id": self.token, "im_start_id": self.start, "im_end_id": self.end}

    def warm_up_images(self) -> tuple[tuple[int, int, str], ...]:
        return ((16, 16, "PNG"),)

    def model_data(self, aux: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"image_size": aux["size"]}

    def capabilities(self) -> Capabilities:
        return Capabilities()

    def process_item(self, image: RgbImage | JpegRows, alloc: Allocator = numpy_allocator) -> ProcessedItem:
        decoded = image.load() if isinstance(image, JpegRows) else image
        feature = alloc((1, 3), np.dtype(np.float32))
        feature[0] = decoded.pixels.reshape(-1, 3).mean(axis=0, dtype=np.float64)
        size = np.array([decoded.height, decoded.width], np.int64)
        return ProcessedItem(feature=feature, aux={"size": size}, geometry=Grid(1, 1, 1))

    def layout(self, input_ids: np.ndarray, geometries: Sequence[Grid]) -> TokenLayout:
        where = np.flatnonzero(input_ids == self.token).tolist()
        if len(where) != len(geometries):
            raise MmError(f"prompt has {len(where)} media placeholder(s) but {len(geometries)} media item(s)")
        segments, start = [], 0
        for item, index in enumerate(where):
            segments.append(Text(range(start, index)))
            ids = (self.start, self.token, self.token, self.end)
            segments.append(Media(item, Explicit(ids, range(1, 3))))
            start = index + 1
        segments.append(Text(range(start, len(input_ids))))
        return tuple(segments)

    def positions(
        self, input_ids: np.ndarray, offsets: Sequence[tuple[int, int]], geometries: Sequence[Grid]
    ) -> Rope1D:
        return Rope1D()
