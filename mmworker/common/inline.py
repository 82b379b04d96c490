"""Inline media: ``data:`` URLs and strict base64, decoded against the request's byte budget.

The decoder matches the Rust ``base64`` crate's STANDARD engine that sglang-mm uses (docs/behaviour.md §3.2):
standard alphabet, canonical ``=`` padding, zero trailing bits, no whitespace anywhere. Python's own
decoders are laxer (``b64decode`` drops non-alphabet bytes; even ``strict_mode=True`` accepts non-zero
trailing bits, so ``QR==`` gives ``b'A'``), so the canonical checks are done here explicitly before
``binascii`` does the actual decoding. Error reasons use the crate's wording ("Invalid symbol 10, offset
4.", "Invalid padding", ...); which reason wins when an input has several faults may differ from Rust.
"""

import binascii
import re

from mmworker.common.budget import ByteBudget
from mmworker.errors import MmError

# Rust `str::trim` strips Unicode White_Space. Python's `str.strip()` also strips U+001C..U+001F, which
# Rust keeps (and then rejects as invalid symbols), so the set is spelled out.
RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)

_NOT_ALPHABET = re.compile(r"[^A-Za-z0-9+/]")
_DECODE = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def rust_trim(s: str) -> str:
    """`s` without leading/trailing Unicode White_Space, like Rust's `str::trim`."""
    return s.strip(RUST_WHITESPACE)


def data_url_payload(src: str) -> str:
    """Everything after the first comma of a ``data:`` URL; the media type and ``;base64`` are not checked.

    Upstream does not look at the header either, so ``data:text/plain,...`` is decoded as base64 too.
    """
    comma = src.find(",")
    if comma == -1:
        raise MmError("media fetch: malformed data: URL")
    return src[comma + 1 :]


def decoded_size_estimate(s: str) -> int:
    """Upper bound on the decoded size, reserved before decoding: ``ceil(len/4)*3 - min(pad, 2)``."""
    pad = 2 if s.endswith("==") else 1 if s.endswith("=") else 0
    return -(-_utf8_len(s) // 4) * 3 - pad


def decode_base64_payload(payload: str, budget: ByteBudget) -> bytes:
    """Trim `payload` (as fetch does), reserve its estimated size from `budget`, decode, return the surplus.

    The reservation happens before any decoding so an oversized payload costs only the estimate; on a
    decode error the whole reservation is returned, since the request is failing anyway and nothing
    was delivered.
    """
    s = rust_trim(payload)
    estimate = decoded_size_estimate(s)
    if not budget.claim(estimate):
        raise MmError(
            "media fetch: base64 payload: exceeds the request media byte budget "
            f"(decoded size {estimate} bytes, {budget.remaining} bytes remaining)"
        )
    try:
        data = base64_decode(s)
    except BaseException:
        budget.release(estimate)
        raise
    budget.release(estimate - len(data))
    return data


def base64_decode(s: str) -> bytes:
    """Decode standard, canonically padded base64 with zero trailing bits; no whitespace is trimmed.

    Raises MmError("media fetch: base64 decode: {reason}") for anything the Rust engine rejects.
    """
    reason = _canonical_error(s)
    if reason is not None:
        raise MmError(f"media fetch: base64 decode: {reason}")
    try:
        return binascii.a2b_base64(s, strict_mode=True)
    except (binascii.Error, ValueError) as e:  # unreachable after the checks above; kept as a backstop
        raise MmError(f"media fetch: base64 decode: {e}") from e


def _canonical_error(s: str) -> str | None:
    """Why `s` is not canonical standard base64, in the Rust crate's words; None when it is."""
    pad = 2 if s.endswith("==") else 1 if s.endswith("=") else 0
    body_len = len(s) - pad
    # Any '=' before the last two characters (interior padding, or a third '=') is an invalid symbol,
    # as is anything outside the alphabet; offsets are in UTF-8 bytes like Rust's.
    bad = _NOT_ALPHABET.search(s, 0, body_len)
    if bad is not None:
        i = bad.start()
        offset = i if s.isascii() else _utf8_len(s[:i])
        first_byte = s[i].encode("utf-8", "surrogatepass")[0]
        return f"Invalid symbol {first_byte}, offset {offset}."
    tail = body_len % 4
    if tail == 1:
        return f"Invalid input length: {body_len}"
    # Canonical: a full last quad has no padding, 2 symbols take "==", 3 symbols take "=".
    if pad != (4 - tail) % 4:
        return "Invalid padding"
    if tail:
        last = s[body_len - 1]
        unused_bits = 4 if tail == 2 else 2
        if _DECODE[last] & ((1 << unused_bits) - 1):
            return f"Invalid last symbol {ord(last)}, offset {body_len - 1}."
    return None


def _utf8_len(s: str) -> int:
    # Rust measures strings in UTF-8 bytes; for ASCII (every valid payload) that is len() without a copy.
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))
