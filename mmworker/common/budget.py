"""Request budgets: the named byte and item limits, and the byte budget shared by one request's sources."""

from mmworker.errors import MmError

# Items per request. Unchanged in every upstream version; checked before any source is resolved,
# so a 65-image request costs nothing but the check.
MAX_ITEMS_PER_REQUEST = 64

# Bytes per request, shared by all of its sources (post base64 decode / post download). 1.25 GiB is
# the newest upstream value (PR #37967): large enough for 64 full-size photos, small enough that a
# handful of concurrent hostile requests cannot exhaust a node. Older drivers used 256 MiB.
MAX_REQUEST_BYTES = 1280 << 20

# Bytes per remote or non-regular stream (HTTP body, /dev/zero, standalone fetch). 64 MiB is far
# above any real image yet bounds what one slow or hostile source can make us buffer.
MAX_FETCH_BYTES = 64 << 20

# Bytes per fetched video stream, used instead of MAX_FETCH_BYTES by callers that fetch a video (a
# keyword `cap` on fetch_bytes, read_bounded and http_get; a per-source "caps" in the I/O process's
# jobs). Equal to the decoder's own input limit (mmworker.common.video.MAX_VIDEO_BYTES is this
# constant): a bigger stream would be refused after the download anyway, so stop it while it arrives.
# Defined here, not in video.py, so that fetching never imports the optional PyAV extra.
MAX_VIDEO_FETCH_BYTES = 1 << 30

# Bounded reads claim this much from the budget before each read and give back what was not used:
# big enough that syscalls are cheap, small enough that an over-claim never matters.
CHUNK_BYTES = 256 << 10


def check_cap(cap: int) -> int:
    """`cap` when it can bound one stream (an int of bytes, 1 to 2**63 - 1); otherwise an MmError naming it.

    Zero is refused: it would pass nothing, and libcurl reads a zero MAXFILESIZE as "no limit". The top
    is libcurl's (a signed 64-bit curl_off_t); pycurl would raise OverflowError past it.
    """
    if isinstance(cap, bool) or not isinstance(cap, int) or not 0 < cap < 1 << 63:
        raise MmError(f"media fetch: the per-stream byte cap must be an int from 1 to 2**63 - 1, got {cap!r}")
    return cap


class ByteBudget:
    """Bytes one request may still pull in; every source of the request claims from the same object.

    Claims happen while data arrives (before each chunk is read or decoded), never after, so an
    oversized source is stopped at the first chunk past the limit. Single-owner and not thread-safe:
    one request is resolved by one thread of control.
    """

    __slots__ = ("_used", "limit")

    def __init__(self, limit: int = MAX_REQUEST_BYTES) -> None:
        if limit < 0:
            raise MmError(f"byte budget must be non-negative, got {limit}")
        self.limit = limit
        self._used = 0

    @property
    def used(self) -> int:
        return self._used

    @property
    def remaining(self) -> int:
        return self.limit - self._used

    def claim(self, nbytes: int) -> bool:
        """Reserve nbytes; False (and nothing reserved) when that would exceed the limit."""
        if nbytes < 0:
            raise MmError(f"byte budget: cannot claim a negative size ({nbytes})")
        if nbytes > self.limit - self._used:
            return False
        self._used += nbytes
        return True

    def release(self, nbytes: int) -> None:
        """Give back part of an earlier claim (the unread rest of a chunk, an unused estimate)."""
        if nbytes < 0 or nbytes > self._used:
            raise MmError(f"byte budget: cannot release {nbytes} of {self._used} claimed bytes")
        self._used -= nbytes

    def __repr__(self) -> str:
        return f"ByteBudget(used={self._used}, limit={self.limit})"
