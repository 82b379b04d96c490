"""apply_layout and layout_by_placeholder: expansion, inclusive offsets and every coverage error."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mmworker import MmError
from mmworker.pipeline import (
    FEATURE_ALIGNMENT,
    Explicit,
    Media,
    Repeat,
    Text,
    apply_layout,
    layout_by_placeholder,
    numpy_allocator,
)

P = 99


def expand(ids, placeholder, counts):
    src = np.asarray(ids, np.int64)
    return apply_layout(src, layout_by_placeholder(src, placeholder, counts), len(counts))


def test_tv_l1_two_items():
    ids, offsets = expand([7, P, 8, P, 9], P, [2, 3])
    assert ids.tolist() == [7, P, P, 8, P, P, P, 9] and ids.dtype == np.int64
    assert offsets == [(1, 2), (4, 6)]


def test_tv_l2_no_placeholders_no_items():
    ids, offsets = expand([1, 2, 3], P, [])
    assert ids.tolist() == [1, 2, 3] and offsets == []


def test_tv_l3_explicit_content_range_excludes_wrappers():
    # InternVL-style: <img> + 512 context tokens + </img> for one image at prompt index 1.
    ids = [5, 6, 7]
    layout = (Text(range(0, 1)), Media(0, Explicit((1, *([2] * 512), 3), range(1, 513))), Text(range(2, 3)))
    out, offsets = apply_layout(np.array(ids), layout, 1)
    assert offsets == [(2, 513)]
    assert len(out) == 1 + 514 + 1 and out[1] == 1 and out[514] == 3


def test_adjacent_placeholders_and_empty_text_ranges():
    layout = (Text(range(0, 0)), Media(0, Repeat(P, 2)), Media(1, Repeat(P, 1)), Text(range(2, 2)))
    out, offsets = apply_layout(np.array([P, P]), layout, 2)
    assert out.tolist() == [P, P, P] and offsets == [(0, 1), (2, 2)]


def test_placeholder_count_mismatch():
    with pytest.raises(MmError, match=r"^prompt has 1 media placeholder\(s\) but 2 media item\(s\)$"):
        expand([7, P, 8], P, [4, 4])


ERRORS = [
    ((Text(range(0, 5)),), 1, r"layout: text range 0..5 out of bounds"),
    ((Text(range(1, 3)),), 0, r"layout: text range 1..3 does not resume at source index 0"),
    ((Text(range(0, 3)), Media(0, Repeat(P, 1))), 1, r"layout: media item 0 has no source placeholder at index 3"),
    ((Media(0, Repeat(P, 0)), Text(range(1, 3))), 1, r"layout: media item 0 expands to zero tokens"),
    ((Media(0, Explicit((), range(0, 0))), Text(range(1, 3))), 1, r"layout: media item 0 expands to zero tokens"),
    ((Media(0, Explicit((1, 2), range(1, 3))), Text(range(1, 3))), 1,
     r"layout: media item 0 content range 1..3 outside its 2 token\(s\)"),
    ((Media(0, Explicit((1, 2), range(1, 1))), Text(range(1, 3))), 1,
     r"layout: media item 0 content range 1..1 outside its 2 token\(s\)"),
    ((Media(3, Repeat(P, 1)), Text(range(1, 3))), 1, r"layout: media item 3 out of range"),
    ((Media(0, Repeat(P, 1)), Media(0, Repeat(P, 1)), Text(range(2, 3))), 1, r"layout: media item 0 placed twice"),
    ((Text(range(0, 2)),), 0, r"layout: covers 2 of 3 source token\(s\)"),
    ((Media(0, Repeat(P, 1)), Text(range(1, 3))), 2, r"layout: media item 1 not placed"),
]  # fmt: skip


@pytest.mark.parametrize(("layout", "n_items", "message"), ERRORS)
def test_layout_errors(layout, n_items, message):
    with pytest.raises(MmError, match=rf"^{message}$"):
        apply_layout(np.array([1, P, 3]), layout, n_items)


def sglang_expand(ids, placeholder, counts):
    """SGLang's _expand_input_ids + get_mm_items_offset, written the way SGLang writes them."""
    out, k = [], 0
    for token in ids:
        if token == placeholder:
            out.extend([placeholder] * counts[k])
            k += 1
        else:
            out.append(token)
    offsets, i = [], 0
    while i < len(out):
        if out[i] == placeholder:
            j = i
            while j + 1 < len(out) and out[j + 1] == placeholder:
                j += 1
            offsets.append((i, j))
            i = j + 1
        else:
            i += 1
    return out, offsets


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.lists(st.integers(0, 50), max_size=6), min_size=1, max_size=6),
    counts=st.lists(st.integers(1, 40), max_size=5),
)
def test_matches_sglang_expansion(text, counts):
    counts = counts[: len(text) - 1]
    ids = []
    for k, run in enumerate(text):
        ids.extend(run)
        if k < len(counts):
            ids.append(P)
    ours, offsets = expand(ids, P, counts)
    theirs, their_offsets = sglang_expand(ids, P, counts)
    assert ours.tolist() == theirs
    # get_mm_items_offset finds runs, so it can only tell items apart when text separates them.
    assume(all(len(run) > 0 for run in text[1 : len(counts)]))
    assert offsets == their_offsets


@pytest.mark.parametrize(
    "shape, dtype", [((3, 1176), np.float32), ((1, 7), np.uint16), ((5,), np.int64), ((2, 3, 4), np.uint8)]
)
def test_numpy_allocator_gives_line_aligned_writable_arrays_of_the_shape(shape, dtype):
    # Line-aligned as a ring slot is, so the kernels take their streaming path in process too.
    arrays = [numpy_allocator(shape, np.dtype(dtype)) for _ in range(8)]
    for a in arrays:
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % FEATURE_ALIGNMENT == 0
        a[...] = 1
    assert all(a.sum() == a.size for a in arrays)  # none overlaps another
