"""WorkerPool with videos: real worker processes, the real I/O process, shared memory, an HTTP server.

A pool's reply for a request with videos must equal the inline driver's output for it byte for byte
(features, aux tensors, grids, hashes, expanded ids, runs, offsets, M-RoPE positions and delta), for
Qwen2-VL, Qwen2.5-VL and Qwen3-VL (with a timestamp table), video-only and mixed with images, from
every source kind (bytes, a path, file://, an http URL, a data: URL, base64). Around that: what is
rejected and how (a corrupt or truncated video, an unsupported container, a family that serves no
videos, a video over its CPU budget, a feature larger than the ring, malformed video fields on the
wire in either direction), the feature cache (videos never cached nor hashed by the client; cached
images beside computed videos), the order of replies, and that nothing is left behind.

Clips are encoded here with PyAV (MPEG-4 Part 2, tiny and short), so no ffmpeg command line is needed.
"""

import asyncio
import base64
import functools
import gc
import io
import os
import signal
import tempfile
import time

import numpy as np
import pytest
from httpserver import MediaServer, SilentListener
from processes import ended, no_leaked_segments, open_fds, wait_replies  # noqa: F401 (a fixture)

import mmworker.pool.cache as cache_module
import mmworker.pool.client as client_module
from ipc.results import ResultSender
from ipc.wire import Done, Job, TensorDesc
from mmworker import MmError, WorkerPool, to_sglang
from mmworker.common.budget import MAX_FETCH_BYTES, MAX_VIDEO_FETCH_BYTES
from mmworker.corpus import encode, photo_like
from mmworker.driver import MmInput, process
from mmworker.errors import Outcome
from mmworker.pipeline import IMAGE, VIDEO, MRope
from mmworker.pool import worker as worker_module
from mmworker.pool.inputs import check_inputs
from mmworker.qwen_vl.video_layout import TIMESTAMP_PIECES
from mmworker.registry import named_spec, pipeline_from_spec

av = pytest.importorskip("av", reason="the `video` extra (PyAV) is not installed: pip install -e '.[video]'")

S, P, E, V = 151652, 151655, 151653, 151656  # vision start, image pad, vision end, video pad
IMAGE_PROMPT, VIDEO_PROMPT = [S, P, E], [S, V, E]
# A self-consistent timestamp table (ids no real tokenizer has: the pool only composes them).
TABLE = {piece: [1000 + k] if len(piece) == 1 else [2000, 2001] for k, piece in enumerate(TIMESTAMP_PIECES)}
SPECS = {
    "qwen2_vl": named_spec("qwen2_vl"),
    "qwen2_5_vl": named_spec("qwen2_5_vl"),
    "qwen3_vl": {**named_spec("qwen3_vl"), "timestamp_table": TABLE},
}
# Tests serve media from 127.0.0.1 and temporary files; the safe default policy refuses both.
TEST_MEDIA = {"allowed_networks": ["127.0.0.1/32"], "allowed_local_roots": [tempfile.gettempdir()]}
BUDGET_MESSAGE = "exceeded the CPU budget (image_cpu_s per image, video_cpu_s per video)"


@functools.cache
def clip(width: int, height: int, frames: int, rate: int, seed: int, fmt: str = "mp4") -> bytes:
    """A clip of `frames` frames at `rate` fps: a noise picture sliding sideways (neighbouring frames
    differ, so a wrong frame shows), MPEG-4 Part 2 in `fmt`."""
    out = io.BytesIO()
    base = np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for k in range(frames):
            frame = av.VideoFrame.from_ndarray(np.roll(base, 3 * k, axis=1), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return out.getvalue()


def short(seed: int, fmt: str = "mp4") -> bytes:
    """2 s at 4 fps: 4 sampled frames, 2 temporal patches (two runs per video under Qwen3)."""
    return clip(64, 48, 8, 4, seed, fmt)


def heavy() -> bytes:
    """Several times the CPU of `short` (720p, 60 frames decoded, 4 sampled): ~0.1 s of a core."""
    return clip(1280, 720, 60, 30, 9)


@functools.cache
def image(width: int, height: int, seed: int) -> bytes:
    return encode(photo_like(width, height, seed=seed), "PNG")


def assert_same(reply, expected) -> None:
    """`reply` is the inline driver's `expected`, byte for byte, and `to_sglang` shows it item by item."""
    assert reply.ok, reply.error
    np.testing.assert_array_equal(reply.input_ids, expected.input_ids)
    assert reply.offsets == list(expected.offsets)
    assert reply.runs == list(expected.runs)
    assert isinstance(expected.positions, MRope)
    np.testing.assert_array_equal(reply.positions, expected.positions.positions)
    assert reply.delta == expected.positions.delta
    for got, want in zip(reply.items, expected.items, strict=True):
        assert (got.modality, got.hash) == (want.modality, want.hash)
        assert (got.feature.dtype, got.feature.shape) == (want.feature.dtype, want.feature.shape)
        assert got.feature.tobytes() == want.feature.tobytes()
        assert got.aux.keys() == want.aux.keys()
        for name, value in want.aux.items():
            assert (got.aux[name].dtype, got.aux[name].tobytes()) == (value.dtype, value.tobytes()), name
    out = to_sglang(reply)
    for entry, got, runs, want in zip(out["mm_items"], reply.items, expected.runs, expected.items, strict=True):
        assert entry["modality"] == want.modality and entry["offsets"] == list(runs)
        assert np.shares_memory(entry["feature"], got.feature)
        model_data = reply.family.model_data(want.aux)
        assert entry["model_specific_data"].keys() == model_data.keys()
        for name, value in model_data.items():
            np.testing.assert_array_equal(entry["model_specific_data"][name], value)


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(SPECS["qwen2_vl"], {"workers": 1, "cache_mib": 0, "ring_mib": 64, "deadline_s": 30,
                                        "media": TEST_MEDIA}) as p:  # fmt: skip
        yield p


@pytest.mark.parametrize("model_type", SPECS)
def test_replies_equal_the_inline_driver_from_every_source_kind(model_type, tmp_path):
    spec = SPECS[model_type]
    family = pipeline_from_spec(spec)
    path = tmp_path / "b.mkv"
    path.write_bytes(short(2, "matroska"))
    encoded = base64.b64encode(short(4)).decode()
    server = MediaServer()
    try:
        url = server.put("c.mp4", short(3))
        requests = [  # (ids, images, videos)
            ([1, *VIDEO_PROMPT, 2], [], [short(1)]),  # video only, bytes
            ([1, *IMAGE_PROMPT, 2, *VIDEO_PROMPT, 3, *VIDEO_PROMPT, 4], [image(96, 64, 1)], [str(path), url]),
            # the prompt places the video before the image; the items are still the image, then the video
            ([*VIDEO_PROMPT, 5, *IMAGE_PROMPT, 6], [image(64, 48, 2)], ["data:video/mp4;base64," + encoded]),
            ([*VIDEO_PROMPT, 7, *VIDEO_PROMPT], [], [encoded, path.as_uri()]),  # base64, file://
        ]
        expected = [process(family, MmInput(*request)) for request in requests]
        with WorkerPool(spec, {"workers": 1, "cache_mib": 0, "ring_mib": 64, "media": TEST_MEDIA}) as pool:
            replies = [pool.process(ids, images, videos=videos) for ids, images, videos in requests[:-1]]

            async def last():
                ids, images, videos = requests[-1]
                return await pool.aprocess(ids, images, videos=videos)

            replies.append(asyncio.run(last()))
            for reply, want in zip(replies, expected, strict=True):
                assert_same(reply, want)
                reply.release()
    finally:
        server.stop()
    assert [[item.modality for item in want.items] for want in expected] == [
        [VIDEO], [IMAGE, VIDEO, VIDEO], [IMAGE, VIDEO], [VIDEO, VIDEO]]  # fmt: skip
    for want in expected:  # Qwen3: one run per temporal patch (timestamp text between); else one run
        for item, runs in zip(want.items, want.runs, strict=True):
            per_item = item.geometry.t if model_type == "qwen3_vl" and item.modality == VIDEO else 1
            assert len(runs) == per_item
    if model_type == "qwen2_5_vl":
        assert "second_per_grid_ts" in expected[0].items[0].aux


def test_corrupt_truncated_and_unsupported_videos_are_rejected_naming_the_video_and_the_cause(pool):
    good = short(5)
    cases = [  # (video, what the message says after "video 0: video decode: ", kind)
        (good[: len(good) // 2], "cannot read the container", Outcome.BAD_INPUT),  # MP4 cut before its index
        (bytes(range(256)) * 16, "cannot read the container", Outcome.BAD_INPUT),
        (short(5, "nut"), "not a container mmworker accepts", Outcome.UNSUPPORTED),  # valid, refused by name
    ]
    [pid] = pool.worker_pids()
    for video, cause, kind in cases:
        # The video is item 1 of its request, and is named as its modality counts it.
        reply = pool.process([*IMAGE_PROMPT, *VIDEO_PROMPT], [image(64, 48, 3)], videos=[video])
        assert not reply.ok and reply.kind is kind, (reply.kind, reply.error)
        assert reply.error.startswith(f"video 0: video decode: {cause}"), reply.error
    with pool.process(VIDEO_PROMPT, [], videos=[good]) as after:
        assert after.ok, after.error
    assert pool.worker_pids() == [pid] and pool.stats().restarts == 0


def test_a_family_that_serves_no_videos_rejects_them_at_submit_saying_why():
    # The bundled qwen3_vl spec has no timestamp table. The video's URL points at a listener that
    # never answers: it must not even be contacted (the rejection comes before any fetch).
    listener = SilentListener()
    try:
        with WorkerPool("qwen3_vl", {"workers": 1, "cache_mib": 0, "ring_mib": 64, "media": TEST_MEDIA}) as pool:
            url = f"http://127.0.0.1:{listener.port}/clip.mp4"
            reply = pool.process([*IMAGE_PROMPT, *VIDEO_PROMPT], [image(64, 48, 4)], videos=[url])
            assert reply.kind is Outcome.UNSUPPORTED, (reply.kind, reply.error)
            assert reply.error.startswith("video 0: qwen_vl: ") and (
                "serves no videos (qwen3_vl needs the spec's `timestamp_table`" in reply.error), reply.error  # fmt: skip
            assert not listener.was_contacted()
            with pool.process(IMAGE_PROMPT, [image(64, 48, 4)]) as after:  # images are served as ever
                assert after.ok, after.error
    finally:
        listener.close()


def test_the_cpu_budget_is_per_image_and_per_video_and_a_video_over_it_leaves_the_worker_serving():
    # video_cpu_s 1 ms: a video-only request is stopped inside its decode. With an image beside it,
    # the job's budget is image_cpu_s + video_cpu_s, and the same video fits in it.
    with WorkerPool(SPECS["qwen2_vl"], {"workers": 1, "cache_mib": 0, "ring_mib": 64, "image_cpu_s": 10,
                                        "video_cpu_s": 0.001}) as pool:  # fmt: skip
        [pid] = pool.worker_pids()
        over = pool.process(VIDEO_PROMPT, [], videos=[heavy()])
        assert not over.ok and over.kind is Outcome.BAD_INPUT
        assert over.error == f"video 0: {BUDGET_MESSAGE}"
        with pool.process([*IMAGE_PROMPT, *VIDEO_PROMPT], [image(64, 48, 5)], videos=[heavy()]) as shared:
            assert shared.ok, shared.error
        with pool.process(IMAGE_PROMPT, [image(64, 48, 5)]) as after:
            assert after.ok, after.error
        assert pool.worker_pids() == [pid] and pool.stats().restarts == 0


def test_a_video_too_large_for_the_ring_is_rejected_at_once_naming_its_size_and_ring_mib():
    video = short(6)
    nbytes = process(pipeline_from_spec(SPECS["qwen2_vl"]), MmInput(VIDEO_PROMPT, [], [video])).items[0].feature.nbytes
    assert nbytes > 4 << 20  # 5.3 MB of pixel_values_videos
    config = {"workers": 1, "cache_mib": 0, "ring_mib": 4, "memory_wait_s": 30, "deadline_s": 60}
    with WorkerPool(SPECS["qwen2_vl"], config) as pool:
        started = time.monotonic()
        reply = pool.process([*IMAGE_PROMPT, *VIDEO_PROMPT], [image(64, 48, 6)], videos=[video])
        assert time.monotonic() - started < 20  # no wait for releases (memory_wait_s) that cannot help
        assert reply.kind is Outcome.UNSUPPORTED, (reply.kind, reply.error)
        assert reply.error == (f"video 0: its feature of {nbytes} bytes is larger than the ring (worker 0's: "
                               f"{4 << 20} bytes, ring_mib 4); no release can make room: raise ring_mib")  # fmt: skip
        with pool.process(IMAGE_PROMPT, [image(64, 48, 6)]) as after:  # the image's allocation was given back
            assert after.ok, after.error
        assert pool.stats().shm_held_bytes == 0


def test_videos_are_never_cached_nor_hashed_by_the_client_and_cached_images_ride_along(monkeypatch):
    hashed = []
    real = cache_module.blake3

    def counting(data, **kwargs):
        hashed.append(memoryview(data).nbytes)
        return real(data, **kwargs)

    video, picture = short(7), image(96, 64, 7)
    family = pipeline_from_spec(SPECS["qwen2_vl"])
    ids = [*IMAGE_PROMPT, 1, *VIDEO_PROMPT]
    expected = process(family, MmInput(ids, [picture], [video]))
    with WorkerPool(SPECS["qwen2_vl"], {"workers": 1, "cache_mib": 64, "ring_mib": 64}) as pool:
        monkeypatch.setattr(cache_module, "blake3", counting)  # after the cache's fingerprint of the spec
        with pool.process(ids, [picture], videos=[video]) as first:
            assert_same(first, expected)
            assert first.cache_hits == 0
        with pool.process(ids, [picture], videos=[video]) as second:  # the image from the cache, the video computed
            assert_same(second, expected)
            assert second.cache_hits == 1 and second.worker == 0 and second.busy_ms > 0
        assert hashed == [len(picture)] * 2  # the image's bytes keyed the cache; the video's never
        hashed.clear()
        for _ in range(2):
            with pool.process(VIDEO_PROMPT, [], videos=[video]) as alone:  # never answered from the cache
                assert alone.ok and alone.cache_hits == 0 and alone.worker == 0
                assert alone.items[0].feature.tobytes() == expected.items[1].feature.tobytes()
        stats = pool.stats()
        assert hashed == [] and (stats.cache_entries, stats.cache_misses, stats.cache_hits) == (1, 1, 1)


def test_replies_keep_submission_order_when_videos_and_images_interleave():
    family = pipeline_from_spec(SPECS["qwen2_vl"])
    requests = [  # the first is the slowest by far: the next ones finish before it on the other worker
        (VIDEO_PROMPT, [], [heavy()]),
        (IMAGE_PROMPT, [image(64, 48, 8)], []),
        ([*IMAGE_PROMPT, *VIDEO_PROMPT], [image(96, 64, 8)], [short(8)]),
        (VIDEO_PROMPT, [], [short(9)]),
        (IMAGE_PROMPT * 2, [image(64, 48, 9), image(64, 48, 10)], []),
        ([*VIDEO_PROMPT, *IMAGE_PROMPT, *VIDEO_PROMPT], [image(64, 48, 11)], [short(10), short(11)]),
    ]
    expected = [process(family, MmInput(*request)) for request in requests]
    with WorkerPool(SPECS["qwen2_vl"], {"workers": 2, "cache_mib": 0, "ring_mib": 128}) as pool:
        rids = [pool.submit(ids, images, videos=videos) for ids, images, videos in requests]
        replies = wait_replies(pool, len(requests))
        assert [reply.request_id for reply in replies] == rids
        # The second finished before the first (its reply was ready sooner, though submitted later).
        assert replies[1].latency_ms < replies[0].latency_ms
        for reply, want in zip(replies, expected, strict=True):
            assert_same(reply, want)
            reply.release()


def test_nothing_is_left_after_videos_accepted_rejected_cancelled_and_dropped(tmp_path):
    before = open_fds()
    path = tmp_path / "a.mp4"
    path.write_bytes(short(12))
    server = MediaServer()
    try:
        url = server.put("b.mp4", short(13))
        pool = WorkerPool(SPECS["qwen2_vl"], {"workers": 1, "cache_mib": 16, "ring_mib": 64, "media": TEST_MEDIA})
        pids = [*pool.worker_pids(), pool.io_pid()]
        accepted = pool.process([*IMAGE_PROMPT, *VIDEO_PROMPT, *VIDEO_PROMPT], [image(64, 48, 12)],
                                videos=[str(path), url])  # fmt: skip
        assert accepted.ok, accepted.error
        rejected = pool.process(VIDEO_PROMPT, [], videos=[b"not a video"])
        assert rejected.kind is Outcome.BAD_INPUT and rejected.error.startswith("video 0: video decode: ")
        cancelled = pool.submit(VIDEO_PROMPT, [], videos=[short(14)])
        assert pool.cancel(cancelled)
        dropped = pool.process(VIDEO_PROMPT, [], videos=[short(15)])
        feature = dropped.items[0].feature
        dropped.release_on_drop()
        del dropped
        accepted.release()
        # The cancelled job's answer comes after its "aborted" reply: it is dropped and its memory freed.
        [aborted] = wait_replies(pool, 1)
        assert aborted.request_id == cancelled and aborted.kind is Outcome.ABORTED
        assert pool.stats().shm_held_bytes >= feature.nbytes  # a view of the dropped reply is still alive
        del feature
        gc.collect()
        deadline = time.monotonic() + 10
        while (pool.stats().shm_held_bytes or pool.stats().in_flight) and time.monotonic() < deadline:
            pool.poll(0.05)
        stats = pool.stats()
        assert (stats.shm_held_bytes, stats.in_flight, stats.request_ring_used_bytes) == (0, 0, 0)
        pool.close()
        assert all(ended(pid) for pid in pids)
    finally:
        server.stop()
    del pool, accepted, rejected, aborted  # replies keep the rings they view mapped as long as they live
    gc.collect()
    assert open_fds() == before


def test_the_jobs_video_count_is_checked_by_the_worker(pool, monkeypatch):
    # The client is made to send a "videos" count that is not a count of the job's trailing source
    # frames: the worker answers INTERNAL naming it, and computes nothing.
    forged = {}

    def check(*args):
        inputs = check_inputs(*args)
        inputs.videos = forged["videos"]
        return inputs

    monkeypatch.setattr(client_module, "check_inputs", check)
    for bad in (2, -1, True, "1"):
        forged["videos"] = bad
        reply = pool.process(IMAGE_PROMPT, [image(64, 48, 13)])
        assert reply.kind is Outcome.INTERNAL, (bad, reply.kind, reply.error)
        assert reply.error == f"malformed job: videos {bad!r} of 1 source frame(s)"
    monkeypatch.undo()
    with pool.process(IMAGE_PROMPT, [image(64, 48, 13)]) as after:
        assert after.ok, after.error


def test_a_job_may_name_only_images_as_known_or_to_cache():
    # Videos are never cached: a Job naming one in "known" or "cache" is malformed (INTERNAL).
    job = Job(1, 0, 1000, {"kinds": "bb", "videos": 1}, [], [(0, 8), (8, 8), (16, 8)])
    assert worker_module._item_counts(job) == (1, 1)
    with pytest.raises(MmError, match=r"^malformed job: known items .*no image 1") as known:
        worker_module._known([[1, 1, 2, 2, 7]], 1)
    with pytest.raises(MmError, match=r"^malformed job: cache items \[1\] of 1 image\(s\)") as cached:
        worker_module._cached([1], 1)
    assert known.value.kind is cached.value.kind is Outcome.INTERNAL
    assert worker_module._cached([0], 1) == {0} and list(worker_module._known([[0, 1, 2, 2, 7]], 1)) == [0]


def test_a_done_whose_runs_or_modalities_do_not_fit_the_request_is_rejected(pool):
    # What a worker sends back is checked before a view reaches the caller: a Done (sent on the
    # worker's identity while it is stopped) whose modalities call the request's image a video, or
    # whose runs do not span its offsets, is answered INTERNAL.
    [slot] = pool._supervisor.slots
    [pid] = pool.worker_pids()
    bad_metas = [
        {"offsets": [[1, 2]], "runs": [[1, 2]], "modalities": ["VIDEO"], "hashes": [7]},
        {"offsets": [[1, 2]], "runs": [[1, 1]], "modalities": ["IMAGE"], "hashes": [7]},
        {"offsets": [[1, 2]], "runs": [[1]], "modalities": ["IMAGE"], "hashes": [7]},
    ]
    for meta in bad_metas:
        os.kill(pid, signal.SIGSTOP)
        try:
            rid = pool.submit(IMAGE_PROMPT, [image(64, 48, 14)])
            ids = TensorDesc(slot.index, 0, -1, 32, "<i8", (4,))
            feature = TensorDesc(slot.index, 64, -1, 16, "<f4", (1, 4))
            sender = ResultSender(os.dup(pool._res.results.sender_fd), slot.identity)
            try:
                sender.send(Done(slot.rid, {"input_ids": ids, "feature.0": feature}, meta))
            finally:
                sender.close()
            [reply] = wait_replies(pool, 1)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert reply.request_id == rid and reply.kind is Outcome.INTERNAL, (meta, reply.error)
        assert reply.error.startswith("internal error: bad result from worker 0: "), reply.error
    with pool.process(IMAGE_PROMPT, [image(64, 48, 14)]) as after:  # the worker's real answers were dropped
        assert after.ok, after.error


def test_the_io_process_fetches_a_video_under_the_video_cap_and_an_image_under_the_image_cap(pool, tmp_path):
    # An MP4 followed by 65 MiB of zeros (a sparse file): over the image cap, well under the video cap.
    path = tmp_path / "long.mp4"
    video = short(16)
    with open(path, "wb") as f:
        f.write(video)
        f.truncate(len(video) + (65 << 20))
    inputs = check_inputs(IMAGE_PROMPT + VIDEO_PROMPT, [str(path)], None, None, [str(path)])
    assert inputs.io_job()["caps"] == [MAX_FETCH_BYTES, MAX_VIDEO_FETCH_BYTES]
    with pool.process(VIDEO_PROMPT, [], videos=[str(path)]) as reply:
        assert reply.ok, reply.error
        assert reply.items[0].feature.tobytes() == process(
            pool.family, MmInput(VIDEO_PROMPT, [], [video])).items[0].feature.tobytes()  # fmt: skip
    refused = pool.process(IMAGE_PROMPT, [str(path)])
    assert refused.kind is Outcome.BAD_INPUT and f"exceeds {MAX_FETCH_BYTES} bytes" in refused.error, refused.error


def test_a_video_the_io_process_cannot_fetch_is_named_as_a_video(pool):
    # The I/O process knows each source's place among the request's items and how many are images.
    server = MediaServer()
    try:
        missing = server.url("/blob/absent.mp4")
        reply = pool.process([*IMAGE_PROMPT, *VIDEO_PROMPT, *VIDEO_PROMPT], [image(64, 48, 5)],
                             videos=[short(2), missing])  # fmt: skip
        assert reply.kind is Outcome.BAD_INPUT and reply.error.startswith("video 1: media fetch: "), reply.error
        assert "404" in reply.error, reply.error
    finally:
        server.stop()
