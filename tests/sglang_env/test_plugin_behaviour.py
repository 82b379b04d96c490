"""The plug-in's behaviour around the parity: concurrency, errors, delegation, memory, processes.

One plug-in (qwen2_5_vl, torchvision backend) and SGLang's own processor for the same settings.
"""

import asyncio
import gc
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from fastapi import HTTPException
from PIL import Image
from plugin_env import (
    TOKENIZER,
    Request,
    builtin_class,
    encoded,
    hf_config,
    hf_processor,
    plugin_class,
    prompt,
    run,
    server_args,
)
from processes import all_end_within, ended, line_within, segments_of
from sglang.srt.utils import ImageData
from test_plugin_parity import assert_same

from mmworker.sglang.qwen_vl import UNREPRODUCED, ImageRejected, PoolBusy
from mmworker.sglang.requests import Delegated, Served, route

MODEL = "qwen2_5_vl"


def configured(monkeypatch, tmp_path, toml: str):
    """SGLang's arguments published, with MMWORKER_SGLANG_CONFIG naming a pool.toml of `toml`."""
    config = tmp_path / "pool.toml"
    config.write_text(toml)
    monkeypatch.setenv("MMWORKER_SGLANG_CONFIG", str(config))
    return server_args()


@pytest.fixture(scope="module")
def pair():
    args = server_args()
    config = hf_config(MODEL)
    builtin = builtin_class(MODEL)(config, args, hf_processor(MODEL, "torchvision"), "default")
    plugin = plugin_class(MODEL)(config, args, hf_processor(MODEL, "torchvision"), "default")
    yield builtin, plugin
    plugin.shutdown()
    builtin.shutdown()


def test_many_requests_in_flight(pair):
    """48 requests at once through asyncio.gather: each gets exactly its own result."""
    builtin, plugin = pair
    requests = []
    for k in range(48):
        n = 1 + k % 3
        images = [
            encoded(160 + 7 * k + 13 * j, 120 + 5 * k, "PNG" if (k + j) % 2 else "JPEG", seed=k * 3 + j)
            for j in range(n)
        ]
        requests.append((images, prompt(n)))
    expected = [run(builtin, images, text) for images, text in requests]
    before = plugin.stats()["served"]

    async def all_at_once():
        calls = [
            plugin.process_mm_data_async(image_data=images, input_text=text, request_obj=Request(rid=str(k)))
            for k, (images, text) in enumerate(requests)
        ]
        return await asyncio.gather(*calls)

    outputs = asyncio.run(all_at_once())
    assert plugin.stats()["served"] == before + len(requests)
    for ours, theirs in zip(outputs, expected, strict=True):
        assert_same(ours, theirs)


def test_bad_images_are_named_and_the_pool_keeps_serving(pair, tmp_path):
    _, plugin = pair
    good = encoded(64, 48, "PNG", 1)
    truncated = encoded(640, 480, "JPEG", 2)[:300]
    cases = [
        ([good, truncated], "image 1"),
        ([str(tmp_path / "missing.png")], "missing.png"),
        ([b"not an image at all"], "image 0"),
    ]
    for images, named in cases:
        with pytest.raises(ImageRejected) as err:
            run(plugin, images, prompt(len(images)))
        assert isinstance(err.value, ValueError)  # SGLang answers a ValueError with 400
        assert named in str(err.value), str(err.value)
    out = run(plugin, [good], prompt(1))
    assert out.mm_items[0].feature.shape[0] > 0


def test_images_mmworker_does_not_decode_go_to_sglang(pair):
    """A TIFF and a 16-bit PNG: the workers refuse them by name, the request is served by SGLang's own path."""
    builtin, plugin = pair
    tiff, png16 = io.BytesIO(), io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(tiff, "TIFF")
    Image.fromarray((np.arange(40 * 60, dtype=np.uint16) * 17).reshape(40, 60)).save(png16, "PNG")
    for data in (tiff.getvalue(), png16.getvalue()):
        before = plugin.stats()
        ours = run(plugin, [data], prompt(1))
        after = plugin.stats()
        assert after["served"] == before["served"] and after["delegated"] == before["delegated"] + 1, after
        assert (
            after["delegated_by_reason"].get(UNREPRODUCED, 0) == before["delegated_by_reason"].get(UNREPRODUCED, 0) + 1
        )
        assert_same(ours, run(builtin, [data], prompt(1)), served=False)


def test_requests_outside_the_plan_are_delegated_unchanged(pair):
    builtin, plugin = pair
    pil_image = Image.fromarray(np.full((50, 70, 3), 120, np.uint8))
    delegated = [
        ([pil_image], prompt(1)),  # a PIL image (the offline engine's form)
        ([encoded(64, 48, "PNG", 3)], "hello <image> world"),  # SGLang's legacy sentinel
    ]
    for images, text in delegated:
        before = plugin.stats()
        try:
            theirs = run(builtin, images, text)
        except Exception as exc:  # the built-in's own answer to this request, which the plug-in must give too
            with pytest.raises(type(exc)):
                run(plugin, images, text)
        else:
            assert_same(run(plugin, images, text), theirs, served=False)
        after = plugin.stats()
        assert after["delegated"] == before["delegated"] + 1 and after["served"] == before["served"], after


def test_route_reasons(pair):
    """The router's decisions, one per rule (no images run)."""
    _, plugin = pair
    p = plugin._prompting
    png = encoded(8, 8, "PNG", 0)

    one_image = prompt(1)

    def decide(images, text=one_image, req=None, urls=True):
        req = req or Request()
        return route(images, text, req, p, urls=urls, avoid_retokenize=True, image_data_type=ImageData)

    assert isinstance(decide([png]), Served)
    assert decide([png]).prompt == TOKENIZER.encode(prompt(1))
    assert isinstance(decide([png], req=Request(video_data=["v.mp4"])), Delegated)
    assert isinstance(decide([bytearray(png)]), Delegated)
    assert isinstance(decide([{"format": "processor_output"}]), Delegated)
    assert isinstance(decide([ImageData(url="/x.png", max_long_side_pixel=512)]), Delegated)
    assert decide([ImageData(url="/x.png")]).sources == ["/x.png"]
    assert decide(["file:///a%20b/c.png"]).sources == ["/a b/c.png"]
    assert isinstance(decide(["http://127.0.0.1/x.png"], urls=False), Delegated)
    assert decide(["http://127.0.0.1/x.png"]).sources == ["http://127.0.0.1/x.png"]
    assert isinstance(decide(["data:image/png;base64, QUFB"]), Delegated)  # SGLang's decoder rejects the space
    assert isinstance(decide([png, png]), Delegated)  # one placeholder, two images
    assert isinstance(decide([png], text="hi <|vision_start|><|image_pad|><|image_pad|><|vision_end|>"), Delegated)
    assert isinstance(decide([png], text=prompt(1) + " <|video_pad|>"), Delegated)
    assert isinstance(decide([]), Delegated)


def test_queue_full_is_a_503(monkeypatch, tmp_path):
    """A full queue raises PoolBusy: an HTTPException with status 503 and a ValueError with status_code 503."""
    args = configured(monkeypatch, tmp_path, "queue_depth = 1\n")
    plugin = plugin_class(MODEL)(hf_config(MODEL), args, hf_processor(MODEL, "torchvision"), "default")
    try:
        images = [encoded(800, 600, "JPEG", k) for k in range(6)]

        async def burst():
            return await asyncio.gather(
                *(
                    plugin.process_mm_data_async(image_data=[im], input_text=prompt(1), request_obj=Request())
                    for im in images
                ),
                return_exceptions=True,
            )

        results = asyncio.run(burst())
        busy = [r for r in results if isinstance(r, Exception)]
        assert busy and all(isinstance(e, PoolBusy) for e in busy), results
        assert all(isinstance(e, HTTPException) and e.status_code == 503 and isinstance(e, ValueError) for e in busy)
        assert "queue full" in str(busy[0])
        assert len(busy) < len(images)
        assert plugin.stats()["rejected_by_kind"].get("queue_full") == len(busy)
        run(plugin, [images[0]], prompt(1))  # and it keeps serving
    finally:
        plugin.shutdown()


def mapped_spans(marker: str) -> list[tuple[int, int]]:
    with open("/proc/self/maps") as maps:
        return [tuple(int(v, 16) for v in line.split()[0].split("-")) for line in maps if marker in line]


def test_features_view_shared_memory_and_come_back_when_dropped(pair):
    """Zero copy: the feature tensor points into the pool's cache partition (the image is cached as it
    is computed), the rest of the reply into the worker's ring; dropping the output gives the ring
    memory back and unpins the entry, and the same image again is a cache hit, the same output."""
    _, plugin = pair
    pool = plugin._pool
    image = encoded(640, 480, "JPEG", 4)
    out = run(plugin, [image], prompt(1))
    feature = out.mm_items[0].feature
    address = feature.data_ptr()
    assert any(lo <= address < hi for lo, hi in mapped_spans("/memfd:mmw-cache")), "not a view of the cache"
    positions = out.mrope_positions.data_ptr()
    assert any(lo <= positions < hi for lo, hi in mapped_spans("/dev/shm/mmw-")), "not a view of a worker's ring"
    assert pool.stats().shm_held_bytes > 0
    first = feature.clone()
    del out, feature
    gc.collect()
    pool.poll(0)
    assert pool.stats().shm_held_bytes == 0
    hits = pool.stats().cache_hits
    again = run(plugin, [image], prompt(1))
    assert pool.stats().cache_hits == hits + 1 and again.mm_items[0].feature.equal(first)


def test_a_result_larger_than_the_ring_goes_to_sglang(monkeypatch, tmp_path):
    """Features that cannot fit a worker's ring even empty (UNSUPPORTED at once): SGLang's own path serves them."""
    args = configured(monkeypatch, tmp_path, "ring_mib = 16\ncache_mib = 0\n")  # no cache to hold them either
    builtin = builtin_class(MODEL)(hf_config(MODEL), args, hf_processor(MODEL, "torchvision"), "default")
    plugin = plugin_class(MODEL)(hf_config(MODEL), args, hf_processor(MODEL, "torchvision"), "default")
    try:
        image = encoded(1000, 700, "JPEG", 6)  # 72 x 50 patches: 16.9 MB of features, over a 16 MiB ring
        started = time.monotonic()
        ours = run(plugin, [image], prompt(1))
        assert time.monotonic() - started < 20  # no wait for room that cannot come
        stats = plugin.stats()
        assert stats["served"] == 0 and stats["delegated"] == 1, stats
        assert_same(ours, run(builtin, [image], prompt(1)), served=False)
    finally:
        plugin.shutdown()
        builtin.shutdown()


def test_features_held_too_long_give_a_clear_error(monkeypatch, tmp_path):
    """Outputs kept past the ring's size: a clear 503 'shared memory full' error, no hang; dropping them heals it."""
    # The same image each time: without the cache, each a worker's, each held in its ring.
    args = configured(monkeypatch, tmp_path, "ring_mib = 16\nmemory_wait_s = 0.5\ncache_mib = 0\n")
    plugin = plugin_class(MODEL)(hf_config(MODEL), args, hf_processor(MODEL, "torchvision"), "default")
    try:
        image = encoded(500, 350, "JPEG", 5)  # 900 patches: 4.2 MB of features each
        kept = []
        started = time.monotonic()
        with pytest.raises(PoolBusy) as err:
            for _ in range(10):
                kept.append(run(plugin, [image], prompt(1)))
        assert time.monotonic() - started < 30
        message = str(err.value)
        assert "shared memory full" in message and "release" in message, message
        kept.clear()
        gc.collect()
        assert run(plugin, [image], prompt(1)).mm_items[0].feature.shape[0] > 0
    finally:
        plugin.shutdown()


def test_sglang_cache_flags_size_the_pools_cache_and_trust_caller_hashes(tmp_path):
    """--mm-preprocess-cache-size-mb sizes the cache (split over tokenizer workers, 0 turns it off);
    --trust-mm-content-hashes lets SGLang's per-image content hashes key it: two different images
    with the same hash then share an entry, as SGLang's own cache would serve them."""
    a, b = encoded(320, 240, "JPEG", 7), encoded(320, 240, "JPEG", 8)
    same = "sha256:" + "ab" * 32
    for flags, cache_mib, trusted in (({"mm_preprocess_cache_size_mb": 0}, 0, False),
                                      ({"mm_preprocess_cache_size_mb": 64, "trust_mm_content_hashes": True}, 64, True)):  # fmt: skip
        args = server_args(**flags)
        plugin = plugin_class(MODEL)(hf_config(MODEL), args, hf_processor(MODEL, "torchvision"), "default")
        try:
            config = plugin._pool.config
            assert (config.cache_mib, config.trust_content_hashes) == (cache_mib, trusted)
            first = run(plugin, [a], prompt(1), mm_content_hashes=[same])
            second = run(plugin, [b], prompt(1), mm_content_hashes=[same])
            stats = plugin._pool.stats()
            assert stats.cache_hits == (1 if trusted else 0)
            assert second.mm_items[0].feature.equal(first.mm_items[0].feature) is trusted
        finally:
            plugin.shutdown()


_CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.path[:0] = [{tests!r}]
    import plugin_env as c
    args = c.server_args(**json.loads(sys.argv[1]))
    plugin = c.plugin_class("qwen2_5_vl")(c.hf_config("qwen2_5_vl"), args, c.hf_processor("qwen2_5_vl", "torchvision"),
                                           "default", **json.loads(sys.argv[2]))
    pool = plugin._pool
    info = {{"workers": pool.worker_pids() + [pool.io_pid()] if pool else [], "children": os.listdir(f"/proc/{{os.getpid()}}/task")}}
    if pool:
        c.run(plugin, [c.encoded(64, 48, "PNG", 1)], c.prompt(1))
    maps = open("/proc/self/maps").read()
    info["shm_mapped"] = "/dev/shm/mmw-" in maps or "(deleted)" in maps and "mmw-" in maps
    print(json.dumps(info), flush=True)
    if sys.argv[3] == "wait":
        sys.stdin.read()
    """
)


def _child(tmp_path, kwargs: dict, construct: dict, mode: str) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=os.path.dirname(__file__)))
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps(kwargs), json.dumps(construct), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_scheduler_role_starts_nothing(tmp_path):
    """With skip_mm_pool=True (the scheduler's M-RoPE-only instance): no process, no shared memory."""
    proc = _child(tmp_path, {}, {"skip_mm_pool": True}, "exit")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    info = json.loads(out.strip().splitlines()[-1])
    assert info["workers"] == [] and not info["shm_mapped"], info
    assert not segments_of(proc.pid)


def test_normal_exit_and_sigkill_leave_nothing(tmp_path):
    proc = _child(tmp_path, {}, {}, "exit")  # exits without shutdown(): the pool's own finalizers clean up
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    workers = json.loads(out.strip().splitlines()[-1])["workers"]
    assert len(workers) >= 2 and all_end_within(workers, 10.0), "workers outlived a normal exit"
    assert not segments_of(proc.pid), "a shared-memory segment outlived a normal exit"
    proc = _child(tmp_path, {}, {}, "wait")
    workers = json.loads(line_within(proc.stdout, 300, "the child's report"))["workers"]
    assert not any(ended(p) for p in workers)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert all_end_within(workers, 10.0), "workers outlived a SIGKILL of the serving process"
    assert not segments_of(proc.pid), "a shared-memory segment outlived a SIGKILL"
