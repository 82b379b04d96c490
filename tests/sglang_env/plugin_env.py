"""What the tests that run inside SGLang's own environment share (.venv-sglang, built by scripts/setup_sglang.sh).

    bash scripts/setup_sglang.sh && .venv-sglang/bin/pytest tests/sglang_env

They build SGLang's real `QwenVLImageProcessor` as SGLang's own unit tests do (a published
`ServerArgs`, an HF config, a `Qwen2VLProcessor` over a small hand-built tokenizer and a real HF image
processor) and the class SGLang picks after `import_processors("mmworker.sglang", overwrite=True)`,
with mmworker installed the documented way (`.venv-sglang/bin/pytest` does not put the checkout on
sys.path, so `import mmworker` is the installed copy). sgl_kernel has no CPU build: SGLang's own
test helper answers its imports with mocks, as SGLang's unit tests do; nothing on the
preprocessing path calls it (importing this module installs that stub first). The main suite runs
this directory through tests/test_sglang_env.py.
"""

import asyncio
import dataclasses
import io
from typing import Any

import numpy as np
from sglang.test.test_utils import maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()

import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from sglang.srt.managers.multimodal_processor import PROCESSOR_MAPPING, get_mm_processor_cls, import_processors  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish, reset_context  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor  # noqa: E402
from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor  # noqa: E402
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor  # noqa: E402

from mmworker.corpus import photo_like  # noqa: E402

SPECIALS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
WORDS = ["hello", "world", "describe", "this", "and", "compare", "picture", "one", "two", "three"]
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]

# model type -> (HF config class, patch size, mean, std): the released checkpoints' processor settings.
MODELS = {
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", 14, CLIP_MEAN, CLIP_STD),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", 14, CLIP_MEAN, CLIP_STD),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", 16, [0.5] * 3, [0.5] * 3),
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", 16, [0.5] * 3, [0.5] * 3),
    "qwen3_5": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration", 16, [0.5] * 3, [0.5] * 3),
    "qwen3_5_moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", 16, [0.5] * 3, [0.5] * 3),
}
BACKENDS = {"torchvision": Qwen2VLImageProcessor, "pil": Qwen2VLImageProcessorPil}


def tokenizer() -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE tokenizer (Qwen's kind: decode gives the text back exactly) whose special
    tokens are Qwen's vision placeholders; trained here on a few words, deterministically."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WORDS)] * 10, vocab_size=300, min_frequency=1,
                            special_tokens=["[PAD]", *SPECIALS], show_progress=False)  # fmt: skip
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="[PAD]")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    return fast


TOKENIZER = tokenizer()
TOKEN_IDS = {name: TOKENIZER.convert_tokens_to_ids(name) for name in SPECIALS}


def hf_config(model_type: str) -> Any:
    config_name, architecture, *_ = MODELS[model_type]
    config = getattr(transformers, config_name)(
        vision_start_token_id=TOKEN_IDS["<|vision_start|>"],
        image_token_id=TOKEN_IDS["<|image_pad|>"],
        vision_end_token_id=TOKEN_IDS["<|vision_end|>"],
        video_token_id=TOKEN_IDS["<|video_pad|>"],
    )
    config.architectures = [architecture]
    return config


def hf_processor(model_type: str, backend: str, **pixels: int) -> Qwen2VLProcessor:
    """The HF processor SGLang would hold: `pixels` are min_pixels/max_pixels (else the model's defaults)."""
    _, _, patch, mean, std = MODELS[model_type]
    size = {"shortest_edge": pixels.get("min_pixels", 56 * 56 if patch == 14 else 65536),
            "longest_edge": pixels.get("max_pixels", 1003520 if patch == 14 else 16777216)}  # fmt: skip
    image_processor = BACKENDS[backend](patch_size=patch, merge_size=2, temporal_patch_size=2, size=size,
                                       image_mean=mean, image_std=std)  # fmt: skip
    return Qwen2VLProcessor(
        image_processor=image_processor, video_processor=Qwen2VLVideoProcessor(), tokenizer=TOKENIZER
    )


# The released checkpoints' video processors (mmworker.qwen_vl.video's constants): Qwen3-VL and 3.5 ship
# a video_preprocessor_config.json (4096..25165824 pixels over frames x height x width, mean = std = 0.5);
# Qwen2-VL and 2.5-VL ship none, so AutoVideoProcessor builds theirs from the image processor's config.
QWEN3_VIDEO_SIZE = {"shortest_edge": 4096, "longest_edge": 25165824}


def video_hf_processor(model_type: str, backend: str = "torchvision", **video: Any) -> Any:
    """The HF processor SGLang holds for a checkpoint that serves videos, as AutoProcessor builds it for the
    model type (Qwen2VLProcessor, Qwen2_5_VLProcessor, Qwen3VLProcessor), with the image processor of
    `hf_processor`; `video` overrides the video processor's settings."""
    image_processor = hf_processor(model_type, backend).image_processor
    _, _, patch, mean, std = MODELS[model_type]
    if model_type.startswith("qwen3"):
        settings = dict(patch_size=patch, merge_size=2, temporal_patch_size=2, image_mean=mean, image_std=std,
                        size=QWEN3_VIDEO_SIZE)  # fmt: skip
        settings.update(video)
        return Qwen3VLProcessor(image_processor=image_processor, video_processor=Qwen3VLVideoProcessor(**settings),
                                tokenizer=TOKENIZER)  # fmt: skip
    size = image_processor.size
    settings = dict(patch_size=patch, merge_size=2, temporal_patch_size=2, image_mean=mean, image_std=std,
                    size={"shortest_edge": size.shortest_edge, "longest_edge": size.longest_edge})  # fmt: skip
    settings.update(video)
    cls = Qwen2_5_VLProcessor if model_type == "qwen2_5_vl" else Qwen2VLProcessor
    return cls(image_processor=image_processor, video_processor=Qwen2VLVideoProcessor(**settings), tokenizer=TOKENIZER)


def server_args(**fields: Any) -> ServerArgs:
    """SGLang's arguments, published for this process as the TokenizerManager's role (as SGLang's tests do)."""
    base = dict(model_path="dummy", model_impl="sglang", mm_feature_transport="cpu", allowed_media_domains=[],
                mm_processor_worker_num=1, mm_process_config={})  # fmt: skip
    base.update(fields)
    args = ServerArgs(**base)
    reset_context()
    publish(args, role="tokenizer", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    return args


def builtin_class(model_type: str) -> type:
    """SGLang's own processor class for this architecture (before any external package)."""
    PROCESSOR_MAPPING.clear()
    import_processors("sglang.srt.multimodal.processors")
    return get_mm_processor_cls(hf_config(model_type))


def plugin_class(model_type: str) -> type:
    """The class SGLang picks once it has imported mmworker.sglang, as the TokenizerManager does."""
    PROCESSOR_MAPPING.clear()
    import_processors("sglang.srt.multimodal.processors")
    import_processors("mmworker.sglang", overwrite=True)
    return get_mm_processor_cls(hf_config(model_type))


@dataclasses.dataclass
class Request:
    """The request object fields SGLang's processors read."""

    rid: str = "r"
    video_data: Any = None
    audio_data: Any = None
    mm_content_hashes: Any = None


def run(processor: Any, images: list, text: Any, **request: Any) -> Any:
    return asyncio.run(
        processor.process_mm_data_async(image_data=images, input_text=text, request_obj=Request(**request))
    )


def prompt(n_images: int) -> str:
    words = ["describe", "this", "and", "compare"]
    parts = ["hello"]
    for k in range(n_images):
        parts += ["<|vision_start|><|image_pad|><|vision_end|>", words[k % len(words)]]
    return " ".join(parts) + " world"


def encoded(width: int, height: int, fmt: str, seed: int = 0, **save: Any) -> bytes:
    """Photo-like pixels in `fmt`; for GIF/BMP/PNG-with-alpha the modes those formats carry."""
    pixels = photo_like(width, height, seed=seed)
    image = Image.fromarray(pixels)
    if fmt == "GIF":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE)
    elif fmt == "GREY-JPEG":
        image, fmt = image.convert("L"), "JPEG"
    elif fmt == "RGBA-PNG":
        alpha = Image.fromarray((np.arange(width * height) % 251).astype(np.uint8).reshape(height, width))
        image.putalpha(alpha)
        fmt = "PNG"
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()
