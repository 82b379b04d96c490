"""The content hash SGLang keys its caches and pad values on: blake3 of the raw source bytes, as u64."""

from blake3 import blake3


def content_hash(data: bytes | bytearray | memoryview) -> int:
    """First 8 bytes of blake3(data), big-endian (docs/behaviour.md §9).

    Hashes the encoded source bytes (after fetch / base64, before decode), so one image sent as raw
    bytes, data: URL or file path hashes the same. Single-threaded (blake3's default).
    """
    return int.from_bytes(blake3(data, max_threads=1).digest(length=8), "big")
