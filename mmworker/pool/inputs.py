"""A request's inputs on the client: checked and converted at submit, then staged where its worker
reads them (in place, or copied into shared memory), and freed once its answer is in."""

import logging
import os
import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ipc.errors import AllocationTooLarge
from ipc.peer_memory import places_of
from ipc.ring import ALIGN, Allocation, RingWriter
from ipc.segment import Segment
from mmworker.common.budget import MAX_FETCH_BYTES, MAX_ITEMS_PER_REQUEST, MAX_REQUEST_BYTES, MAX_VIDEO_FETCH_BYTES
from mmworker.common.inline import decoded_size_estimate
from mmworker.driver import item_name
from mmworker.errors import MmError, UsageError
from mmworker.pool.protocol import KIND_BYTES, KIND_STRING, REQUEST_RING, needs_io

if TYPE_CHECKING:
    from mmworker.pool.resources import PoolResources

log = logging.getLogger("mmworker.pool")

# What holds a staged job's inputs until its answer: the exports that keep them in place, the
# request-ring allocation they were copied into, or nothing (a one-off segment, owned by its fd).
Held = Allocation | list[bytes | np.ndarray] | None


class RequestInputs:
    """One request's inputs as its worker will get them: `ids` (int64, a copy of its own) and one
    frame per item, the images then the `videos` last ones (bytes as given, text UTF-8 encoded, later
    the fetched bytes of URLs and files)."""

    __slots__ = ("content_hashes", "frames", "ids", "kinds", "mm_hashes", "raw_bytes", "sources", "videos")

    def __init__(self, ids: bytes | np.ndarray, sources: list, frames: list, kinds: list[str], raw_bytes: int,
                 mm_hashes: list[str] | None, content_hashes: list[str | None] | None = None,
                 videos: int = 0) -> None:  # fmt: skip
        self.ids, self.sources, self.frames, self.kinds = ids, sources, frames, kinds
        self.raw_bytes = raw_bytes  # bytes given directly (they count against the request's byte budget)
        self.mm_hashes = mm_hashes
        self.content_hashes = content_hashes  # the caller's, one per image (None: none for that one)
        self.videos = videos  # how many of the sources, the last ones, are videos

    @property
    def images(self) -> int:
        """How many of the sources, the first ones, are images."""
        return len(self.sources) - self.videos

    def io_job(self) -> dict[str, Any] | None:
        """The I/O process's job arguments for the sources it resolves; None if there are none. Each
        source's stream is capped as the inline driver caps it: a video's at MAX_VIDEO_FETCH_BYTES,
        an image's at MAX_FETCH_BYTES."""
        indices = [i for i, source in enumerate(self.sources) if needs_io(source)]
        if not indices:
            return None
        images = self.images
        caps = [MAX_FETCH_BYTES if i < images else MAX_VIDEO_FETCH_BYTES for i in indices]
        return {"sources": [self.sources[i] for i in indices], "indices": indices,
                "budget": MAX_REQUEST_BYTES - self.raw_bytes, "caps": caps, "images": images}  # fmt: skip

    def fetched(self, payload: Iterable) -> None:
        """Put the I/O process's bytes (one per source it resolved, in order) in those sources' places."""
        fetched = iter(payload)
        for i, source in enumerate(self.sources):
            if needs_io(source):
                self.frames[i], self.kinds[i] = next(fetched), KIND_BYTES


def hashes_of(hashes: Any, name: str = "mm_hashes") -> list[str] | None:
    """`mm_hashes` (or `content_hashes`) as a list of its own, or None; UsageError unless it is None
    or a list (or another sequence) of hash strings. Its entries are content (a malformed one is
    ignored, see `override_hashes`); the argument's type is the caller's."""
    if hashes is None:
        return None
    if isinstance(hashes, (str, bytes, bytearray, memoryview)) or not isinstance(hashes, Sequence):
        raise UsageError(f"{name} must be a list of hex strings or None, got {type(hashes).__name__}")
    return list(hashes)


def check_inputs(
    input_ids: Any, images: Any, mm_hashes: list[str] | None, content_hashes: list | None = None, videos: Any = ()
) -> RequestInputs:
    """Convert and check what is cheap to check here (the worker checks everything else); MmError
    names what is wrong ("image k", "video k"). `mm_hashes` and `content_hashes` as `hashes_of`
    returned them; content hashes (one per image: videos are never keyed) whose count is not the
    images' are ignored (with a warning), as mm_hashes are."""
    ids = _ids_of(input_ids)
    for name, sources in (("images", images), ("videos", videos)):
        if isinstance(sources, (str, bytes, bytearray, memoryview)) or not isinstance(sources, Sequence):
            raise MmError(f"{name} must be a list of sources")
    n_images = len(images)
    if n_images + len(videos) > MAX_ITEMS_PER_REQUEST:  # before anything is fetched
        raise MmError(f"multimodal request exceeds {MAX_ITEMS_PER_REQUEST} media items")
    total = raw = 0
    frames, kinds = [], []  # built once here, not at every dispatch attempt
    sources = [*images, *videos]
    for i, source in enumerate(sources):
        if isinstance(source, str):
            total += 0 if needs_io(source) else decoded_size_estimate(source)
            try:
                frames.append(source.encode())
            except UnicodeEncodeError as exc:
                raise MmError(f"{item_name(i, n_images)}: source text is not valid Unicode ({exc.reason} at "
                              f"position {exc.start})") from None  # fmt: skip
            kinds.append(KIND_STRING)
        elif isinstance(source, (bytes, bytearray, memoryview)):
            view = memoryview(source)
            if not view.c_contiguous:
                raise MmError(f"{item_name(i, n_images)}: a memoryview source must be C-contiguous")
            raw += view.nbytes
            frames.append(source)
            kinds.append(KIND_BYTES)
        else:
            raise MmError(f"{item_name(i, n_images)}: source must be a string or bytes, got {type(source).__name__}")
    total += raw
    if total > MAX_REQUEST_BYTES:
        raise MmError(f"multimodal request exceeds {MAX_REQUEST_BYTES} total media bytes")
    if content_hashes is not None and len(content_hashes) != n_images:
        log.warning("%d content hashes for %d images; ignoring them", len(content_hashes), n_images)
        content_hashes = None
    return RequestInputs(ids, sources, frames, kinds, raw, mm_hashes, content_hashes, len(videos))


def _ids_of(input_ids: Any) -> bytes | np.ndarray:
    """`input_ids` as int64 in a copy of their own (contiguous, kept unchanged): bytes for a flat
    list of ints (array's conversion and a bytes object cost less CPU than numpy's conversion and
    array, most with the client's caches cold), else a numpy array, as numpy converts."""
    if type(input_ids) is list and sys.byteorder == "little":  # the worker reads them as "<i8"
        try:
            return array("q", input_ids).tobytes()
        except (TypeError, OverflowError):
            pass  # not all ints of int64's range: numpy's conversion rules, and its error, below
    try:
        return np.array(input_ids, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MmError(f"input_ids must be integers: {exc}") from None


class InputStaging:
    """Puts a job's inputs where its worker reads them, and takes them back.

    It copies into the pool's request ring, which it asks its owner for at each use rather than
    keeping a reference that would pin the ring's mapping past the owner's teardown.
    """

    def __init__(self, resources: "PoolResources") -> None:
        self._resources = resources

    def stage(self, in_place: bool, frames: tuple) -> tuple[Held, int | None, list[tuple[int, int]]]:
        """In place (`in_place`: the worker reads this process's memory), where they are: nothing is
        copied, and the exports returned keep them there. Else copied, each 64-byte aligned as a
        reader's view must be, into one allocation of the request ring, or, when the ring has no room
        now, into a one-off nameless segment of their own, whose descriptor goes with the Job (the
        caller closes it once sent) and whose memory ends with the worker's mapping of it.

        Returns (what holds them, the descriptor or None, each input's (address or offset, nbytes)).
        IpcError if not even a one-off segment can be had.
        """
        if in_place:
            exports, places = places_of(frames)
            return exports, None, places
        spans = [-(-memoryview(frame).nbytes // ALIGN) * ALIGN for frame in frames]
        size = max(ALIGN, sum(spans))
        ring = self._resources.requests
        try:
            allocation = ring.try_allocate(size)
        except AllocationTooLarge:
            allocation = None
        if allocation is not None:
            return allocation, None, _copy_inputs(ring, allocation, frames, spans)
        segment, fd = Segment.anonymous("inputs", size)
        try:
            one_off = RingWriter(segment, REQUEST_RING)
            places = _copy_inputs(one_off, one_off.try_allocate(size), frames, spans)
            del one_off  # its views of the segment, so that the close below unmaps it at once
        except BaseException:
            os.close(fd)
            raise
        finally:
            segment.close()  # the descriptor keeps the memory
        return None, fd, places

    def free(self, held: Held) -> None:
        """Let go of a job's inputs (what `stage` returned): an allocation goes back to the ring."""
        if isinstance(held, Allocation):
            self._resources.requests.release(held.offset, held.seq)

    def used_bytes(self) -> int:
        """The request ring's space held by inputs copied for running jobs (0 once the pool is closed)."""
        ring = self._resources.requests
        return ring.stats().used if ring is not None else 0


def _copy_inputs(ring: RingWriter, allocation: Allocation, frames: tuple, spans: list[int]) -> list[tuple[int, int]]:
    """Write `frames` one after another (each `spans` bytes apart) into `allocation`: their (offset, nbytes)."""
    places, at = [], 0
    for frame, span in zip(frames, spans, strict=True):
        places.append((allocation.offset + at, ring.write(allocation, at, frame)))
        at += span
    return places


def override_hashes(hashes: list[int], overrides: list[str] | None, request_id: Any) -> list[int]:
    """SGLang's `mm_hashes` rule: one hex string per item (images and videos; any width, optional 0x,
    low 64 bits kept); a malformed entry keeps the computed hash; a count mismatch ignores them all;
    never a rejection."""
    if overrides is None:
        return hashes
    if len(overrides) != len(hashes):
        log.warning("request %r: %d mm_hashes for %d items; ignoring them", request_id, len(overrides), len(hashes))
        return hashes
    out = []
    for computed, text in zip(hashes, overrides, strict=True):
        try:
            out.append(int(str(text).removeprefix("0x").removeprefix("0X"), 16) & 0xFFFF_FFFF_FFFF_FFFF)
        except ValueError:
            out.append(computed)
    return out
