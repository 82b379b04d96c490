"""What the plug-in serves for one model and server, decided once at start, and why it declines the rest.

The decision is conservative, as SGLang's own Rust path decides (`RustMmProcessor.resolve_spec`):
a setting mmworker does not reproduce bit for bit turns the plug-in off for the model rather than
being approximated, and the reason is logged once. What it reads:

- the model type (Qwen2-VL, 2.5-VL, 3-VL, 3-VL-MoE, 3.5, 3.5-MoE);
- the HF image processor SGLang holds: its class picks the resample mode (the torchvision
  `Qwen2VLImageProcessor`/`...Fast` is `aten_u8`, `Qwen2VLImageProcessorPil` is the installed
  Pillow's BICUBIC), then patch, merge and temporal sizes, the pixel budget (`size`'s
  shortest/longest edge or `min_pixels`/`max_pixels`), mean and std, and the stages it runs
  (resize, rescale by exactly 1/255, normalise, BICUBIC);
- `--mm-process-config {"image": {...}}`: only `min_pixels`/`max_pixels` overrides are mirrored;
- SGLang's URL policy (`--allowed-media-domains`, `--media-url-max-file-size-mb`): URLs are
  served only where mmworker's fetch behaves as SGLang's would, else such requests are delegated;
- for videos (`VideoFacts`, decided apart: a reason to decline videos leaves images served), what
  SGLang's Qwen video path would run: its decoder (torchcodec; decord is declined; on a GPU host,
  where SGLang asks torchcodec for NVDEC and runs the HF processor on the device, mmworker serves
  the bytes of SGLang's CPU path, a documented difference, unless the operator's file says
  `videos_on_accelerator = "delegate"`), its module
  constants (`VIDEO_TOTAL_PIXELS` from the environment's `VIDEO_MAX_PIXELS`, which mmworker's
  workers read the same way), `--mm-process-config {"video": {...}}` (any key declines: none is
  reproduced), the HF processor class and its video processor's settings (those of the released
  checkpoints that mmworker.qwen_vl.video reproduces), and what the spec needs for videos:
  `model_type`, Qwen2.5-VL's `tokens_per_second` (the vision config's, read as SGLang reads it) and
  Qwen3's `timestamp_table`, built once from the HF processor's tokenizer.

The pool configuration mirrors SGLang's own media behaviour (private addresses and local files are
readable, as SGLang reads them); an operator can override any pool setting with a TOML file named by
`MMWORKER_SGLANG_CONFIG` (keys of `mmworker.pool.config`). One key of that file is the plug-in's own
and goes into the spec instead: `feature_dtype` ("float32" by default, or "bfloat16"; the qwen_vl
spec's key). float32 is what SGLang's own processor hands on, so the default stays bit for bit
SGLang's path; "bfloat16" halves the features' shared memory and host-to-device bytes, and gives
the model the same input wherever the vision tower runs in bfloat16, as the released checkpoints
do: SGLang's Qwen models cast `pixel_values` to the tower's dtype before using them
(`get_image_feature`'s `.type(self.visual.dtype)` for Qwen2-VL and 2.5-VL; for 3-VL and 3.5 the
`dtype` their Python model code materialises features in). A tower in float32 would see the rounded values.
"""

import math
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmworker.common import pillow
from mmworker.common import video as video_decoding
from mmworker.common.budget import MAX_FETCH_BYTES
from mmworker.errors import MmError
from mmworker.pool.config import PoolConfig
from mmworker.qwen_vl import video as qwen_video
from mmworker.qwen_vl.family import QwenVL
from mmworker.qwen_vl.spec import FEATURE_DTYPES, QwenSpec
from mmworker.qwen_vl.video_layout import timestamp_token_table

SERVED_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
# HF image processor class -> the mmworker resample mode equal to it bit for bit.
RESAMPLE_OF_PROCESSOR = {
    "Qwen2VLImageProcessor": "aten_u8",
    "Qwen2VLImageProcessorFast": "aten_u8",
    "Qwen2VLImageProcessorPil": "pil",
}
MIRRORED_IMAGE_OVERRIDES = frozenset({"min_pixels", "max_pixels"})
CONFIG_ENV = "MMWORKER_SGLANG_CONFIG"
# Keys of the CONFIG_ENV file that are the plug-in's own (they go into the spec), not the pool's.
SPEC_KEYS = ("feature_dtype",)
# The plug-in's own keys of the operator's file (neither spec nor pool settings): on a host where
# SGLang would decode videos on its accelerator, "serve" them as SGLang's CPU path computes them (the
# default: the CPU work mmworker exists to take off the serving process) or "delegate" them to SGLang.
PLUGIN_KEYS = ("videos_on_accelerator",)
VIDEOS_ON_ACCELERATOR = ("serve", "delegate")
_BICUBIC = 3  # PIL.Image.Resampling.BICUBIC, as HF stores `resample`

# SGLang's Qwen video constants (module globals of its multimodal/processors/qwen_vl.py) -> mmworker's
# value of each (mmworker.qwen_vl.video). VIDEO_TOTAL_PIXELS comes from the environment variable
# VIDEO_MAX_PIXELS, read by each at its import: equal unless the environment changed in between.
SGLANG_VIDEO_CONSTANTS = {
    "IMAGE_FACTOR": qwen_video.SGLANG_FACTOR,
    "VIDEO_MIN_PIXELS": qwen_video.VIDEO_MIN_PIXELS,
    "VIDEO_MAX_PIXELS": qwen_video.VIDEO_MAX_PIXELS,
    "VIDEO_TOTAL_PIXELS": qwen_video.VIDEO_TOTAL_PIXELS,
    "FRAME_FACTOR": qwen_video.FRAME_FACTOR,
    "FPS": qwen_video.FPS,
    "FPS_MIN_FRAMES": qwen_video.FPS_MIN_FRAMES,
    "FPS_MAX_FRAMES": qwen_video.FPS_MAX_FRAMES,
}
# SGLang's model type -> the HF processor class whose video output mmworker reproduces (transformers
# 5.19's AutoProcessor for the released checkpoints): Qwen2.5-VL's adds second_per_grid_ts, Qwen3's
# the timestamps; a Qwen2VLProcessor under a Qwen2.5-VL model would give neither.
VIDEO_PROCESSOR_CLASSES = {
    "qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor"),
    **dict.fromkeys(("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"),
                    ("Qwen3VLProcessor", "Qwen3VLVideoProcessor")),
}  # fmt: skip


@dataclass(frozen=True)
class ServerFacts:
    """What the plan reads from SGLang's configuration, as plain values (so it needs no SGLang)."""

    model_type: str
    image_token_id: int | None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    video_token_id: int | None = None
    image_overrides: Mapping[str, Any] = field(default_factory=dict)  # --mm-process-config's "image"
    processor_workers: int = 0  # --mm-processor-worker-num; 0 = automatic
    tokenizer_workers: int = 1  # --tokenizer-worker-num
    allowed_media_domains: tuple[str, ...] = ()
    media_url_max_file_size_mb: int = MAX_FETCH_BYTES >> 20
    preprocess_cache_mb: int | None = None  # --mm-preprocess-cache-size-mb; None = not given
    trust_content_hashes: bool = False  # --trust-mm-content-hashes


@dataclass(frozen=True)
class VideoFacts:
    """What the plan reads of SGLang's video path for this model (mmworker.sglang.qwen_vl gathers it)."""

    processor_class: str  # the HF processor SGLang holds (`type(processor).__name__`)
    video_processor: Any  # its `video_processor` (None: it has none)
    tokenize: Callable[[str], Sequence[int]] | None  # its tokenizer's encode, no special tokens added
    tokens_per_second: Any = None  # hf_config.vision_config.tokens_per_second as SGLang reads it (None: absent)
    overrides: Mapping[str, Any] = field(default_factory=dict)  # --mm-process-config's "video"
    decoder: str = "torchcodec"  # SGLang's video decoder backend (sglang.srt.utils.video_decoder)
    accelerator: str | None = None  # the device SGLang would decode or process videos on, if not the CPU
    sglang_constants: Mapping[str, Any] = field(default_factory=dict)  # SGLANG_VIDEO_CONSTANTS' names -> SGLang's


@dataclass(frozen=True)
class Plan:
    """The outcome: a spec to serve (or None, with the reason) and how the pool is configured."""

    spec: dict[str, Any] | None
    declined: str | None = None  # why the plug-in serves nothing for this model
    urls: bool = False  # http(s) sources are fetched by mmworker; else requests with them are delegated
    urls_declined: str | None = None
    pool_config: dict[str, Any] = field(default_factory=dict)
    processor_class: str = ""
    videos: bool = False  # requests with videos are served; else they are delegated
    videos_declined: str | None = None
    # Where SGLang would decode videos on an accelerator and mmworker serves them: its device.
    video_accelerator: str | None = None

    def describe(self) -> str:
        """One line for the log: what is served, and what goes to SGLang's own path and why."""
        if self.spec is None:
            return f"mmworker: serving nothing for this model ({self.declined}); SGLang's own processor runs"
        spec = self.spec
        mode = spec["resample"] + (f" (Pillow {spec['pillow']})" if spec.get("pillow") else "")
        mode += f", {spec.get('feature_dtype', 'float32')} features"
        workers = self.pool_config.get("workers", "auto")
        urls = "and http(s) URLs" if self.urls else f"(http(s) URLs delegated: {self.urls_declined})"
        served = "image and video requests" if self.videos else "image-only requests"
        if self.videos and self.video_accelerator:
            served += (f" (videos decoded on the CPU as SGLang's CPU path decodes them; SGLang would use "
                       f"{self.video_accelerator}: docs/sglang.md)")  # fmt: skip
        videos = "" if self.videos else f"video ({self.videos_declined}), "
        return (
            f"mmworker: serving {served} ({self.processor_class} -> {mode}, patch {spec['patch_size']}, "
            f"pixels {spec['min_pixels']}..{spec['max_pixels']}, workers {workers}) from bytes, data: URLs, "
            f"base64 and files {urls}; delegating to SGLang's own path: {videos}audio, preprocessed or "
            "embedding inputs, PIL images, prompts whose placeholders SGLang would rewrite, and media "
            "mmworker does not decode (it names them per request)"
        )


def resolve(
    image_processor: Any,
    facts: ServerFacts,
    environ: Mapping[str, str] = os.environ,
    video: VideoFacts | None = None,
) -> Plan:
    """The plan for this model: what to serve and the pool's configuration, or why nothing is served.

    `video`: SGLang's video path for it (None: videos are not served)."""
    name = type(image_processor).__name__
    spec_settings = operator_spec_settings(environ)  # an operator's mistake stops the start, not just this model
    try:
        spec = {**_spec(image_processor, facts), **spec_settings}
        spec = QwenSpec.from_mapping(spec).to_mapping()  # mmworker's own checks (and the Pillow it reproduces)
    except _Declined as why:
        return Plan(spec=None, declined=str(why), processor_class=name)
    except MmError as exc:
        return Plan(spec=None, declined=str(exc), processor_class=name)
    if facts.tokenizer_workers > 1:
        return Plan(
            spec=None,
            declined=f"--tokenizer-worker-num {facts.tokenizer_workers}: each tokenizer process would start a pool "
            "pinned to the same cores; run one tokenizer process",
            processor_class=name,
        )
    urls, urls_declined = True, None
    if facts.allowed_media_domains:
        urls, urls_declined = (
            False,
            "--allowed-media-domains is set (SGLang matches hosts exactly, mmworker subdomains too)",
        )
    elif facts.media_url_max_file_size_mb != MAX_FETCH_BYTES >> 20:
        urls, urls_declined = (
            False,
            f"--media-url-max-file-size-mb {facts.media_url_max_file_size_mb} differs from mmworker's "
            f"{MAX_FETCH_BYTES >> 20} MiB per fetch",
        )
    videos_declined = "no video facts" if video is None else None
    if video is not None:
        try:
            spec = _with_videos(spec, video, _videos_on_accelerator(environ))
        except _Declined as why:
            videos_declined = str(why)
    return Plan(
        spec=spec,
        urls=urls,
        urls_declined=urls_declined,
        pool_config=pool_config(facts, environ),
        processor_class=name,
        videos=videos_declined is None,
        videos_declined=videos_declined,
        video_accelerator=video.accelerator if video is not None and videos_declined is None else None,
    )


def _operator_file(environ: Mapping[str, str]) -> tuple[str | None, dict[str, Any]]:
    """(path, contents) of the operator's TOML file (MMWORKER_SGLANG_CONFIG); (None, {}) if unset."""
    path = environ.get(CONFIG_ENV)
    if not path:
        return None, {}
    try:
        return path, tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MmError(f"{CONFIG_ENV}={path}: {exc}") from exc


def operator_spec_settings(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The spec keys the operator's TOML file sets (SPEC_KEYS), checked; {} when it sets none.

    `feature_dtype` defaults to float32 (module docstring), so that served features equal SGLang's own
    unless the operator opts in."""
    path, data = _operator_file(environ)
    settings = {key: data[key] for key in SPEC_KEYS if key in data}
    dtype = settings.get("feature_dtype", "float32")
    if not isinstance(dtype, str) or dtype not in FEATURE_DTYPES:
        raise MmError(
            f"{CONFIG_ENV}={path}: `feature_dtype` must be one of {', '.join(map(repr, FEATURE_DTYPES))}, got {dtype!r}"
        )
    return settings


def pool_config(facts: ServerFacts, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The pool's settings: SGLang's worker count, replies as they finish, SGLang's media behaviour,
    SGLang's preprocess-cache size (split over its tokenizer workers, each of which has a pool, as
    SGLang splits its own; the pool's default when not given) and whether it trusts callers'
    content hashes; then the operator's TOML file (MMWORKER_SGLANG_CONFIG), key by key, over them
    (all but SPEC_KEYS, which `operator_spec_settings` puts into the spec)."""
    config: dict[str, Any] = {
        "workers": facts.processor_workers or "auto",
        "ordered": False,  # each request awaits its own reply: a slow one must not hold the others
        # SGLang fetches from any host (private ones too) and reads any local path; so does the pool here.
        "media": {"allow_private": True, "allowed_local_roots": ["/"]},
        "trust_content_hashes": facts.trust_content_hashes,
    }
    if facts.preprocess_cache_mb is not None:
        config["cache_mib"] = max(0, facts.preprocess_cache_mb) // max(1, facts.tokenizer_workers)
    path, data = _operator_file(environ)
    config.update({key: value for key, value in data.items() if key not in SPEC_KEYS + PLUGIN_KEYS})
    try:
        PoolConfig.from_mapping(config)  # checked now, at start, not when the first request comes
    except MmError as exc:
        raise MmError(f"{CONFIG_ENV}={path}: {exc}" if path else str(exc)) from exc
    return config


class _Declined(Exception):
    """A setting mmworker does not reproduce: the plug-in serves nothing for this model."""


def _spec(ip: Any, facts: ServerFacts) -> dict[str, Any]:
    name = type(ip).__name__
    if facts.model_type not in SERVED_MODEL_TYPES:
        raise _Declined(f"model type {facts.model_type!r} is not one of {', '.join(SERVED_MODEL_TYPES)}")
    resample = RESAMPLE_OF_PROCESSOR.get(name)
    if resample is None:
        raise _Declined(f"image processor {name} is not one mmworker reproduces ({', '.join(RESAMPLE_OF_PROCESSOR)})")
    if resample == "pil" and pillow.IS_PILLOW_SIMD:
        raise _Declined(
            f"PIL is {pillow.installed()}, whose BICUBIC {name} would use; mmworker reproduces stock Pillow's"
        )
    for stage in ("do_resize", "do_rescale", "do_normalize"):
        if not getattr(ip, stage, True):
            raise _Declined(f"{name}.{stage} is off; mmworker always resizes, rescales and normalises")
    if getattr(ip, "rescale_factor", None) != 1 / 255:
        raise _Declined(f"{name}.rescale_factor is {getattr(ip, 'rescale_factor', None)!r}, not 1/255")
    if int(getattr(ip, "resample", _BICUBIC)) != _BICUBIC:
        raise _Declined(f"{name}.resample is {getattr(ip, 'resample', None)!r}, not BICUBIC")
    overrides = dict(facts.image_overrides or {})
    unmirrored = sorted(set(overrides) - MIRRORED_IMAGE_OVERRIDES)
    if unmirrored:
        raise _Declined(f"--mm-process-config image keys {unmirrored} are not mirrored (only min_pixels, max_pixels)")
    if facts.image_token_id is None:
        raise _Declined("the model config has no image_token_id")
    size = getattr(ip, "size", None)
    min_pixels = overrides.get("min_pixels", getattr(ip, "min_pixels", None) or _size_field(size, "shortest_edge"))
    max_pixels = overrides.get("max_pixels", getattr(ip, "max_pixels", None) or _size_field(size, "longest_edge"))
    try:
        spec = {
            "family": "qwen_vl",
            "image_token_id": int(facts.image_token_id),
            "patch_size": int(ip.patch_size),
            "merge_size": int(ip.merge_size),
            "temporal_patch_size": int(ip.temporal_patch_size),
            "min_pixels": int(min_pixels),
            "max_pixels": int(max_pixels),
            "image_mean": [float(v) for v in ip.image_mean],
            "image_std": [float(v) for v in ip.image_std],
            "resample": resample,
        }
    except (AttributeError, TypeError, ValueError) as exc:
        raise _Declined(f"{name} lacks a setting mmworker needs: {exc}") from exc
    for key in ("vision_start_token_id", "vision_end_token_id", "video_token_id"):
        if getattr(facts, key) is not None:
            spec[key] = int(getattr(facts, key))
    spec["model_type"] = facts.model_type  # what picks the video processors; images do not read it
    return spec


def _videos_on_accelerator(environ: Mapping[str, str]) -> str:
    """The operator's `videos_on_accelerator` (PLUGIN_KEYS), checked; "serve" when not set."""
    path, data = _operator_file(environ)
    value = data.get("videos_on_accelerator", "serve")
    if value not in VIDEOS_ON_ACCELERATOR:
        raise MmError(f"{CONFIG_ENV}={path}: `videos_on_accelerator` must be one of "
                      f"{', '.join(map(repr, VIDEOS_ON_ACCELERATOR))}, got {value!r}")  # fmt: skip
    return value


def _with_videos(spec: dict[str, Any], video: VideoFacts, on_accelerator: str = "serve") -> dict[str, Any]:
    """`spec` with what serving videos adds, checked as a family would take it; _Declined (videos only)
    for anything of SGLang's video path mmworker does not reproduce bit for bit."""
    model_type = spec["model_type"]
    if video_decoding.av is None:
        raise _Declined("PyAV, which mmworker decodes videos with, is not installed (pip install 'mmworker[video]')")
    if video.decoder != "torchcodec":
        raise _Declined(f"SGLang decodes videos with {video.decoder}; mmworker reproduces torchcodec's frames")
    if video.accelerator is not None and on_accelerator == "delegate":
        raise _Declined(
            f"SGLang would decode and process videos on {video.accelerator} (torchcodec's GPU decoder, the HF "
            'processor on the device), and the operator\'s file says videos_on_accelerator = "delegate"'
        )
    if video.overrides:
        raise _Declined(f"--mm-process-config video keys {sorted(video.overrides)} are not reproduced")
    for name, ours in SGLANG_VIDEO_CONSTANTS.items():
        theirs = video.sglang_constants.get(name)
        if theirs != ours:
            raise _Declined(f"SGLang's {name} is {theirs!r}, mmworker's {ours!r} (the environment's VIDEO_MAX_PIXELS?)")
    processor_class, video_processor_class = VIDEO_PROCESSOR_CLASSES[model_type]
    if video.processor_class != processor_class:
        raise _Declined(f"{model_type} videos come from {processor_class}; SGLang holds {video.processor_class}")
    _check_video_processor(video.video_processor, video_processor_class, spec, qwen_video.model_kind(model_type))
    spec = dict(spec)
    if qwen_video.model_kind(model_type) == "qwen2_5":
        tps = video.tokens_per_second
        if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not math.isfinite(tps) or tps <= 0:
            raise _Declined(f"the vision config's tokens_per_second is {tps!r}, not a positive number")
        spec["tokens_per_second"] = tps
    if qwen_video.model_kind(model_type) == "qwen3":
        if video.tokenize is None:
            raise _Declined("the HF processor has no tokenizer to write the timestamps with")
        try:
            spec["timestamp_table"] = {k: list(v) for k, v in timestamp_token_table(video.tokenize).items()}
        except MmError as exc:  # a tokenizer whose timestamp ids are not its pieces' (GPT-2-style digits)
            raise _Declined(str(exc)) from exc
    try:
        family = QwenVL.from_spec(spec)
    except MmError as exc:
        raise _Declined(str(exc)) from exc
    if not family.capabilities().video:
        raise _Declined(family.capabilities().note)
    return spec


def _check_video_processor(vp: Any, expected: str, spec: Mapping[str, Any], kind: str) -> None:
    """The HF video processor's settings are those mmworker.qwen_vl.video reproduces for this spec:
    the spec's patch, merge and temporal sizes, mean and std; every stage on, BICUBIC, 1/255; its pixel
    budget the image processor's (Qwen2, 2.5: the checkpoints build it from the image processor's
    config) or the Qwen3 checkpoints' 4096..25165824 over frames x height x width; no per-frame cap
    (transformers' `cap_pixels_per_frame`) and, for Qwen2, no frame sampling of its own."""
    name = type(vp).__name__
    if vp is None or name != expected:
        raise _Declined(f"the HF video processor is {name if vp is not None else 'missing'}, not {expected}")
    for key in ("patch_size", "merge_size", "temporal_patch_size"):
        if getattr(vp, key, None) != spec[key]:
            raise _Declined(f"{name}.{key} is {getattr(vp, key, None)!r}, the image processor's {spec[key]!r}")
    for key in ("image_mean", "image_std"):  # compared as the float32 values both normalise with
        values = getattr(vp, key, None)
        try:
            same = np.array_equal(np.asarray(values, np.float64).astype(np.float32), np.float32(spec[key]))
        except (TypeError, ValueError):
            same = False
        if not same:
            raise _Declined(f"{name}.{key} is {values!r}, not the image processor's {spec[key]!r}")
    for stage in ("do_resize", "do_rescale", "do_normalize"):
        if not getattr(vp, stage, True):
            raise _Declined(f"{name}.{stage} is off")
    if getattr(vp, "rescale_factor", None) != 1 / 255:
        raise _Declined(f"{name}.rescale_factor is {getattr(vp, 'rescale_factor', None)!r}, not 1/255")
    try:
        bicubic = int(getattr(vp, "resample", _BICUBIC)) == _BICUBIC
    except (TypeError, ValueError):  # a torchvision InterpolationMode, say
        bicubic = False
    if not bicubic:
        raise _Declined(f"{name}.resample is {getattr(vp, 'resample', None)!r}, not BICUBIC")
    if getattr(vp, "cap_pixels_per_frame", None):
        raise _Declined(f"{name}.cap_pixels_per_frame is set (mmworker reproduces transformers 5.19's default: unset)")
    if kind == "qwen3":
        budget = (qwen_video.QWEN3_VIDEO_MIN_PIXELS, qwen_video.QWEN3_VIDEO_MAX_PIXELS)
    else:
        budget = (spec["min_pixels"], spec["max_pixels"])
        if getattr(vp, "do_sample_frames", False):  # SGLang hands Qwen2's processor sampled frames, no metadata
            raise _Declined(f"{name}.do_sample_frames is on")
    size = getattr(vp, "size", None)
    found = (_size_field(size, "shortest_edge"), _size_field(size, "longest_edge"))
    if found != budget:
        raise _Declined(f"{name}'s pixel budget is {found[0]}..{found[1]}; mmworker's video path uses "
                        f"{budget[0]}..{budget[1]}")  # fmt: skip


def _size_field(size: Any, key: str) -> Any:
    """`size[key]` for a dict or transformers' SizeDict; None if absent."""
    if size is None:
        return None
    return size.get(key) if isinstance(size, Mapping) else getattr(size, key, None)
