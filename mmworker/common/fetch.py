"""Media fetch: resolve one string source (URL, path, data: URL, base64) to raw bytes within a byte budget.

Precedence, tested in this order on the string exactly as sglang-mm does (docs/behaviour.md §3.1):

    http:// or https://   → bounded HTTP GET (mmworker.common.http)
    file://               → prefix stripped, bounded read of the rest as a path
    starts with "/"       → bounded read of the absolute path
    data:                 → base64 of everything after the first comma (mmworker.common.inline)
    anything else         → bare base64, trimmed

Relative paths therefore fall through to base64 and fail, as upstream; so does bare base64 that
starts with "/" (every JPEG's, "/9j/..."), which is taken for a path. Every byte a source yields is
claimed from the caller's ByteBudget while it arrives; a source that fails gives its claims back.
An HTTP body or file read is also capped per stream: MAX_FETCH_BYTES, or the caller's `cap` (a video's
stream is allowed MAX_VIDEO_FETCH_BYTES).
"""

import errno
import io
import os
import stat

from mmworker.common.budget import CHUNK_BYTES, MAX_FETCH_BYTES, ByteBudget, check_cap
from mmworker.common.http import http_get, timeout_from_env
from mmworker.common.inline import base64_decode, data_url_payload, decode_base64_payload
from mmworker.common.policy import MediaPolicy
from mmworker.errors import MmError

__all__ = ["base64_decode", "fetch_bytes", "read_bounded"]

# O_NONBLOCK: opening a FIFO for reading blocks until a writer appears, so without it a named pipe
# would hang the fetch before fstat could reject it. It has no effect on regular files; a character
# device that would block (a tty) fails with EAGAIN instead of stalling the request.
# How a source says where its bytes are; anything else is a data: URL or bare base64 (inline, pure CPU).
REMOTE_PREFIXES = ("http://", "https://")
LOCAL_PREFIXES = ("file://", "/")
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def fetch_bytes(
    source: str,
    budget: ByteBudget | None = None,
    *,
    timeout: float | None = None,
    policy: MediaPolicy | None = None,
    cap: int = MAX_FETCH_BYTES,
) -> bytes:
    """Resolve `source` to raw bytes, charging them to `budget`.

    budget=None uses a fresh budget of `cap` bytes (64 MiB by default, the standalone binding's); the
    driver passes the request's shared budget. `cap` bounds one HTTP body or file read ("exceeds
    {cap} bytes"); a caller fetching a video passes MAX_VIDEO_FETCH_BYTES. Inline sources (data: URL,
    base64) are bounded by the budget alone, as upstream. `timeout` (seconds) applies to HTTP only and
    defaults to ``REQUEST_TIMEOUT`` (3 s). `policy` (None: sglang-mm's permissive behaviour) restricts
    URLs and local files (mmworker.common.policy). Every failure is an MmError whose text is sglang-mm's.
    """
    check_cap(cap)
    if budget is None:
        budget = ByteBudget(cap)
    if source.startswith(REMOTE_PREFIXES):
        return http_get(source, budget, timeout_from_env() if timeout is None else timeout, policy, cap=cap)
    if source.startswith(LOCAL_PREFIXES):
        path = source.removeprefix("file://")
        if policy is not None:
            resolved = policy.check_path(path)
            return read_bounded(resolved, budget, what=path, nofollow=True, cap=cap)
        return read_bounded(path, budget, cap=cap)
    if source.startswith("data:"):
        return decode_base64_payload(data_url_payload(source), budget)
    return decode_base64_payload(source, budget)


def read_bounded(
    path: str, budget: ByteBudget, *, what: str | None = None, nofollow: bool = False, cap: int = MAX_FETCH_BYTES
) -> bytes:
    """Read the file at `path`: at most `cap` bytes, each chunk claimed from `budget` before the read.

    Regular files and character devices are read (``/dev/zero`` runs into the cap after `cap` + 1
    bytes). FIFOs and block devices are refused with "not a regular file", directories with EISDIR,
    and a Unix socket already fails to open (ENXIO), so nothing here can block or read without end.
    The fd is closed on every path. `what` names the file in messages (default: `path`); `nofollow`
    is for an already resolved path: a symlink swapped in at its end is then not followed.
    """
    check_cap(cap)
    shown = path if what is None else what
    if "\0" in path:  # Rust's wording; os.open would say "embedded null byte"
        raise MmError(f"media fetch: {shown}: file name contained an unexpected NUL byte")
    try:
        fd = os.open(path, _OPEN_FLAGS | (os.O_NOFOLLOW if nofollow else 0))
    except OSError as e:
        raise MmError(f"media fetch: {shown}: {_os_error_text(e)}") from e
    except ValueError as e:  # a path the filesystem encoding cannot represent (lone surrogates)
        raise MmError(f"media fetch: {shown}: {e}") from e
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            # open(2) accepts a directory; Rust's read then fails with EISDIR, so report just that.
            raise MmError(f"media fetch: {shown}: {os.strerror(errno.EISDIR)} (os error {errno.EISDIR})")
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
            raise MmError(f"media fetch: {shown}: not a regular file")
        return _read_fd(fd, shown, budget, cap=cap)
    finally:
        os.close(fd)


def _read_fd(fd: int, what: str, budget: ByteBudget, *, cap: int = MAX_FETCH_BYTES) -> bytes:
    """The bounded read loop: claim a chunk, read into it, give back what the read did not use.

    Reads at most `cap` + 1 bytes, the extra byte telling "exactly `cap`" from "more".
    When the budget cannot cover a whole chunk, only what remains is claimed, and once nothing
    remains a one-byte probe (never kept) decides between a clean EOF and an overrun; a file that
    fits the budget exactly is therefore accepted. On error every claim of this source is returned.
    """
    buf = io.BytesIO()  # getvalue() hands the buffer over without a copy (see http._BodySink)
    total = 0
    try:
        while True:
            want = min(CHUNK_BYTES, cap + 1 - total)
            grant = min(want, budget.remaining)
            if grant == 0:
                if _read(fd, 1, what):
                    # Past both limits at once (a budget of `cap` bytes, as in the standalone binding,
                    # meets the cap at the same byte): the per-stream cap is the more specific message.
                    if total + 1 > cap:
                        raise MmError(f"media fetch: {what}: exceeds {cap} bytes")
                    raise MmError(f"media fetch: {what}: exceeds the request media byte budget")
                break
            budget.claim(grant)  # cannot fail: grant <= remaining
            try:
                data = _read(fd, grant, what)
            except BaseException:
                budget.release(grant)
                raise
            budget.release(grant - len(data))  # short read or EOF: the unread rest goes back
            if not data:
                break
            total += len(data)
            if total > cap:
                raise MmError(f"media fetch: {what}: exceeds {cap} bytes")
            buf.write(data)
    except BaseException:
        budget.release(total)
        raise
    return buf.getvalue()


def _read(fd: int, n: int, what: str) -> bytes:
    try:
        return os.read(fd, n)
    except OSError as e:
        raise MmError(f"media fetch: read {what}: {_os_error_text(e)}") from e


def _os_error_text(e: OSError) -> str:
    """Rust's io::Error wording, e.g. "No such file or directory (os error 2)"."""
    if e.errno is None:
        return str(e)
    return f"{e.strerror or os.strerror(e.errno)} (os error {e.errno})"
