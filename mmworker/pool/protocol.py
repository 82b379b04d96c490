"""What the pool's processes agree on beyond the ipc schema: identities, source kinds, which sources need I/O."""

from mmworker.common.fetch import LOCAL_PREFIXES, REMOTE_PREFIXES

IO_IDENTITY = b"io"  # the I/O process's channel identity; workers are b"w<index>.<incarnation>"
REQUEST_RING = -1  # the ring id of the client's request ring (worker rings are numbered 0, 1, ...)
CACHE_HEAPS = 1 << 16  # worker k's cache partition (a heap) has ring id CACHE_HEAPS + k


def cache_heap(worker: int) -> int:
    """The ring id of worker `worker`'s cache partition, in TensorDescs and Releases."""
    return CACHE_HEAPS + worker


# Job.args["kinds"]: one letter per source frame after the input_ids frame (the images, then the videos).
KIND_BYTES = "b"  # raw encoded bytes (as submitted, or as the I/O process fetched them)
KIND_STRING = "s"  # a data: URL or base64 string, decoded on the worker (pure CPU)
# Job.args["videos"]: how many of the trailing source frames are videos (absent: 0, an image-only job).
# Job.args["known"]: [[item, t, h, w, hash], ...], images the client has cached (their frames are empty);
# Job.args["cache"]: [item, ...], images whose features go into the worker's cache partition if they fit.
# Job.args["hashes"]: [[item, hash], ...], content hashes the client computed already (keying the cache).
# Videos are never cached: "known" and "cache" name images only.
ARG_VIDEOS, ARG_KNOWN, ARG_CACHE, ARG_HASHES = "videos", "known", "cache", "hashes"


_IO_PREFIXES = REMOTE_PREFIXES + LOCAL_PREFIXES


def needs_io(source: object) -> bool:
    """Sources the I/O process resolves: http(s) URLs and files; data: and base64 stay on CPU workers."""
    return isinstance(source, str) and source.startswith(_IO_PREFIXES)
