"""Typed outcomes: every reply's `kind` (mmworker.errors.Outcome), from the decoder's refusals through
the worker's and the I/O process's Failed messages to the pool's own rejections; real processes."""

import asyncio
import gc
import io
import os
import signal
import zlib

import msgspec
import pytest
from conftest import GOLDEN
from httpserver import MediaServer
from PIL import Image
from pngbuild import SIGNATURE, chunk, ihdr
from processes import segments_of, wait_replies

from ipc.results import ResultSender
from ipc.wire import WIRE_VERSION, Done, Failed, TensorDesc, decode, encode
from mmworker import MmError, Reply, WorkerPool, to_sglang
from mmworker.corpus import encode as encode_image
from mmworker.corpus import photo_like
from mmworker.driver import MmInput, process
from mmworker.errors import Outcome, UnsupportedInput, UsageError
from mmworker.registry import named_spec, pipeline_from_spec

P = 151655
SPEC = {**named_spec("qwen2_vl"), "max_pixels": 1003520}
MEDIA = {"allowed_networks": ["127.0.0.1/32"]}


def fixture(name: str) -> bytes:
    return (GOLDEN / "decode" / name).read_bytes()


def png_claiming(width: int, height: int) -> bytes:
    return SIGNATURE + ihdr(width, height, 8, 2) + chunk(b"IDAT", zlib.compress(bytes(100))) + chunk(b"IEND", b"")


def gif_claiming(width: int, height: int) -> bytes:
    """A 1x1 GIF whose logical screen claims width x height (Pillow refuses it as a bomb)."""
    out = io.BytesIO()
    Image.new("P", (1, 1)).save(out, "GIF")
    data = bytearray(out.getvalue())
    data[6:8], data[8:10] = width.to_bytes(2, "little"), height.to_bytes(2, "little")
    return bytes(data)


# Refused on purpose (UNSUPPORTED) or broken (BAD_INPUT), with the messages the decoder has always given.
UNSUPPORTED = {
    "TIFF": (fixture("tiff_rgb.tif"), r"^image decode: unsupported image format TIFF$"),
    "ICO": (fixture("ico_32.ico"), r"^image decode: unsupported image format ICO$"),
    "PNM": (fixture("ppm_rgb.ppm"), r"^image decode: unsupported image format PNM$"),
    "16-bit PNG": (fixture("png_rgb16.png"), r"^image decode: unsupported color Rgb16$"),
    "side": (png_claiming(70000, 10), r"^image decode: 70000x10 image exceeds the side limit of 65535$"),
    "pixels": (png_claiming(40000, 40000), r"^image decode: 40000x40000 image has 1600000000 pixels, above the limit"),
    "bomb": (gif_claiming(60000, 60000), r"^image decode: image too large: Image size \(3600000000 pixels\)"),
}
BAD = {
    "unknown": (b"definitely not an image", r"^image decode: The image format could not be determined$"),
    "truncated": (fixture("jpeg_rgb_q90_420.jpg")[:958], r"^image decode: image file is truncated"),
}


def test_an_mm_error_is_bad_input_unless_it_says_otherwise_or_was_raised_from_one_that_does():
    assert MmError("x").kind is Outcome.BAD_INPUT
    assert MmError("x", kind=Outcome.INTERNAL).kind is Outcome.INTERNAL
    assert UnsupportedInput("x").kind is Outcome.UNSUPPORTED and isinstance(UnsupportedInput("x"), ValueError)
    try:  # a layer that prefixes the message keeps the kind of what it wraps
        try:
            raise UnsupportedInput("image decode: unsupported image format TIFF")
        except MmError as exc:
            raise MmError(f"image 0: {exc}") from exc
    except MmError as wrapped:
        assert (
            wrapped.kind is Outcome.UNSUPPORTED
            and str(wrapped) == "image 0: image decode: unsupported image format TIFF"
        )
    try:
        try:
            raise OSError("disk")
        except OSError as exc:
            raise MmError("media fetch: disk") from exc
    except MmError as plain:
        assert plain.kind is Outcome.BAD_INPUT


@pytest.mark.parametrize("case", [*UNSUPPORTED, *BAD])
def test_decode_refusals_say_whether_they_are_unsupported_or_bad_input(case):
    data, pattern = UNSUPPORTED[case] if case in UNSUPPORTED else BAD[case]
    want = Outcome.UNSUPPORTED if case in UNSUPPORTED else Outcome.BAD_INPUT
    with pytest.raises(MmError, match="^image 0: " + pattern.removeprefix("^")) as info:
        process(pipeline_from_spec(SPEC), MmInput([P], [data]))  # through the driver's "image 0: " prefix
    assert info.value.kind is want, (case, str(info.value))


def test_failed_carries_its_kind_and_an_older_failed_without_one_still_decodes():
    failed = Failed(7, "image 0: image decode: unsupported image format TIFF", 1.5, Outcome.UNSUPPORTED.value)
    assert decode([encode(failed)]) == (failed, [])

    class OldFailed(msgspec.Struct, frozen=True, tag="failed"):  # the message before it had a kind
        rid: int
        error: str
        busy_ms: float = 0.0

    class OldEnvelope(msgspec.Struct, frozen=True, array_like=True):
        version: int
        body: OldFailed

    old = msgspec.msgpack.encode(OldEnvelope(WIRE_VERSION, OldFailed(7, "image 0: image decode: truncated")))
    message, _ = decode([old])
    assert message == Failed(7, "image 0: image decode: truncated") and message.kind == Outcome.BAD_INPUT.value


def test_every_kind_of_pool_rejection(tmp_path):
    tiff = fixture("tiff_rgb.tif")
    jpeg = encode_image(photo_like(640, 480, seed=1), "JPEG")
    small = encode_image(photo_like(64, 48, seed=1), "PNG")
    server = MediaServer()
    try:
        tiff_url = server.put("a.tif", tiff)
        with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 64, "queue_depth": 4, "media": MEDIA}) as pool:
            ok = pool.process([P], [small])
            assert ok.ok and ok.kind is Outcome.ACCEPTED and ok.error is None
            ok.release()
            cases = {  # (ids, sources) -> kind, the start of the message
                "worker refuses a format": ([P], [tiff], Outcome.UNSUPPORTED, "image 0: image decode: unsupported"),
                "worker, fetched": ([P], [tiff_url], Outcome.UNSUPPORTED, "image 0: image decode: unsupported"),
                "worker, corrupt": ([P], [b"junk"], Outcome.BAD_INPUT, "image 0: image decode"),
                "worker, prompt": ([7], [small], Outcome.BAD_INPUT, "prompt has 0 media placeholder"),
                "I/O process, 404": ([P], [server.url("/status/404")], Outcome.BAD_INPUT, "image 0: media fetch: GET"),
                "I/O process, policy": ([P], [str(tmp_path / "a.png")], Outcome.BAD_INPUT, "image 0: "),
                "client, ids": (["x"], [small], Outcome.BAD_INPUT, "input_ids must be integers"),
                "client, items": ([P] * 65, [small] * 65, Outcome.BAD_INPUT, "multimodal request exceeds 64"),
            }
            for name, (ids, sources, kind, start) in cases.items():
                reply = pool.process(ids, sources)
                assert not reply.ok and reply.kind is kind and reply.error.startswith(start), (name, reply)

            # QUEUE_FULL at submit; ABORTED for a queued one and for one finished but not yet taken.
            rids = [pool.submit([P], [jpeg]) for _ in range(5)]
            assert pool.cancel(rids[2])
            replies = {r.request_id: r for r in wait_replies(pool, 5)}
            assert replies[rids[4]].kind is Outcome.QUEUE_FULL and replies[rids[4]].error.startswith("queue full")
            assert replies[rids[2]].kind is Outcome.ABORTED and replies[rids[2]].error == "aborted"
            assert all(replies[r].kind is Outcome.ACCEPTED for r in (rids[0], rids[1], rids[3]))
            for r in replies.values():
                r.release()
            done = pool.submit([P], [small])
            pool.process([P], [small]).release()  # one worker: `done` finished first, its reply kept for poll()
            assert pool.cancel(done)
            [aborted] = pool.poll()
            assert aborted.kind is Outcome.ABORTED and pool.stats().shm_held_bytes == 0

            # WORKER_CRASHED (killed while stopped with the job: it cannot have answered), then
            # DEADLINE_EXCEEDED (a stopped worker).
            [pid] = pool.worker_pids()
            os.kill(pid, signal.SIGSTOP)
            running = pool.submit([P], [small])
            assert pool._supervisor.slots[0].rid is not None  # handed to the stopped worker
            os.kill(pid, signal.SIGKILL)
            [crashed] = wait_replies(pool, 1)
            assert crashed.request_id == running and crashed.kind is Outcome.WORKER_CRASHED
            assert crashed.error.startswith("worker crashed")
    finally:
        server.stop()
    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64, "deadline_s": 0.5}) as pool:
        os.kill(pool.worker_pids()[0], signal.SIGSTOP)
        late = pool.process([P], [small])
        assert late.kind is Outcome.DEADLINE_EXCEEDED and late.error.startswith("deadline exceeded")
        # POOL_CLOSED for what is pending at close(); misuse after it still raises.
        pending = pool.submit([P], [small])
        pool.close()
        [closed] = pool.poll()
        assert closed.request_id == pending and closed.kind is Outcome.POOL_CLOSED and closed.error == "pool closed"
        with pytest.raises(UsageError, match=r"^pool closed: submit after close\(\)$"):
            pool.submit([P], [small])


def test_misuse_raises_usage_error_at_the_call_and_owes_nothing():
    # A mistake of the calling code is not a request's bad content: no reply, not an MmError (a
    # ValueError, which SGLang answers 400), but a RuntimeError raised at the call.
    assert issubclass(UsageError, RuntimeError) and not issubclass(UsageError, (ValueError, MmError))
    small = encode_image(photo_like(64, 48, seed=1), "PNG")
    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64}) as pool:
        pool.submit([P], [small], request_id="a")
        misuse = {
            "submit, an id in flight": (lambda: pool.submit([P], [small], request_id="a"), r"^request id 'a' is"),
            "process, an id in flight": (lambda: pool.process([P], [small], request_id="a"), r"^request id 'a' is"),
            "an unhashable id": (lambda: pool.submit([P], [small], request_id=["a"]), r"must be hashable, got list$"),
            "cancel, an unhashable id": (lambda: pool.cancel({}), r"^a request id must be hashable, got dict$"),
            "mm_hashes, a string": (lambda: pool.submit([P], [small], mm_hashes="0xab"), r"^mm_hashes must be a list"),
            "mm_hashes, a number": (lambda: pool.submit([P], [small], mm_hashes=7), r"or None, got int$"),
        }
        for name, (call, pattern) in misuse.items():
            with pytest.raises(UsageError, match=pattern):
                call()
            assert pool.stats().submitted == 1, name  # nothing was submitted, nothing is owed
        [reply] = wait_replies(pool, 1)
        assert reply.request_id == "a" and reply.ok, reply.error
        reply.release()
        assert pool.stats().in_flight == 0 and pool.poll(0.2) == []
        rejected = pool.process([P], [b"junk"])
        with pytest.raises(UsageError, match=r"^to_sglang: request \d+ was rejected: image 0: image decode"):
            to_sglang(rejected)
        with pytest.raises(UsageError, match=r"^to_sglang: reply 'x' names no family \(not a pool's reply\)$"):
            to_sglang(Reply("x", True))
    with pytest.raises(UsageError, match=r"^pool closed: submit after close\(\)$"):
        pool.submit([P], [small])
    with pytest.raises(UsageError, match=r"^pool closed: submit after close\(\)$"):
        asyncio.run(pool.aprocess([P], [small]))


def test_a_result_larger_than_the_ring_is_unsupported_and_a_bad_one_internal():
    # 1 MiB ring: a 640x480 image's feature (7.4 MB) can never fit, however long the worker waits.
    jpeg = encode_image(photo_like(640, 480, seed=1), "JPEG")
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 1}) as pool:
        reply = pool.process([P], [jpeg])
        assert reply.kind is Outcome.UNSUPPORTED and "is larger than the ring" in reply.error, reply.error
        # A Done whose descriptors do not check out (sent on the worker's identity while it is stopped).
        [slot] = pool._supervisor.slots
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)
        try:
            rid = pool.submit([P], [encode_image(photo_like(64, 48, seed=1), "PNG")])
            sender = ResultSender(os.dup(pool._res.results.sender_fd), slot.identity)
            try:
                outside = TensorDesc(slot.index, 1 << 30, 1, 32, "<i8", (4,))
                sender.send(Done(slot.rid, {"input_ids": outside}, {"offsets": [], "hashes": []}))
            finally:
                sender.close()
            [bad] = wait_replies(pool, 1)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert bad.request_id == rid and bad.kind is Outcome.INTERNAL and bad.error.startswith("internal error")
    gc.collect()
    assert segments_of() == []


def test_every_rejection_has_a_kind_and_only_acceptances_are_accepted():
    # Whatever the path, `ok` and `kind` agree (a mix of good and bad requests under load).
    small = encode_image(photo_like(64, 48, seed=1), "PNG")
    sources = [small, b"junk", fixture("tiff_rgb.tif"), small]
    with WorkerPool(SPEC, {"workers": 2, "ring_mib": 64, "queue_depth": 24}) as pool:
        for k in range(32):
            pool.submit([P], [sources[k % 4]])
        replies = wait_replies(pool, 32)
    kinds = [r.kind for r in replies]
    assert all((r.kind is Outcome.ACCEPTED) == r.ok for r in replies)
    assert {Outcome.ACCEPTED, Outcome.BAD_INPUT, Outcome.UNSUPPORTED, Outcome.QUEUE_FULL} == set(kinds)
    for r in replies:
        r.release()
