"""The family seam: every family declares what the layers above need, and a new family is one module
plus one registry line, served by the pool like the bundled ones (tests/toy_family.py)."""

import os

import numpy as np
import pytest
from conftest import TESTS
from processes import no_leaked_segments  # noqa: F401 (a fixture)

from mmworker import MmError, registry
from mmworker.corpus import encode, photo_like
from mmworker.driver import MmInput, process
from mmworker.inkling import decode_patchify
from mmworker.pipeline import MRope, Rope1D
from mmworker.pool import WorkerPool, to_sglang
from mmworker.registry import named_spec, pipeline_from_spec

TOY_SPEC = {"family": "toy", "start_id": 7001, "token_id": 7002, "end_id": 7003}
ONE_WORKER = {"workers": 1}


@pytest.fixture
def toy_registered(monkeypatch):
    """The one registry line a new family needs, here added at run time; the workers, fresh
    interpreters, find the module on their path."""
    monkeypatch.setitem(registry.FAMILIES, "toy", "toy_family:Toy")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(TESTS) + (os.pathsep + path if path else ""))


def images() -> list[bytes]:
    return [encode(photo_like(97, 61, seed=5), "PNG"), encode(photo_like(333, 250, seed=6), "JPEG")]


@pytest.mark.parametrize("name", sorted(registry.NAMED_SPECS))
def test_every_bundled_spec_declares_what_the_pool_cli_and_sglang_need(name):
    family = pipeline_from_spec(name)
    assert family.modality == "IMAGE" and family.describe().startswith(family.name)
    prompt = family.image_prompt()
    assert prompt and all(isinstance(token, int) for token in prompt)
    assert family.token_ids()["im_token_id"] in prompt
    # The warm-up request a worker runs before its first job: the family's images, each standing
    # in the prompt as the family says, between text tokens.
    sources = [encode(photo_like(w, h, seed=0), fmt) for w, h, fmt in family.warm_up_images()]
    ids = [1, 2]
    for _ in sources:
        ids += [*prompt, 3]
    out = process(family, MmInput(ids, sources))
    for item, (start, end) in zip(out.items, out.offsets, strict=True):
        data = family.model_data(item.aux)
        assert all(isinstance(v, np.ndarray) for v in data.values())
        assert 0 <= start <= end < len(out.input_ids)
    assert isinstance(out.positions, MRope if family.name == "qwen_vl" else Rope1D)


def test_inkling_in_the_pool_equals_its_library_functions():
    sources = images()
    prompt = [11, -101, 12, -101, 13]
    with WorkerPool("inkling", ONE_WORKER) as pool:
        reply = pool.process(prompt, sources, timeout=60)
        assert reply.ok, reply.error
        assert reply.positions is None and reply.delta is None
        expected = process(pipeline_from_spec("inkling"), MmInput(prompt, sources))
        np.testing.assert_array_equal(reply.input_ids, expected.input_ids)
        assert reply.offsets == list(expected.offsets)
        for got, data in zip(reply.items, sources, strict=True):
            h, w, bits = decode_patchify(data, 40, 2.0, 2048)
            assert got.feature.dtype == np.uint16 and got.feature.shape == (len(bits) // 4800, 4800)
            np.testing.assert_array_equal(got.feature.reshape(-1), bits)
            assert got.aux["image_size"].tolist() == [h, w]
        out = to_sglang(reply)
        assert "mrope_positions" not in out and out["im_token_id"] == -101
        assert [item["model_specific_data"] for item in out["mm_items"]] == [{}, {}]
        reply.release()


def test_a_new_family_is_one_module_plus_one_registry_line(toy_registered):
    sources = images()
    prompt = [5, 7002, 6, 7002]
    expected = process(pipeline_from_spec(TOY_SPEC), MmInput(prompt, sources))
    assert expected.input_ids.tolist() == [5, 7001, 7002, 7002, 7003, 6, 7001, 7002, 7002, 7003]
    with WorkerPool(TOY_SPEC, ONE_WORKER) as pool:
        reply = pool.process(prompt, sources, timeout=60)
        assert reply.ok, reply.error
        np.testing.assert_array_equal(reply.input_ids, expected.input_ids)
        assert reply.offsets == [(2, 3), (7, 8)] == list(expected.offsets)
        for got, item in zip(reply.items, expected.items, strict=True):
            np.testing.assert_array_equal(got.feature, item.feature)
            assert got.hash == item.hash
        out = to_sglang(reply)
        assert [item["modality"] for item in out["mm_items"]] == ["IMAGE", "IMAGE"]
        assert [item["model_specific_data"]["image_size"].tolist() for item in out["mm_items"]] == [
            [61, 97],
            [250, 333],
        ]
        assert (out["im_token_id"], out["im_start_id"], out["im_end_id"]) == (7002, 7001, 7003)
        assert "mrope_positions" not in out
        reply.release()


def test_a_family_the_registry_does_not_know_is_refused_before_any_process_starts():
    with pytest.raises(MmError, match=r"^unknown mm family: 'toy'; known: "):
        WorkerPool(TOY_SPEC, ONE_WORKER)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"patch_size": 0}, "inkling spec: patch_size must be greater than zero"),
        ({"patch_size": "40"}, "inkling spec: `patch_size` must be an integer, got '40'"),
        ({"rescale_image_frac": -1.0}, "inkling spec: scaled_dims: rescale_frac must be a positive finite number"),
        ({"rescale_image_max_upscaled_long_edge": 0}, "inkling spec: scaled_dims: rescale_cap must be positive"),
        ({"image_token_id": None}, "inkling spec: `image_token_id` must be an integer, got None"),
    ],
)
def test_inkling_spec_errors_name_the_key(change, message):
    with pytest.raises(MmError, match=f"^{message}"):
        pipeline_from_spec({**named_spec("inkling"), **change})
