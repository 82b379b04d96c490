"""Qwen-VL prompts with videos: expansion, offsets and M-RoPE (docs/behaviour.md §15), hand-checked and
against a plain transcription of SGLang's get_rope_index; the timestamp token table; the image path unchanged.

SGLang's and transformers' own code is the oracle in tests/sglang_env/test_qwen_video_layout_parity.py.
"""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmworker import MmError
from mmworker.pipeline import Grid, apply_layout
from mmworker.qwen_vl import NAMED_SPECS, QwenSpec, QwenVL, mrope_image_only
from mmworker.qwen_vl.mrope import mrope_rope_index
from mmworker.qwen_vl.video_layout import (
    TIMESTAMP_PIECES,
    VideoItem,
    VideoPromptRules,
    check_timestamp_table,
    expand_prompt,
    timestamp_text,
    timestamp_token_table,
    timestamp_tokens,
    video_prompt,
)

S, P, E, V = 1, 2, 3, 4  # <|vision_start|>, <|image_pad|>, <|vision_end|>, <|video_pad|>
# A hand-made table: "<" 60, digit d 40 + d, "." 50, " seconds>" two ids (as " seconds" and ">").
TABLE = {"<": [60], **{str(d): [40 + d] for d in range(10)}, ".": [50], " seconds>": [61, 62]}


def rules(model_type: str, **extra) -> VideoPromptRules:
    defaults = {"qwen2_5_vl": {"tokens_per_second": 2}, "qwen3_vl": {"timestamp_table": TABLE},
                "qwen3_5": {"timestamp_table": TABLE}}.get(model_type, {})  # fmt: skip
    return VideoPromptRules(model_type, 2, P, V, S, E, **{**defaults, **extra})


def rows(*triples):
    """Positions given token by token as (t, h, w), as [3, L]."""
    return np.array(triples, np.int64).T


# --- hand-checked cases --------------------------------------------------------------------------


def test_one_video_qwen2_vl():
    # grid (2, 4, 4): 2 * 4 * 4 / 4 = 8 pads; the merged grid is 2 x 2 x 2 at base 2.
    out = video_prompt([7, S, V, E, 8], [], [VideoItem((2, 4, 4))], rules("qwen2_vl"))
    assert out.input_ids.tolist() == [7, S, *[V] * 8, E, 8] and out.input_ids.dtype == np.int64
    assert out.image_offsets == () and out.video_offsets == (((2, 9),),)
    video = [(2 + t, 2 + h, 2 + w) for t in range(2) for h in range(2) for w in range(2)]
    np.testing.assert_array_equal(out.positions, rows((0, 0, 0), (1, 1, 1), *video, (4, 4, 4), (5, 5, 5)))
    assert out.delta == 6 - 12 and out.positions.dtype == np.int64


def test_one_video_qwen2_5_vl_time_axis():
    # 12 temporal patches of one merged token each; second_per_grid 2/24 and 2 tokens per second:
    # t index = int(k * 2/24 * 2) = k // 6, so the 12 tokens take times 0 (x6) and 1 (x6).
    video = VideoItem((12, 2, 2), second_per_grid=2 / 24)
    out = video_prompt([S, V, E], [], [video], rules("qwen2_5_vl"))
    assert out.input_ids.tolist() == [S, *[V] * 12, E] and out.video_offsets == (((1, 12),),)
    np.testing.assert_array_equal(out.positions[0], [0, *[1] * 6, *[2] * 6, 3])
    np.testing.assert_array_equal(out.positions[1:], [[0, *[1] * 12, 3]] * 2)
    assert out.delta == 4 - 14
    # mmworker.qwen_vl.video hands the float32 SGLang holds: the same float32 in the arithmetic.
    same = video_prompt([S, V, E], [], [VideoItem((12, 2, 2), np.float32(2 / 24))], rules("qwen2_5_vl"))
    np.testing.assert_array_equal(same.positions, out.positions)
    # Qwen2-VL counts every temporal patch: the end token comes 12 positions later.
    plain = video_prompt([S, V, E], [], [VideoItem((12, 2, 2))], rules("qwen2_vl"))
    np.testing.assert_array_equal(plain.positions[0], range(14))
    assert plain.positions[1].tolist() == [0, *[1] * 12, 13]


def test_qwen2_5_time_index_is_t_over_6_for_sglangs_frames():
    # video.md: with SGLang's 2/24 and 2 tokens per second, float32 arithmetic gives exactly t // 6
    # for every t SGLang can sample (at most 768 frames, 384 temporal patches), and well beyond.
    gt = 384
    out = video_prompt([S, V, E], [], [VideoItem((gt, 2, 2), second_per_grid=2 / 24)], rules("qwen2_5_vl"))
    np.testing.assert_array_equal(out.positions[0, 1 : 1 + gt] - 1, np.arange(gt) // 6)
    k = np.arange(100_000, dtype=np.float32)
    np.testing.assert_array_equal(((k * np.float32(2 / 24)) * np.float32(2)).astype(np.int64), np.arange(100_000) // 6)


def test_image_then_video_and_video_then_image():
    image, video = (1, 4, 2), VideoItem((2, 2, 4))  # 2 image tokens (2 x 1); 4 video tokens (2 x 1 x 2)
    out = video_prompt([S, P, E, S, V, E], [image], [video], rules("qwen2_vl"))
    assert out.input_ids.tolist() == [S, P, P, E, S, V, V, V, V, E]
    assert out.image_offsets == ((1, 2),) and out.video_offsets == (((5, 8),),)
    # image at base 1: (1,1,1), (1,2,1); next = 1 + max(1, 2, 1) = 3; E 3, S 4; video at base 5.
    np.testing.assert_array_equal(out.positions, rows((0, 0, 0), (1, 1, 1), (1, 2, 1), (3, 3, 3), (4, 4, 4),
                                                       (5, 5, 5), (5, 5, 6), (6, 5, 5), (6, 5, 6), (7, 7, 7)))  # fmt: skip
    assert out.delta == 8 - 10
    out = video_prompt([S, V, E, S, P, E], [image], [video], rules("qwen2_vl"))
    assert out.input_ids.tolist() == [S, V, V, V, V, E, S, P, P, E]
    assert out.image_offsets == ((7, 8),) and out.video_offsets == (((1, 4),),)
    # video at base 1: next = 1 + max(2, 1, 2) = 3; E 3, S 4; image at base 5; next 5 + 2 = 7.
    np.testing.assert_array_equal(out.positions, rows((0, 0, 0), (1, 1, 1), (1, 1, 2), (2, 1, 1), (2, 1, 2),
                                                       (3, 3, 3), (4, 4, 4), (5, 5, 5), (5, 6, 5), (7, 7, 7)))  # fmt: skip


def test_two_videos_and_a_two_frame_video():
    # Two frames make one temporal patch (gt = 1).
    out = video_prompt([S, V, E, 9, S, V, E], [], [VideoItem((1, 2, 2)), VideoItem((2, 2, 2))], rules("qwen2_vl"))
    assert out.input_ids.tolist() == [S, V, E, 9, S, V, V, E]
    assert out.video_offsets == (((1, 1),), ((5, 6),))
    np.testing.assert_array_equal(out.positions, rows((0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4),
                                                       (5, 5, 5), (6, 5, 5), (7, 7, 7)))  # fmt: skip


def test_qwen3_nested_blocks():
    # grid (2, 2, 4): 2 temporal patches of 2 pads each; timestamps 0.5 and 1.5 seconds.
    video = VideoItem((2, 2, 4), timestamps=(0.5, 1.5))
    for model_type in ("qwen3_vl", "qwen3_5"):
        out = video_prompt([7, S, V, E, 8], [], [video], rules(model_type))
        stamp0, stamp1 = [60, 40, 50, 45, 61, 62], [60, 41, 50, 45, 61, 62]  # "<0.5 seconds>", "<1.5 seconds>"
        assert out.input_ids.tolist() == [7, S, *stamp0, S, V, V, E, *stamp1, S, V, V, E, E, 8]
        assert out.video_offsets == (((9, 10), (19, 20)),)
        # Only the inner starts precede a pad: two (1, 1, 2) items at 9 and 19, text counting between.
        expected = [(p, p, p) for p in range(9)] + [(9, 9, 9), (9, 9, 10)]
        expected += [(p, p, p) for p in range(11, 19)] + [(19, 19, 19), (19, 19, 20)]
        expected += [(p, p, p) for p in range(21, 24)]
        np.testing.assert_array_equal(out.positions, rows(*expected))
        assert out.delta == 0


def test_qwen3_image_and_video():
    out = video_prompt([S, V, E, S, P, E], [(1, 2, 2)], [VideoItem((1, 4, 2), timestamps=(12.25,))], rules("qwen3_vl"))
    stamp = [60, 41, 42, 50, 42, 61, 62]  # "<12.2 seconds>": 12.25 is a binary tie, printed to even
    assert out.input_ids.tolist() == [S, *stamp, S, V, V, E, E, S, P, E]
    assert out.video_offsets == (((9, 10),),) and out.image_offsets == ((14, 14),)
    assert out.positions[:, 9:11].tolist() == [[9, 9], [9, 10], [9, 9]]  # h rows 0..1, w 0
    # The video resumes counting at 9 + 2; E, E, S take 11, 12, 13; the (1, 1, 1) image sits at 14.
    assert out.positions[:, 11:].tolist() == [[11, 12, 13, 14, 15]] * 3


def test_image_only_prompts_take_the_image_path():
    spec = QwenSpec.from_mapping(NAMED_SPECS["qwen2_vl"])
    family = QwenVL(spec)
    src = np.array([7, 151652, 151655, 151653, 8, 151652, 151655, 151653], np.int64)
    grids = [(1, 4, 6), (1, 2, 2)]
    layout = family.layout(src, [Grid(*g) for g in grids])
    ids, offsets = apply_layout(src, layout, 2)
    mrope = family.positions(ids, offsets, [Grid(*g) for g in grids])
    for model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        out = video_prompt(src, grids, [], VideoPromptRules.from_spec(spec, model_type, 2, TABLE))
        np.testing.assert_array_equal(out.input_ids, ids)
        assert list(out.image_offsets) == offsets
        np.testing.assert_array_equal(out.positions, mrope.positions)
        assert out.delta == mrope.delta


def test_from_spec_needs_the_video_tokens():
    spec = QwenSpec.from_mapping(NAMED_SPECS["qwen3_5"])
    made = VideoPromptRules.from_spec(spec, "qwen3_5", timestamp_table=TABLE)
    assert (made.video_token_id, made.vision_start_token_id, made.vision_end_token_id) == (248057, 248053, 248054)
    bare = {k: v for k, v in NAMED_SPECS["qwen2_vl"].items() if k != "video_token_id"}
    with pytest.raises(MmError, match=r"^video prompt: the spec has no video_token_id$"):
        VideoPromptRules.from_spec(QwenSpec.from_mapping(bare), "qwen2_vl")


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_type", "ids", "images", "videos", "message"),
    [
        ("qwen2_vl", [S, V, E], [], [], r"^prompt has 1 video placeholder\(s\) but 0 video\(s\)$"),
        ("qwen2_vl", [S, V, E], [(1, 2, 2)], [VideoItem((1, 2, 2))], r"^prompt has 0 image placeholder\(s\) but 1"),
        ("qwen2_vl", [S, V, E], [], [VideoItem((1, 3, 2))], r"^video 0: grid must be 3 positive integers"),
        ("qwen2_vl", [S, V, E], [], [VideoItem((0, 2, 2))], r"^video 0: grid must be"),
        ("qwen2_vl", [S, P, V], [(1, 2)], [VideoItem((1, 2, 2))], r"^image 0: grid must be"),
        ("qwen2_5_vl", [S, V, E], [], [VideoItem((1, 2, 2))], r"^video 0: qwen2_5_vl needs its second_per_grid"),
        ("qwen3_vl", [S, V, E], [], [VideoItem((2, 2, 2), timestamps=(0.5,))],
         r"^video 0: qwen3_vl needs one timestamp per temporal patch \(2\), got 1$"),
        ("qwen3_vl", [S, V, E], [], [VideoItem((1, 2, 2))], r"needs one timestamp per temporal patch \(1\), got none"),
        ("qwen3_vl", [S, V, E], [], [VideoItem((1, 2, 2), timestamps=(-1.0,))],
         r"^video 0: video timestamp: -1.0 is negative$"),
        ("qwen3_vl", [S, V, E], [], [VideoItem((1, 2, 2), timestamps=(np.float32(0.5),))],
         r"^video 0: video timestamp: expected a finite Python float"),
        ("qwen3_5", [7, V, E], [], [VideoItem((1, 2, 2), timestamps=(0.5,))],
         r"^video 0: the token before its <\|video_pad\|> \(index 1\) is 7, not <\|vision_start\|>"),
    ],
)  # fmt: skip
def test_refusals(model_type, ids, images, videos, message):
    with pytest.raises(MmError, match=message):
        video_prompt(ids, images, videos, rules(model_type))


def test_rules_refusals():
    with pytest.raises(MmError, match=r"^video prompt: unknown model type 'llava'"):
        VideoPromptRules("llava", 2, P, V, S, E)
    with pytest.raises(MmError, match=r"^video prompt: qwen2_5_vl needs a positive `tokens_per_second`, got None$"):
        VideoPromptRules("qwen2_5_vl", 2, P, V, S, E)
    with pytest.raises(MmError, match=r"^video prompt: qwen3_vl needs a `timestamp_table`"):
        VideoPromptRules("qwen3_vl", 2, P, V, S, E)
    with pytest.raises(MmError, match=r"must differ"):
        VideoPromptRules("qwen2_vl", 2, P, P, S, E)
    with pytest.raises(MmError, match=r"^video prompt: `merge_size` must be an integer >= 1, got 0$"):
        VideoPromptRules("qwen2_vl", 0, P, V, S, E)


def test_a_placeholder_at_the_start_or_after_a_special_token_is_fine_for_qwen3():
    video = VideoItem((1, 2, 2), timestamps=(0.0,))
    assert expand_prompt([V], [], [video], rules("qwen3_vl"))[0].tolist() == [60, 40, 50, 40, 61, 62, S, V, E]
    ids = expand_prompt([S, P, V, E], [(1, 2, 2)], [video], rules("qwen3_vl"))[0]
    assert ids.tolist() == [S, P, 60, 40, 50, 40, 61, 62, S, V, E, E]


def test_mrope_rope_index_refusals():
    args = {"model_type": "qwen2_vl", "merge_size": 2, "image_token_id": P, "video_token_id": V,
            "vision_start_token_id": S}  # fmt: skip
    with pytest.raises(MmError, match=r"^mrope: the prompt has 0 image and 1 video placeholder\(s\) after"):
        mrope_rope_index([S, V, E], [], [], **args)
    with pytest.raises(MmError, match=r"^mrope: video item 0 at index 1 spans 2 token\(s\), the prompt has 1 from"):
        mrope_rope_index([S, V], [], [(2, 2, 2)], **args)
    with pytest.raises(MmError, match=r"^mrope: unknown model type"):
        mrope_rope_index([S, V], [], [(1, 2, 2)], **{**args, "model_type": "qwen9"})
    with pytest.raises(MmError, match=r"^mrope: qwen2_5_vl needs tokens_per_second"):
        mrope_rope_index([S, V], [], [(1, 2, 2)], **{**args, "model_type": "qwen2_5_vl"})


# --- the timestamp table --------------------------------------------------------------------------


def test_timestamp_text():
    assert timestamp_text(0.0) == "<0.0 seconds>" and timestamp_text(1.65) == "<1.6 seconds>"  # 1.65 is below
    assert timestamp_text(0.15) == "<0.1 seconds>" and timestamp_text(3) == "<3.0 seconds>"
    assert timestamp_text(np.float64(2.25)) == "<2.2 seconds>"
    for bad in (float("nan"), float("inf"), True, "1.0", np.float32(1.0)):
        with pytest.raises(MmError, match=r"^video timestamp: expected a finite Python float"):
            timestamp_text(bad)
    assert timestamp_tokens(1234.56, check_timestamp_table(TABLE)) == [60, 41, 42, 43, 44, 50, 46, 61, 62]


# Qwen2's pre-tokenizer regex (transformers' tokenization_qwen2.py PRETOKENIZE_REGEX), restricted to
# ASCII so that Python's `re` takes it: \p{L} -> [A-Za-z], \p{N} -> [0-9].
QWEN2_SPLIT = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|"
                         r"\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
# GPT-2's, which keeps runs of digits together.
GPT2_SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
# A vocabulary with merges a real BPE learns: words, multi-digit numbers, "<1", "s>".
VOCAB = {text: 100 + k for k, text in enumerate([" seconds", "seconds", " sec", "onds", "10", "12", "99", "<1", "s>",
                                                 "0.", ".5"])}  # fmt: skip


def toy_tokenizer(split: re.Pattern):
    """Pre-tokenize with `split`, then encode each piece by greedy longest match over VOCAB (bytes else):
    like a BPE, never across pieces."""

    def tokenize(text: str) -> list[int]:
        ids = []
        for piece in split.findall(text):
            at = 0
            while at < len(piece):
                for end in range(len(piece), at, -1):
                    if piece[at:end] in VOCAB:
                        ids.append(VOCAB[piece[at:end]])
                        at = end
                        break
                else:
                    ids.append(ord(piece[at]))
                    at += 1
        return ids

    return tokenize


def test_table_from_a_qwen2_style_tokenizer():
    tokenize = toy_tokenizer(QWEN2_SPLIT)
    assert QWEN2_SPLIT.findall("<12.5 seconds>") == ["<", "1", "2", ".", "5", " seconds", ">"]
    table = timestamp_token_table(tokenize)
    assert tuple(table) == TIMESTAMP_PIECES
    assert table["<"] == (ord("<"),) and table["7"] == (ord("7"),) and table[" seconds>"] == (100, ord(">"))
    for seconds in (0.0, 10.0, 99.95, 1234.5, 12345.6):
        assert timestamp_tokens(seconds, table) == tokenize(timestamp_text(seconds))


def test_table_refused_when_digits_merge():
    with pytest.raises(MmError, match=r"^timestamp token table: this tokenizer does not compose '<10\.0 seconds>': "
                                      r"it gives \[60, 104, 46, 48, 100, 62\], the pieces give \[60, 49, 48, 46, 48, "
                                      r"100, 62\]$"):  # fmt: skip
        timestamp_token_table(toy_tokenizer(GPT2_SPLIT))


def test_table_refused_when_pieces_merge_across_the_number():
    # A tokenizer without pre-tokenization merges "<1" and ".5": the sample finds it at once.
    def whole(text: str) -> list[int]:
        return toy_tokenizer(re.compile(r".+", re.S))(text)

    with pytest.raises(MmError, match=r"does not compose '<0\.0 seconds>'"):
        timestamp_token_table(whole)


def test_check_timestamp_table():
    assert check_timestamp_table(TABLE)["."] == (50,)
    with pytest.raises(MmError, match=r"^timestamp token table: missing '9', ' seconds>', unexpected ' seconds', '>'$"):
        check_timestamp_table({**{k: v for k, v in TABLE.items() if k not in ("9", " seconds>")},
                               " seconds": [61], ">": [62]})  # fmt: skip
    for bad in ([], "60", [-1], [True], [1.5]):
        with pytest.raises(MmError, match=r"^timestamp token table: '<' must be a non-empty list of token ids"):
            check_timestamp_table({**TABLE, "<": bad})
    with pytest.raises(MmError, match=r"expected a mapping"):
        check_timestamp_table([("<", [1])])


# --- against a plain transcription of get_rope_index ----------------------------------------------


def get_rope_index_reference(ids, image_grids, video_grids, seconds, model_type, merge, tps):
    """SGLang 0.5.23's get_rope_index (mrope_rope_index.py), written as it is written: list searches,
    concatenated parts, the Qwen3 repeat of video grids, float32 time for Qwen2.5."""
    if model_type.startswith("qwen3"):
        video_grids = [(1, h, w) for t, h, w in video_grids for _ in range(t)]
    tokens = list(ids)
    pairs = [tokens[i + 1] for i in range(len(tokens) - 1) if tokens[i] == S]
    image_nums, video_nums = pairs.count(P), pairs.count(V)
    parts, st_, ii, vi = [], 0, 0, 0
    remain_images, remain_videos = image_nums, video_nums
    for _ in range(image_nums + video_nums):
        ed_image = tokens.index(P, st_) if P in tokens and remain_images > 0 else len(tokens) + 1
        ed_video = tokens.index(V, st_) if V in tokens and remain_videos > 0 else len(tokens) + 1
        if ed_image < ed_video:
            (t, h, w), spt, ed = image_grids[ii], 0, ed_image
            ii, remain_images = ii + 1, remain_images - 1
        else:
            (t, h, w), ed = video_grids[vi], ed_video
            spt = np.float32(seconds[vi]) if seconds is not None else np.float32(1.0)
            vi, remain_videos = vi + 1, remain_videos - 1
        lh, lw = h // merge, w // merge
        st_idx = parts[-1].max() + 1 if parts else 0
        text_len = ed - st_
        parts.append(np.tile(np.arange(text_len), (3, 1)) + st_idx)
        if model_type == "qwen2_5_vl":
            t_index = (np.repeat(np.arange(t), lh * lw).astype(np.float32) * spt * np.float32(tps)).astype(np.int64)
        else:
            t_index = np.repeat(np.arange(t), lh * lw)
        h_index = np.tile(np.repeat(np.arange(lh), lw), t)
        w_index = np.tile(np.arange(lw), t * lh)
        parts.append(np.stack([t_index, h_index, w_index]) + text_len + st_idx)
        st_ = ed + t * lh * lw
    if st_ < len(tokens):
        st_idx = parts[-1].max() + 1 if parts else 0
        parts.append(np.tile(np.arange(len(tokens) - st_), (3, 1)) + st_idx)
    pos = np.concatenate(parts, axis=1)
    return pos, int(pos.max()) + 1 - len(tokens)


ITEM = st.one_of(
    st.tuples(st.just("image"), st.integers(1, 4), st.integers(1, 4)),
    st.tuples(st.just("video"), st.integers(1, 9), st.integers(1, 3), st.integers(1, 3),
              st.sampled_from([2 / 24, 1 / 12, 2 / 29.97, 0.5, 1.0]),
              st.lists(st.integers(0, 36000), min_size=9, max_size=9)),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(ITEM, min_size=1, max_size=5), st.lists(st.integers(0, 3), min_size=6, max_size=6),
       st.sampled_from(["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]), st.sampled_from([1, 2, 4]))  # fmt: skip
def test_equals_get_rope_index_transcription(items, gaps, model_type, tps):
    src, images, videos = [], [], []
    for k, item in enumerate(items):
        src += [7] * gaps[k] + [S, P if item[0] == "image" else V, E]
        if item[0] == "image":
            images.append((1, 2 * item[1], 2 * item[2]))
        else:
            _, gt, mh, mw, spt, tenths = item
            videos.append(VideoItem((gt, 2 * mh, 2 * mw), spt, tuple(x / 10 for x in tenths[:gt])))
    src += [8] * gaps[-1]
    out = video_prompt(src, images, videos, rules(model_type, **({"tokens_per_second": tps}
                                                                 if model_type == "qwen2_5_vl" else {})))  # fmt: skip
    seconds = [v.second_per_grid for v in videos] if model_type == "qwen2_5_vl" else None
    if videos:
        ref, ref_delta = get_rope_index_reference(out.input_ids.tolist(), images, [v.grid for v in videos], seconds,
                                                  model_type, 2, tps)  # fmt: skip
        np.testing.assert_array_equal(out.positions, ref)
        assert out.delta == ref_delta
    else:
        items_ = [(s, e, g) for (s, e), g in zip(out.image_offsets, images, strict=True)]
        np.testing.assert_array_equal(out.positions, mrope_image_only(len(out.input_ids), items_, 2)[0])
    # Offsets: every run of pads of each kind, in order, and nothing else.
    ids = out.input_ids
    for token, spans in ((P, list(out.image_offsets)), (V, [r for runs in out.video_offsets for r in runs])):
        mask = np.concatenate([[False], ids == token, [False]])
        edges = np.flatnonzero(mask[1:] != mask[:-1])
        assert spans == [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]
    for video, runs in zip(videos, out.video_offsets, strict=True):
        assert len(runs) == (video.grid[0] if model_type.startswith("qwen3") else 1)
    assert len(ids) == len(src) - len(items) + sum((t * h * w) // 4 for t, h, w in images) + sum(
        (t * h * w) // 4 + (t * 2 + sum(len(timestamp_tokens(x, TABLE)) for x in v.timestamps)
                            if model_type.startswith("qwen3") else 0)
        for v in videos for t, h, w in [v.grid]
    )  # fmt: skip
