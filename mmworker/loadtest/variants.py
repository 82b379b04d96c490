"""Variants of one encoded image: other bytes, the same pixels, made cheaply per request.

The pool's feature cache keys an image by its bytes, so a load test that cycles a fixed corpus
would measure the cache instead of the workers. Variant `tag` of an image is the file with one
marker the decoders skip, carrying the tag: a distinct file per tag, the same pixels for all.

| format | marker | where |
|---|---|---|
| JPEG | a COM segment | right after SOI |
| PNG | an ancillary tEXt chunk (keyword `Comment`, correct CRC) | right after IHDR |
| WebP | an unknown RIFF chunk (`MMWV`), the RIFF size updated | at the end of the RIFF payload |
| GIF | a comment extension | before the trailer |
| BMP | trailing bytes, the file header's size updated | at the end |

A marker has a fixed length per format (the tag written as 16 hex digits), a multiple of 3 (and
of 2, which RIFF chunks need): so a variant's base64 text is mostly the original's, sliced
(`Variants.b64`). Only the 3-byte groups around the marker and the updated size field are encoded
anew; the rest costs one copy, as the bytes do.
"""

import base64
import struct
import zlib

_TEXT = b"mmworker loadtest variant %016x"  # the tag, fixed width: every marker of a format has one length


def _padded(text: bytes, overhead: int, multiple: int) -> bytes:
    """`text` padded with spaces so that overhead + len(text) is a multiple of `multiple`."""
    return text + b" " * (-(overhead + len(text)) % multiple)


class Variants:
    """Variant `tag` of `data` (an encoded image of format `fmt`, as mmworker.common.decode sniffs it)
    for any tag >= 0, as bytes or base64 text; ValueError if `data` does not look like a complete
    file of its format (the marker would have nowhere to go)."""

    def __init__(self, data: bytes, fmt: str) -> None:
        self.data, self.fmt = data, fmt
        self._b64: str | None = None  # the original's base64 text, made on first use
        n = len(data)
        if fmt == "JPEG":
            self.at, self.head = 2, b""
            self._marker = self._jpeg
        elif fmt == "PNG":
            if data[12:16] != b"IHDR":
                raise ValueError("a PNG whose first chunk is not IHDR")
            self.at, self.head = 8 + 25, b""  # after the signature and IHDR (13 bytes of data)
            self._marker = self._png
        elif fmt == "WEBP":
            riff = int.from_bytes(data[4:8], "little")
            self.at = min(n, 8 + riff + (riff & 1))
            self._marker = self._webp
            self.head = b"RIFF" + struct.pack("<I", self.at - 8 + len(self._marker(0)))
        elif fmt == "GIF":
            self.at, self.head = (n - 1 if data.endswith(b";") else n), b""
            self._marker = self._gif
        elif fmt == "BMP":
            self.at = n
            self._marker = self._bmp
            self.head = data[:2] + struct.pack("<I", n + len(self._marker(0)))
        else:
            raise ValueError(f"no variants for format {fmt}")
        if len(self._marker(0)) % 3 or self.at < len(self.head):
            raise AssertionError("a marker's length must be a multiple of 3, after the patched header")

    @staticmethod
    def _jpeg(tag: int) -> bytes:
        text = _padded(_TEXT % tag, 4, 3)
        return b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text

    @staticmethod
    def _png(tag: int) -> bytes:
        body = b"tEXtComment\x00" + _padded(_TEXT % tag, 20, 3)  # length, type, keyword and CRC: 20 bytes
        return struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))

    @staticmethod
    def _webp(tag: int) -> bytes:
        text = _padded(_TEXT % tag, 8, 6)  # RIFF chunks are even-sized
        return b"MMWV" + struct.pack("<I", len(text)) + text

    @staticmethod
    def _gif(tag: int) -> bytes:
        text = _padded(_TEXT % tag, 4, 3)  # one sub-block (<= 255 bytes), then the block terminator
        return b"\x21\xfe" + bytes([len(text)]) + text + b"\x00"

    @staticmethod
    def _bmp(tag: int) -> bytes:
        return _padded(_TEXT % tag, 0, 3)

    def bytes(self, tag: int) -> bytes:
        """Variant `tag`, encoded (one copy of the image's bytes)."""
        data, head, at = self.data, self.head, self.at
        return b"".join((head, data[len(head) : at], self._marker(tag), data[at:]))

    def b64(self, tag: int, prefix: str = "") -> str:
        """`prefix` + the base64 text of `bytes(tag)`, mostly sliced from the original's.

        The marker's length is a multiple of 3, so the original's bytes after the 3-byte group that
        holds `at` sit on group boundaries in the variant too: their text is the original's. Groups
        before the marker's are the original's too, but for the patched header's.
        """
        if self._b64 is None:
            self._b64 = base64.b64encode(self.data).decode("ascii")
        data, text, head, at = self.data, self._b64, self.head, self.at
        marker = self._marker(tag)
        below, above = at // 3 * 3, -(-at // 3) * 3  # the group boundaries around `at`
        fresh_head = -(-len(head) // 3) * 3
        parts = [prefix]
        if fresh_head <= below:  # header, original text, then the groups around the marker
            parts += [_encode(head + data[len(head) : fresh_head]), text[fresh_head // 3 * 4 : below // 3 * 4]]
            parts.append(_encode(data[below:at] + marker + data[at:above]))
        else:
            parts.append(_encode(head + data[len(head) : at] + marker + data[at:above]))
        parts.append(text[above // 3 * 4 :])
        return "".join(parts)


def _encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
