"""ipc.peer_memory: a real child process reads its parent's buffers in place, refusals name their cause."""

import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
from processes import UNTRACEABLE

from ipc.errors import IpcError
from ipc.peer_memory import MAX_PLACES, PeerMemory, places_of

ROOT = Path(__file__).resolve().parents[1]

READER = """
import json, sys
sys.path.insert(0, {root!r})
from ipc.peer_memory import PeerMemory
pid, places = json.loads(sys.argv[1])
memory = PeerMemory(pid)
try:
    print(json.dumps([bytes(view).hex() for view in memory.read(places)]))
except Exception as exc:
    print(json.dumps(str(exc)))
"""

# An owner the reader may not trace.
DENYING_OWNER = (
    UNTRACEABLE
    + """
import json, subprocess, sys
sys.path.insert(0, {root!r})
from ipc.peer_memory import places_of
secret = b"not for the reader"
exports, places = places_of([secret])
out = subprocess.run([sys.executable, "-c", sys.argv[1], json.dumps([os.getpid(), places])],
                     capture_output=True, text=True, check=True).stdout
print(out, end="")
"""
)


def read_in_child(pid: int, places: list) -> object:
    code = READER.format(root=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, json.dumps([pid, places])], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return json.loads(out)


def test_a_child_reads_its_parents_buffers_in_place():
    ids = np.array([7, 151655, -1], np.int64)
    grown = bytearray(b"grown here")
    backing = bytes(range(256)) * 40
    buffers = [ids, b"\xff\xd8 jpeg bytes", grown, memoryview(backing)[3:9001], b""]
    exports, places = places_of(buffers)
    assert [n for _, n in places] == [24, 13, 10, 8998, 0]
    got = read_in_child(os.getpid(), places)
    assert got == [bytes(memoryview(b).cast("B")).hex() for b in buffers]
    del exports


def test_places_are_where_the_buffer_protocol_says_the_bytes_are():
    class Tagged(bytes):
        pass

    buffers = [b"", b"j", os.urandom(4097), Tagged(b"tagged bytes"), bytearray(b"grown"), np.arange(5)]
    exports, places = places_of(buffers)
    assert places == [(np.frombuffer(b, np.uint8).ctypes.data, memoryview(b).nbytes) for b in buffers]
    assert all(export is buffer for export, buffer in zip(exports[:3], buffers, strict=False))
    del exports


def test_places_of_keeps_a_bytearray_from_being_resized_while_exported():
    grown = bytearray(b"abc")
    exports, _ = places_of([grown])
    with pytest.raises(BufferError):
        grown.extend(b"d")  # its memory would move under the reader
    del exports
    grown.extend(b"d")
    assert grown == b"abcd"


def test_check_reads_the_probe_back_or_says_why_not():
    probe = os.urandom(32)
    exports, [(address, _)] = places_of([probe])
    memory = PeerMemory(os.getpid())
    assert memory.check(address, probe) is None
    assert "read back different bytes" in memory.check(address, bytes(32))
    assert "EFAULT (Bad address)" in memory.check(4096, probe)  # nothing is mapped at the first pages
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert "ESRCH" in PeerMemory(gone.pid).check(address, probe)
    del exports


def test_an_owner_the_reader_may_not_trace_is_refused_with_eperm():
    owner = DENYING_OWNER.format(root=str(ROOT))
    reader = READER.format(root=str(ROOT))
    out = subprocess.run([sys.executable, "-c", owner, reader], capture_output=True, text=True, check=True).stdout
    error = json.loads(out)
    assert "process_vm_readv read 0 of 18 bytes: EPERM (Operation not permitted)" in error, error


def test_memory_still_viewed_is_never_reused():
    first_bytes, second_bytes, third_bytes = b"first" * 10, b"second" * 10, b"third" * 10
    exports, places = places_of([first_bytes, second_bytes, third_bytes])
    memory = PeerMemory(os.getpid())
    [first] = memory.read([places[0]])
    [second] = memory.read([places[1]])  # the first read's view is alive: fresh memory
    assert bytes(first) == first_bytes and bytes(second) == second_bytes
    assert first.obj is not second.obj
    second_memory = weakref.ref(second.obj)
    del first, second
    [third] = memory.read([places[2]])  # nothing views the buffer now: it is reused
    assert bytes(third) == third_bytes and third.obj is second_memory()
    assert third.readonly
    del exports


def test_bad_requests_are_refused_before_any_read():
    memory = PeerMemory(os.getpid())
    with pytest.raises(IpcError, match=f"at most {MAX_PLACES} at once"):
        memory.read([(0, 1)] * (MAX_PLACES + 1))
    with pytest.raises(IpcError, match="a negative buffer size"):
        memory.read([(4096, -1)])
    assert memory.read([]) == []
