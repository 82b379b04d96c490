"""Qwen-VL video prompts: mmworker's expansion, offsets and M-RoPE equal transformers 5.19's and SGLang 0.5.23's.

SGLang's own `QwenVLImageProcessor._process_mm_data_uncached` runs each request, with the HF processor
it would hold (Qwen2VLProcessor, Qwen2_5_VLProcessor or Qwen3VLProcessor over a small tokenizer with
Qwen's special tokens), its decoding replaced by small synthetic frames (the pixels are not under test
here: tests/sglang_env/test_qwen_video_parity.py checks them). What it returns is compared with
`mmworker.qwen_vl.video_layout.video_prompt` on the same prompt's ids: the expanded ids, every item's
offsets as SGLang groups items, the M-RoPE positions and delta. Qwen3's timestamp ids come from
`timestamp_token_table`, built from the processor's own tokenizer: a GPT-2-style byte-level BPE (digits
never merged) and tokenizers with transformers' real Qwen2 and Qwen3.5 pre-tokenizers over a BPE that
did learn digit merges (which those pre-tokenizers never apply, and which make the GPT-2 style refuse).
"""

import asyncio
import json
import random

import numpy as np
import pytest
import torch
from PIL import Image
from plugin_env import CLIP_MEAN, CLIP_STD, SPECIALS, TOKEN_IDS, TOKENIZER, WORDS, builtin_class, hf_config, server_args
from sglang.srt.layers.rotary_embedding.mrope_rope_index import get_rope_index
from sglang.srt.multimodal.processors import qwen_vl as sglang_qwen_vl
from sglang.srt.multimodal.processors.base_processor import BaseMultiModalProcessorOutput
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLProcessor,
    Qwen2Tokenizer,
    Qwen2VLProcessor,
    Qwen3VLProcessor,
)
from transformers.models.qwen2_vl import Qwen2VLImageProcessor
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

from mmworker import MmError
from mmworker.qwen_vl.mrope import mrope_rope_index
from mmworker.qwen_vl.video_layout import VideoItem, VideoPromptRules, timestamp_token_table, video_prompt

S, P, E, V = (TOKEN_IDS[name] for name in SPECIALS)  # vision start, image pad, vision end, video pad
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def _digit_merging_bpe() -> tuple[dict, list, ByteLevelBPETokenizer]:
    """vocab and merges of a byte-level BPE trained (GPT-2 pre-tokenizer) on words and timestamps: it
    learns merges of digit pairs ("10", "12", ...) and " seconds"."""
    corpus = [" ".join(WORDS)] * 10 + [f"<{x / 10:.1f} seconds>" for x in range(0, 40000, 3)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=600, min_frequency=1, special_tokens=["[PAD]", *SPECIALS],
                            show_progress=False)  # fmt: skip
    model = json.loads(bpe._tokenizer.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return model["vocab"], merges, bpe


VOCAB, MERGES, DIGIT_BPE = _digit_merging_bpe()


def _qwen_tokenizer(cls: type):
    """transformers' own Qwen tokenizer class (its pre-tokenizer regex isolates every digit) over VOCAB,
    Qwen's vision tokens special, with the ids plugin_env's configs use."""
    tokenizer = cls(vocab=VOCAB, merges=MERGES)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    assert [tokenizer.convert_tokens_to_ids(s) for s in SPECIALS] == [S, P, E, V]
    return tokenizer


TOKENIZERS = {
    "gpt2-bpe": TOKENIZER,  # plugin_env's: GPT-2 pre-tokenizer, trained on words only
    "qwen2": _qwen_tokenizer(Qwen2Tokenizer),
    "qwen3_5": _qwen_tokenizer(Qwen3_5Tokenizer),
}

# (model type, tokenizer, tokens_per_second in the vision config: None keeps the HF config's default)
CASES = [
    ("qwen2_vl", "gpt2-bpe", None),
    ("qwen2_5_vl", "qwen2", 2),  # the released checkpoints' value
    ("qwen2_5_vl", "gpt2-bpe", None),  # the HF config's default, 4
    ("qwen3_vl", "gpt2-bpe", None),
    ("qwen3_vl", "qwen2", None),
    ("qwen3_vl_moe", "qwen2", None),
    ("qwen3_5", "qwen3_5", None),
    ("qwen3_5_moe", "gpt2-bpe", None),
]


def hf_processor(model_type: str, tokenizer):
    """The HF processor of this model type over small size limits (few tokens: fast), as SGLang holds one."""
    qwen3 = model_type.startswith("qwen3")
    patch, mean, std = (16, [0.5] * 3, [0.5] * 3) if qwen3 else (14, CLIP_MEAN, CLIP_STD)
    image = Qwen2VLImageProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2, image_mean=mean,
                                  image_std=std, size={"shortest_edge": 1024, "longest_edge": 65536})  # fmt: skip
    if qwen3:
        video = Qwen3VLVideoProcessor(size={"shortest_edge": 4096, "longest_edge": 32 * 32 * 48},
                                      cap_pixels_per_frame=False)  # fmt: skip
        return Qwen3VLProcessor(image_processor=image, video_processor=video, tokenizer=tokenizer)
    video = Qwen2VLVideoProcessor(
        size={"shortest_edge": 3136, "longest_edge": 28 * 28 * 48}, cap_pixels_per_frame=False
    )
    cls = Qwen2_5_VLProcessor if model_type == "qwen2_5_vl" else Qwen2VLProcessor
    return cls(image_processor=image, video_processor=video, tokenizer=tokenizer)


def random_request(rng: random.Random, two_frames: bool = False) -> tuple[str, list, list]:
    """(text, images, videos): 1-3 videos and 0-2 images in a random order among words; a video is
    (frames uint8 TCHW, SGLang's metadata dict). Frame counts include 2 (one temporal patch) and odd
    ones (the processor pads them); `two_frames`: 2-3 videos of 2 frames each (SGLang then keeps
    Qwen2/2.5-VL's videos as separate items)."""
    kinds = ["video"] * rng.randint(2 if two_frames else 1, 3) + ["image"] * rng.randint(0, 2)
    rng.shuffle(kinds)
    parts, images, videos = [rng.choice(WORDS)], [], []
    for kind in kinds:
        if kind == "image":
            h, w = rng.choice([(60, 90), (64, 64), (100, 40)])
            pixels = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (h, w, 3), np.uint8)
            images.append(Image.fromarray(pixels))
            parts.append(IMAGE)
        else:
            n = 2 if two_frames else rng.choice([2, 2, 3, 4, 6, 8, 12, 16])
            h, w = rng.choice([(56, 84), (84, 56), (64, 64), (60, 90)])
            pixels = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (n, 3, h, w), np.uint8)
            frames = torch.from_numpy(pixels)
            fps = rng.choice([23.976, 24.0, 25.0, 29.97, 30.0, 60.0, 7.5])
            total = n * rng.randint(1, 40)
            indices = sorted(rng.sample(range(total), n))
            meta = {"fps": fps, "duration": total / fps, "total_num_frames": total, "frames_indices": indices,
                    "video_backend": "torchvision"}  # fmt: skip
            videos.append((frames, meta))
            parts.append(VIDEO)
        parts.append(rng.choice(WORDS))
    return " ".join(parts), images, videos


def sglang_run(processor, text: str, images: list, videos: list):
    """SGLang's own path for one request, with loading and video decoding answered by the given data."""
    pending = iter(videos)

    async def decoded(video, video_config=None):
        return next(pending)

    async def loaded(**kwargs):
        return BaseMultiModalProcessorOutput(input_text=text, images=list(images), videos=["video"] * len(videos))

    class Request:
        rid, video_data, audio_data = "r", ["video"] * len(videos), None

    processor.load_mm_data = loaded
    saved, sglang_qwen_vl.preprocess_video = sglang_qwen_vl.preprocess_video, decoded
    try:
        return asyncio.run(processor._process_mm_data_uncached(list(images), text, Request()))
    finally:
        sglang_qwen_vl.preprocess_video = saved


def sglang_items(out, ours, model_type: str) -> None:
    """SGLang's items and their offsets, against ours grouped as SGLang groups them (docs/behaviour.md §15.3)."""
    image_items = [item.offsets for item in out.mm_items if item.modality.name == "IMAGE"]
    video_items = [item.offsets for item in out.mm_items if item.modality.name == "VIDEO"]
    assert image_items == [[offset] for offset in ours.image_offsets]
    runs = [run for video in ours.video_offsets for run in video]
    frames = sum(int(g[0]) for g in grids(out, "video_grid_thw"))
    if len(ours.video_offsets) == 1 or len(runs) == frames:
        assert video_items == [list(video) for video in ours.video_offsets]  # one item per video
    else:
        assert video_items == [runs]  # Qwen2/2.5-VL, several videos, not all one temporal patch: one item


def grids(out, key: str) -> list[tuple[int, int, int]]:
    rows = [item.model_specific_data[key] for item in out.mm_items if key in item.model_specific_data]
    return [tuple(int(v) for v in row) for block in rows for row in block.reshape(-1, 3).tolist()]


@pytest.fixture(scope="module", params=CASES, ids=["-".join(map(str, case)) for case in CASES])
def case(request):
    model_type, tokenizer_name, tokens_per_second = request.param
    tokenizer = TOKENIZERS[tokenizer_name]
    config = hf_config(model_type)
    if tokens_per_second is not None:
        config.vision_config.tokens_per_second = tokens_per_second
    hf = hf_processor(model_type, tokenizer)
    args = server_args()  # published first: building SGLang's processor reads it
    processor = builtin_class(model_type)(config, args, hf, "default")
    table = None
    if model_type.startswith("qwen3"):
        table = timestamp_token_table(lambda text: tokenizer.encode(text, add_special_tokens=False))
    tps = getattr(config.vision_config, "tokens_per_second", None) if model_type == "qwen2_5_vl" else None
    rules = VideoPromptRules(model_type, 2, P, V, S, E, tokens_per_second=tps, timestamp_table=table)
    return model_type, tokenizer, hf, processor, rules


@pytest.mark.parametrize("seed", range(12))
def test_requests_equal_sglang(case, seed):
    model_type, tokenizer, hf, processor, rules = case
    text, images, videos = random_request(random.Random(f"{model_type}-{seed}"), two_frames=seed % 6 == 0)
    out = sglang_run(processor, text, images, videos)

    video_grids = grids(out, "video_grid_thw")
    spt = [float(v) for item in out.mm_items for v in item.model_specific_data.get("second_per_grid_ts", [])]
    if model_type == "qwen2_5_vl":
        assert spt == [float(np.float32(2 / 24))] * len(videos)  # the quirk: every video 2/24, whatever its fps
    items = []
    for grid, (_, meta) in zip(video_grids, videos, strict=True):
        # The timestamps as the processor computes them (mmworker.qwen_vl.video's job; taken as given here).
        stamps = None
        if rules.timestamp_table is not None:  # (a copy: the processor pads an odd list in place)
            stamps = hf._calculate_timestamps(list(meta["frames_indices"]), meta["fps"], 2)[: grid[0]]
        items.append(VideoItem(grid, second_per_grid=2 / 24 if spt else None, timestamps=stamps))
    source = tokenizer.encode(text, add_special_tokens=False)
    ours = video_prompt(source, grids(out, "image_grid_thw"), items, rules)

    assert ours.input_ids.tolist() == list(out.input_ids)
    sglang_items(out, ours, model_type)
    np.testing.assert_array_equal(ours.positions, out.mrope_positions.numpy())
    assert [[ours.delta]] == out.mrope_position_delta.tolist()


def test_timestamp_tables():
    gpt2 = PreTrainedTokenizerFast(tokenizer_object=DIGIT_BPE._tokenizer)
    with pytest.raises(MmError, match=r"does not compose '<10\.0 seconds>'"):
        timestamp_token_table(lambda text: gpt2.encode(text, add_special_tokens=False))
    for name in ("qwen2", "qwen3_5"):
        tokenizer = TOKENIZERS[name]
        # The BPE learned digit merges; the Qwen pre-tokenizer never lets them apply.
        assert len(gpt2.encode("<12.5 seconds>")) == 6 and len(tokenizer.encode("<12.5 seconds>")) == 7
        table = timestamp_token_table(lambda text: tokenizer.encode(text, add_special_tokens=False))  # noqa: B023
        assert table["1"] == tuple(tokenizer.encode("1")) and len(table[" seconds>"]) == 2


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_mrope_equals_get_rope_index(model_type):
    """mrope_rope_index against SGLang's get_rope_index directly, on prompts SGLang's processors do not
    make: long videos (Qwen2.5's time axis to 384 temporal patches at several second_per_grid values and
    both tokens_per_second), and placeholders without their <|vision_start|> (which it counts as text)."""
    rng = random.Random(model_type)
    for trial in range(40):
        ids, images, videos, spt = [], [], [], []
        for _ in range(rng.randint(1, 4)):
            ids += [7] * rng.randint(0, 3)
            start = [S] if rng.random() > 0.15 else []
            gh, gw = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
            if rng.random() < 0.3:
                images.append((1, gh, gw))
                ids += start + [P] * (gh * gw // 4) + [E]
                continue
            gt = rng.choice([1, 2, 7, 384]) if trial % 4 == 0 else rng.randint(1, 9)
            videos.append((gt, gh, gw))
            spt.append(rng.choice([2 / 24, 2 / 29.97, 2 / 30, 0.5, 1 / 3, 2 / 7.5]))
            if model_type.startswith("qwen3"):
                for _ in range(gt):
                    ids += [60, 61] + start + [V] * (gh * gw // 4) + [E]
            else:
                ids += start + [V] * (gt * gh * gw // 4) + [E]
        ids += [8] * rng.randint(0, 3)
        tps = rng.choice([2, 4])
        seconds = spt if model_type == "qwen2_5_vl" else None
        ref, ref_delta = get_rope_index(
            2, P, V, S, model_type, tps, torch.tensor([ids]),
            torch.tensor(images, dtype=torch.long).reshape(-1, 3) if images else None,
            torch.tensor(videos, dtype=torch.long).reshape(-1, 3) if videos else None,
            torch.tensor(seconds, dtype=torch.float32) if seconds else None,
        )  # fmt: skip
        ours, delta = mrope_rope_index(ids, images, videos, model_type=model_type, merge_size=2, image_token_id=P,
                                       video_token_id=V, vision_start_token_id=S, second_per_grid_ts=seconds,
                                       tokens_per_second=tps)  # fmt: skip
        np.testing.assert_array_equal(ours, ref[:, 0].numpy())
        assert [[delta]] == ref_delta.tolist()


@pytest.mark.parametrize("tps", [2, 4])
@pytest.mark.parametrize("spt", [2 / 24, 2 / 29.97, 0.21, 0.29, 0.35])
def test_qwen2_5_time_axis_is_float32(spt, tps):
    """384 temporal patches (SGLang's 768-frame cap) of one token each. At 0.21, 0.29 and 0.35 seconds per
    patch the float32 time index differs from a float64 one (e.g. 0.29 * 2 at t = 50: 29, not 28), so
    this would catch arithmetic in the wrong precision; 2/24 (SGLang's quirk) gives t // 6 either way."""
    gt = 384
    ids = [S] + [V] * gt + [E]
    ref, ref_delta = get_rope_index(2, P, V, S, "qwen2_5_vl", tps, torch.tensor([ids]), None,
                                    torch.tensor([[gt, 2, 2]]), torch.tensor([spt], dtype=torch.float32))  # fmt: skip
    ours, delta = mrope_rope_index(ids, [], [(gt, 2, 2)], model_type="qwen2_5_vl", merge_size=2, image_token_id=P,
                                   video_token_id=V, vision_start_token_id=S, second_per_grid_ts=[spt],
                                   tokens_per_second=tps)  # fmt: skip
    np.testing.assert_array_equal(ours, ref[:, 0].numpy())
    assert [[delta]] == ref_delta.tolist()
    float64 = (np.arange(gt) * spt * tps).astype(np.int64)
    assert (ours[0, 1:-1] - 1 != float64).any() == (spt in (0.21, 0.29, 0.35))
    if spt == 2 / 24 and tps == 2:
        np.testing.assert_array_equal(ours[0, 1:-1] - 1, np.arange(gt) // 6)
