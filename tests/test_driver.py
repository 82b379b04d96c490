"""driver.process: the fixed request steps, budgets, error precedence, and the single-thread contract."""

import base64
import io
import os
import threading

import numpy as np
import pytest
from httpserver import MediaServer
from PIL import Image

from mmworker import MmError
from mmworker.common.budget import MAX_ITEMS_PER_REQUEST, MAX_REQUEST_BYTES
from mmworker.common.hashing import content_hash
from mmworker.driver import MmInput, process
from mmworker.pipeline import MRope
from mmworker.registry import pipeline_from_spec

P = 1
TINY = {"family": "qwen_vl", "image_token_id": P, "patch_size": 2, "merge_size": 2, "temporal_patch_size": 2,
        "min_pixels": 4, "max_pixels": 2**30, "image_mean": [0, 0, 0], "image_std": [1, 1, 1]}  # fmt: skip


def png(h, w, seed=0):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def family():
    return pipeline_from_spec(TINY)


def test_tv_d1(family):
    img = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    out = process(family, MmInput([7, P, 8], [buf.getvalue()]))
    assert out.input_ids.tolist() == [7, 1, 1, 1, 1, 8] and out.input_ids.dtype == np.int64
    assert out.offsets == ((1, 4),)
    item = out.items[0]
    assert item.feature.shape == (16, 24) and item.aux["image_grid_thw"].tolist() == [1, 4, 4]
    assert item.hash == content_hash(buf.getvalue())
    assert isinstance(out.positions, MRope) and out.positions.positions.shape == (3, 6)


def test_items_in_prompt_order_with_offsets(family):
    a, b = png(8, 8, 1), png(4, 12, 2)  # 4 and 3 tokens
    out = process(family, MmInput([5, P, 6, P], [a, b]))
    assert out.offsets == ((1, 4), (6, 8)) and len(out.input_ids) == 9
    assert [i.hash for i in out.items] == [content_hash(a), content_hash(b)]
    assert [i.aux["image_grid_thw"].tolist() for i in out.items] == [[1, 4, 4], [1, 2, 6]]


def test_features_are_written_into_the_callers_buffers(family):
    handed_out = []

    def alloc(shape, dtype):
        handed_out.append(np.full(shape, np.nan, dtype))
        return handed_out[-1]

    out = process(family, MmInput([P, P], [png(8, 8), png(8, 8, 3)]), alloc=alloc)
    assert [i.feature is buf for i, buf in zip(out.items, handed_out, strict=True)] == [True, True]
    assert not np.isnan(handed_out[0]).any()


def test_no_images(family):
    with pytest.raises(MmError, match=r"^multimodal request without image sources$"):
        process(family, MmInput([P], []))


def test_too_many_items_checked_before_anything_is_fetched(family):
    assert MAX_ITEMS_PER_REQUEST == 64
    fetched = []
    sources = ["/nonexistent"] * 65
    with pytest.raises(MmError, match=r"^multimodal request exceeds 64 media items$"):
        process(family, MmInput([P] * 65, sources), fetch=lambda s, b: fetched.append(s))
    assert fetched == []


def test_total_bytes_budget(family):
    assert MAX_REQUEST_BYTES == 1_342_177_280
    data = png(8, 8)
    half = len(data) * 2 // 2 + 1  # TV-F4 shape: two sources of budget/2 + 1 bytes
    with pytest.raises(MmError, match=rf"^multimodal request exceeds {2 * half - 2} total media bytes$"):
        process(family, MmInput([P, P], [data + bytes(half - len(data)), data + bytes(half - len(data))]),
                max_request_bytes=2 * half - 2)  # fmt: skip


def test_budget_is_shared_with_fetched_sources(family, tmp_path):
    data = png(8, 8)
    path = tmp_path / "a.png"
    path.write_bytes(data)
    budget = len(data) + len(data) // 2
    with pytest.raises(MmError, match=r"^image 1: media fetch: .*exceeds the request media byte budget$"):
        process(family, MmInput([P, P], [data, str(path)]), max_request_bytes=budget)


def test_missing_prompt_and_image_error_precedence(family):
    with pytest.raises(MmError, match=r"^multimodal request without text or input_ids$"):
        process(family, MmInput([], [png(8, 8)]))
    with pytest.raises(MmError, match="decode"):  # the image error wins over the missing prompt
        process(family, MmInput([], [b"not an image"]))


def test_lowest_index_error_is_reported(family):
    with pytest.raises(MmError, match=r"^image 1: image decode: The image format could not be determined$"):
        process(family, MmInput([P, P, P], [png(8, 8), b"junk", b"\x89PNG\r\n\x1a\n"]))


def test_placeholder_mismatch(family):
    with pytest.raises(MmError, match=r"^prompt has 1 media placeholder\(s\) but 2 media item\(s\)$"):
        process(family, MmInput([7, P], [png(8, 8), png(8, 8)]))


def test_source_types(family):
    data = png(8, 8)
    b64 = base64.b64encode(data).decode()
    out = process(
        family,
        MmInput([P, P, P, P], [data, bytearray(data), memoryview(data), "data:image/png;base64," + b64]),
    )
    assert len({i.hash for i in out.items}) == 1
    with pytest.raises(MmError, match=r"^image 0: source must be a string or bytes, got int$"):
        process(family, MmInput([P], [42]))


def test_tv_f5_same_image_by_url_file_uri_and_path(family, tmp_path):
    data = png(4, 12, 7)  # 2 x 6 patches -> 3 tokens
    path = tmp_path / "img.png"
    path.write_bytes(data)
    server = MediaServer()
    try:
        sources = [server.put("img.png", data), f"file://{path}", str(path)]
        out = process(family, MmInput([10, P, 20, P, 30, P, 40, 50], sources))
    finally:
        server.stop()
    assert len({i.hash for i in out.items}) == 1 and out.items[0].hash == content_hash(data)
    assert len(out.input_ids) == 5 + 3 * 3
    for item in out.items[1:]:
        np.testing.assert_array_equal(item.feature, out.items[0].feature)


def test_two_image_request_starts_no_threads():
    # The crate's rlib_is_single_threaded test, same inputs: PNG 112x112 and 84x140.
    family = pipeline_from_spec({**TINY, "patch_size": 14, "min_pixels": 3136, "max_pixels": 12845056})
    images = [png(112, 112), png(140, 84)]
    process(family, MmInput([7, P, 8, P, 9], images))  # first call may load the numba kernels
    before_threads, before_tasks = threading.active_count(), set(os.listdir("/proc/self/task"))
    out = process(family, MmInput([7, P, 8, P, 9], images))
    assert len(out.items) == 2
    assert threading.active_count() == before_threads
    assert set(os.listdir("/proc/self/task")) == before_tasks


def test_driver_parity_with_rust_extension(rust_ext):
    import json

    spec = {**TINY, "patch_size": 14, "min_pixels": 3136, "max_pixels": 1003520,
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}  # fmt: skip
    images = [png(112, 112, 4), png(90, 141, 5)]
    ids = [7, P, 8, P, 9]
    for resample in ("aten_u8", "pil"):
        s = {**spec, "resample": resample}
        out = process(pipeline_from_spec(s), MmInput(ids, images))
        r_ids, r_feat, r_grids, r_hashes, r_offsets, r_mrope, r_delta = rust_ext.qwen_vl.process_mm(
            ids, images, json.dumps(s)
        )
        assert out.input_ids.tolist() == list(r_ids)
        np.testing.assert_array_equal(np.concatenate([i.feature for i in out.items]).reshape(-1), np.asarray(r_feat))
        assert [tuple(i.aux["image_grid_thw"]) for i in out.items] == [tuple(g) for g in r_grids]
        assert [i.hash for i in out.items] == list(r_hashes)
        assert list(out.offsets) == [tuple(o) for o in r_offsets]
        np.testing.assert_array_equal(out.positions.positions.reshape(-1), np.asarray(r_mrope))
        assert out.positions.delta == r_delta
