"""Reading another process's buffers (process_vm_readv, Linux's cross-memory attach): one copy, made by the reader.

The owner of the bytes (the pool's client) sends only where they are, `places_of(buffers)`:
(address, nbytes) per buffer, and keeps the buffers alive and unchanged until the reader has
answered; the exports `places_of` returns also stop a bytearray from being resized (and its
memory moved) meanwhile. The reader (a worker) copies them with one process_vm_readv(2) into its
own memory: the owner does no per-byte work at all, where copying them into shared memory costs
the owner's thread (the serving loop's) CPU for every byte.

The kernel allows this only where the reader may ptrace the owner: the same user, and with Yama
(`kernel.yama.ptrace_scope`) at 0; at 1 (Ubuntu's default) only a process's ancestors may, so a
child cannot read its parent. `PeerMemory.check` finds that out once, on a probe buffer, so the
owner can fall back to copying before any real read fails. MPI implementations move large
messages between the processes of one node the same way (Open MPI's "CMA").
"""

import ctypes
import errno
import os
import sys
from collections.abc import Sequence

import numpy as np

from ipc.errors import IpcError

# The kernel's limit on iovecs per call (UIO_MAXIOV).
MAX_PLACES = 1024
# The reader keeps one buffer of up to this size for reuse (fresh memory costs page faults per
# request); a larger read gets memory of its own, freed when its views are.
_REUSED_BYTES = 16 << 20


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _bytes_data_offset() -> int | None:
    """How far a bytes object's contents lie from its id(), if that is fixed (CPython keeps them
    inline, after the object's header) and confirmed by the buffer protocol on a probe; else None."""
    offset = bytes.__basicsize__ - 1  # the header, less the one-byte array it ends with
    probe = bytes(range(64))
    _, (address, _) = _exported_place(probe)
    return offset if id(probe) + offset == address else None


def _exported_place(buffer) -> tuple[np.ndarray, tuple[int, int]]:
    """A numpy export of `buffer` and (address, nbytes) of its bytes, as the buffer protocol gives them."""
    export = np.frombuffer(buffer, np.uint8)
    return export, (export.__array_interface__["data"][0], export.nbytes)


# Worked out once: a bytes object's place then costs one addition, where a numpy export of it and
# its address go through numpy's cold entry points, which cost far more than that per buffer.
_BYTES_DATA_OFFSET = _bytes_data_offset()


def places_of(buffers: Sequence) -> tuple[list[bytes | np.ndarray], list[tuple[int, int]]]:
    """(exports, places): `places` is (address, nbytes) of each C-contiguous buffer in this process;
    keep `exports` (one per buffer) until the reader is done: they keep each buffer alive and a
    bytearray from being resized. A bytes object is its own export: it cannot change."""
    exports, places = [], []
    for buffer in buffers:
        if type(buffer) is bytes and _BYTES_DATA_OFFSET is not None:
            exports.append(buffer)
            places.append((id(buffer) + _BYTES_DATA_OFFSET, len(buffer)))
        else:
            export, place = _exported_place(buffer)
            exports.append(export)
            places.append(place)
    return exports, places


class PeerMemory:
    """Reads buffers of process `pid` (the owner) into this process's memory."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        readv = ctypes.CDLL(None, use_errno=True).process_vm_readv
        readv.restype = ctypes.c_ssize_t
        readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                          ctypes.c_ulong]  # fmt: skip
        self._readv = readv
        self._buffer = np.empty(0, np.uint8)

    def check(self, address: int, expected: bytes) -> str | None:
        """None if the owner's `len(expected)` bytes at `address` read back as `expected`, else why not."""
        try:
            [got] = self.read([(address, len(expected))])
        except IpcError as exc:
            return str(exc)
        return None if got == expected else f"process {self.pid}: the probe read back different bytes"

    def read(self, places: Sequence[tuple[int, int]]) -> list[memoryview]:
        """The owner's bytes at `places`, one read-only view each, valid until the next `read` (or
        longer: memory still viewed is never reused). IpcError names the cause if the read fails."""
        if len(places) > MAX_PLACES:
            raise IpcError(f"process {self.pid}: {len(places)} buffers to read, at most {MAX_PLACES} at once")
        spans = [(int(address), int(nbytes)) for address, nbytes in places]
        if any(n < 0 for _, n in spans):
            raise IpcError(f"process {self.pid}: a negative buffer size in {list(places)}")
        total = sum(n for _, n in spans)
        target = self._target(total)
        if total:
            remote = (_Iovec * len(spans))(*spans)
            got = self._readv(self.pid, ctypes.byref(_Iovec(target.ctypes.data, total)), 1, remote, len(spans), 0)
            if got != total:
                code = ctypes.get_errno() if got < 0 else 0
                why = f"{errno.errorcode.get(code, code)} ({os.strerror(code)})" if code else "a buffer ended early"
                raise IpcError(f"process {self.pid}: process_vm_readv read {max(got, 0)} of {total} bytes: {why}")
        view = memoryview(target).toreadonly()
        out, at = [], 0
        for _, n in spans:
            out.append(view[at : at + n])
            at += n
        return out

    def _target(self, nbytes: int) -> np.ndarray:
        """Memory for `nbytes`: the reused buffer unless something still views it, or it is too large."""
        if nbytes > _REUSED_BYTES:
            return np.empty(nbytes, np.uint8)
        # References: the attribute and getrefcount's argument; any more are views of an earlier read.
        if self._buffer.nbytes < nbytes or sys.getrefcount(self._buffer) > 2:
            self._buffer = np.empty(max(nbytes, 1 << 20), np.uint8)
        return self._buffer
