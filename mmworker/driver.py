"""The request driver: one multimodal request through a family, in fixed steps, inline, all or nothing.

    process(family, MmInput(input_ids, images)) -> Output

Steps (docs/behaviour.md §2.2), single-threaded, no pools:
  1. at least one image source, at most MAX_ITEMS_PER_REQUEST;
  2. sources resolved in order (strings through fetch, bytes as they are), every byte charged to one
     ByteBudget shared by the whole request;
  3. per item, in order: content hash of the raw bytes -> decode -> family.process_item;
  4. prompt ids (after the images, so an image error wins over a missing prompt);
  5. family.layout -> apply_layout -> family.positions, then the hand-off checks the scheduler makes
     (`assemble`: also what a pool's client runs alone for a request whose images it all has cached).
Items computed before (`known`: a pool's cache hits) skip steps 2 and 3: the driver takes their
hash and geometry as given, and their sources are neither read nor charged to the budget.
Any error anywhere rejects the whole request with one MmError naming the cause (and the image, when
one image caused it); with inline processing that is always the lowest-index failure. A pool
worker's BudgetExceeded (not an MmError: mmworker.errors) gets its image named the same way.
"""

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mmworker.common.budget import MAX_ITEMS_PER_REQUEST, MAX_REQUEST_BYTES, ByteBudget
from mmworker.common.decode import with_image
from mmworker.common.fetch import fetch_bytes
from mmworker.common.hashing import content_hash
from mmworker.errors import BudgetExceeded, MmError
from mmworker.pipeline import Allocator, Family, Geometry, MRope, Positions, apply_layout, numpy_allocator

Source = str | bytes | bytearray | memoryview


@dataclass(frozen=True, eq=False)
class MmInput:
    """One request: prompt token ids (with one placeholder per image) and the image sources in order."""

    input_ids: Sequence[int] | np.ndarray
    images: Sequence[Source]


@dataclass(frozen=True, eq=False)
class ItemOutput:
    """One image's result: its feature tensor, named aux tensors, content hash and geometry."""

    feature: np.ndarray
    aux: dict[str, np.ndarray]
    hash: int
    geometry: Geometry


@dataclass(frozen=True)
class KnownItem:
    """An item computed before (a pool's cache hit): what the prompt's layout and positions need of it."""

    hash: int
    geometry: Geometry


@dataclass(frozen=True, eq=False)
class Output:
    """An accepted request: expanded ids (int64), items in prompt order, inclusive offsets, positions.

    An item given as known stays a KnownItem here: its feature is wherever it was computed."""

    input_ids: np.ndarray
    items: tuple[ItemOutput | KnownItem, ...]
    offsets: tuple[tuple[int, int], ...]
    positions: Positions


def resolve_sources(
    images: Sequence[Source], budget: ByteBudget, fetch: Callable = fetch_bytes, skip: Container[int] = ()
) -> list:
    """Raw bytes of every source, in order, each charged to `budget` (the request's shared budget);
    None in the places of `skip` (items known already: not read, not charged)."""
    resolved = []
    for index, source in enumerate(images):
        if index in skip:
            resolved.append(None)
        elif isinstance(source, str):
            try:
                resolved.append(fetch(source, budget))
            except MmError as exc:
                raise MmError(f"image {index}: {exc}") from exc
        elif isinstance(source, (bytes, bytearray, memoryview)):
            size = memoryview(source).nbytes
            if not budget.claim(size):
                raise MmError(f"multimodal request exceeds {budget.limit} total media bytes")
            resolved.append(source)
        else:
            raise MmError(f"image {index}: source must be a string or bytes, got {type(source).__name__}")
    return resolved


def process(
    family: Family,
    request: MmInput,
    *,
    alloc: Allocator = numpy_allocator,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    fetch: Callable = fetch_bytes,
    known: Mapping[int, KnownItem] | None = None,
    item_alloc: Callable[[int], Allocator] | None = None,
    hashes: Mapping[int, int] | None = None,
) -> Output:
    """Run one request through `family`; see the module docstring for the steps and the error rule.

    `alloc(shape, dtype)` supplies each feature buffer (shared memory in a pool worker), or
    `item_alloc(index)` the allocator for item `index` (a pool worker puts the features it caches
    elsewhere); on error, whatever they handed out belongs to the caller to reclaim. `known`: the
    items computed before, by index (their sources are placeholders, never read). `hashes`: content
    hashes computed already, by index (a pool's client hashed those bytes to key its cache).
    """
    images = request.images
    if not images:
        raise MmError("multimodal request without image sources")
    if len(images) > MAX_ITEMS_PER_REQUEST:
        raise MmError(f"multimodal request exceeds {MAX_ITEMS_PER_REQUEST} media items")
    known = known or {}
    raw = resolve_sources(images, ByteBudget(max_request_bytes), fetch, known)

    items: list[ItemOutput | KnownItem] = []
    for index, data in enumerate(raw):
        if data is None:
            items.append(known[index])
            continue
        item_allocator = alloc if item_alloc is None else item_alloc(index)
        try:
            digest = hashes[index] if hashes and index in hashes else content_hash(data)
            processed = with_image(data, lambda image: family.process_item(image, item_allocator))  # noqa: B023
        except MmError as exc:
            raise MmError(f"image {index}: {exc}") from exc
        except BudgetExceeded as exc:  # a pool worker's CPU budget ran out on this image
            raise BudgetExceeded(f"image {index}: {exc}") from exc
        items.append(ItemOutput(processed.feature, processed.aux, digest, processed.geometry))

    expanded, offsets, positions = assemble(family, request.input_ids, [item.geometry for item in items])
    return Output(input_ids=expanded, items=tuple(items), offsets=tuple(offsets), positions=positions)


def assemble(
    family: Family, input_ids: Sequence[int] | np.ndarray | None, geometries: Sequence[Geometry]
) -> tuple[np.ndarray, list[tuple[int, int]], Positions]:
    """Steps 4 and 5: the prompt's expanded ids (int64), each item's inclusive offsets and the
    positions, from the items' geometries alone; MmError if the prompt is missing or does not
    place them."""
    if input_ids is None or len(input_ids) == 0:
        raise MmError("multimodal request without text or input_ids")
    ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
    layout = family.layout(ids, geometries)
    expanded, offsets = apply_layout(ids, layout, len(geometries))
    positions = family.positions(len(expanded), offsets, geometries)
    _check_hand_off(expanded, offsets, positions)
    return expanded, offsets, positions


def _check_hand_off(ids: np.ndarray, offsets: Sequence[tuple[int, int]], positions: Positions) -> None:
    # The checks SGLang's server makes before handing a result to the scheduler (docs/behaviour.md §2.2, step 7):
    # a family bug must surface as a rejected request here, never as a crash in the scheduler.
    n = len(ids)
    for i, (start, end) in enumerate(offsets):
        if not 0 <= start <= end < n:
            raise MmError(f"hand-off: item {i} offsets ({start}, {end}) outside {n} token(s)")
    if isinstance(positions, MRope) and positions.positions.shape != (3, n):
        raise MmError(f"hand-off: M-RoPE positions shape {positions.positions.shape} != (3, {n})")
