"""Fuzz targets (hypothesis): the wire decoder, base64/data: parsing, NO_PROXY, apply_layout, the media
policy and the image decoders, on random and mutated inputs. The budget is MMWORKER_FUZZ_EXAMPLES
examples per target (CI: a few hundred; scripts/fuzz.sh: many thousands). Seeds live in
tests/fuzz_corpus (wire frames) and tests/golden/decode (images)."""

import os
import re
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipc.errors import WireError
from ipc.wire import Done, decode
from mmworker import MmError
from mmworker.common.budget import ByteBudget
from mmworker.common.decode import decode_image
from mmworker.common.fetch import fetch_bytes
from mmworker.common.inline import base64_decode
from mmworker.common.noproxy import no_proxy_matches
from mmworker.common.policy import MediaPolicy
from mmworker.pipeline import Explicit, Media, Repeat, Text, apply_layout

HERE = Path(__file__).resolve().parent
EXAMPLES = int(os.environ.get("MMWORKER_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
WIRE_SEEDS = [p.read_bytes() for p in sorted((HERE / "fuzz_corpus" / "wire").glob("*.bin"))]
IMAGE_SEEDS = [p.read_bytes() for p in sorted((HERE / "golden" / "decode").iterdir()) if p.is_file()]


@st.composite
def mutated(draw, seeds):
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 8))):
        op = draw(st.integers(0, 3))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == 0 and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == 1:
            data[pos:pos] = draw(st.binary(max_size=8))
        elif op == 2 and data:
            del data[pos : pos + draw(st.integers(1, 16))]
        else:
            data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@FUZZ
@given(st.one_of(mutated(WIRE_SEEDS), st.binary(max_size=256)), st.lists(st.binary(max_size=8), max_size=3))
def test_wire_decoder(header, payload):
    try:
        message, frames = decode([header, *payload])
    except WireError:
        return
    assert frames == payload
    if isinstance(message, Done):
        for desc in message.tensors.values():
            assert all(isinstance(v, int) for v in (desc.ring, desc.offset, desc.seq, desc.nbytes))


@FUZZ
@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n\t,:;data", max_size=80))
def test_base64_and_data_urls(text):
    for source in (text, "data:" + text, "data:image/png;base64," + text):
        try:
            assert isinstance(fetch_bytes(source, ByteBudget(1 << 16)), bytes)
        except MmError as exc:
            assert str(exc).startswith("media fetch: ")
    try:
        base64_decode(text)
    except MmError as exc:
        assert str(exc).startswith("media fetch: base64 decode: ")


@FUZZ
@given(st.text(max_size=60), st.text(max_size=60))
def test_no_proxy_matching(host_part, entries):
    for url in (f"http://{host_part}/x", f"https://{host_part}", host_part):
        assert isinstance(no_proxy_matches(url, entries), bool)


@FUZZ
@given(st.text(max_size=40), st.text(max_size=60))
def test_media_policy(address, url):
    policy = MediaPolicy.safe()
    assert policy.address_refusal(address) is None or isinstance(policy.address_refusal(address), str)
    try:
        policy.check_url(url)
    except MmError as exc:
        assert str(exc).startswith("media fetch: ")


@FUZZ
@given(st.lists(st.one_of(
    st.builds(Text, st.builds(range, st.integers(-3, 10), st.integers(-3, 10))),
    st.builds(Media, st.integers(-2, 4), st.one_of(
        st.builds(Repeat, st.integers(0, 9), st.integers(-2, 6)),
        st.builds(Explicit, st.lists(st.integers(0, 9), max_size=5).map(tuple),
                  st.builds(range, st.integers(-2, 6), st.integers(-2, 6))))),
), max_size=8), st.integers(0, 4), st.integers(0, 8))  # fmt: skip
def test_apply_layout(layout, n_items, n_src):
    src = np.arange(n_src, dtype=np.int64)
    try:
        out, offsets = apply_layout(src, tuple(layout), n_items)
    except MmError as exc:
        assert str(exc).startswith("layout: ")
        return
    assert len(offsets) == n_items and all(0 <= s <= e < len(out) for s, e in offsets)


@FUZZ
@given(mutated(IMAGE_SEEDS))
def test_image_decoders(data):
    try:
        image = decode_image(data)
    except MmError as exc:
        assert str(exc).startswith("image decode: ") and not re.search(r"at 0x[0-9a-fA-F]", str(exc))
        return
    assert image.pixels.ndim == 3 and image.pixels.shape[2] in (3, 4) and image.pixels.dtype == np.uint8
