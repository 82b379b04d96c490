"""The Qwen-VL processor SGLang instantiates when pointed at this package: mmworker's pool behind SGLang's own class.

`MmworkerQwenVLProcessor` subclasses SGLang's `QwenVLImageProcessor` and registers for Qwen2-VL,
2.5-VL, 3-VL, 3-VL-MoE, 3.5 and 3.5-MoE. Per request it either runs the work in a `WorkerPool`
(decode, smart_resize, resize, normalise, patchify, hash, placeholder expansion and M-RoPE, in
worker processes; for a video also its sampling and both resizes) and returns the
`MultimodalProcessorOutput` SGLang's own path returns, or hands the request to `super()` unchanged
(`mmworker.sglang.requests` says which and why). What it can serve at all is decided once
(`mmworker.sglang.plan`) and logged in one line.

Items are SGLang's: each image one IMAGE item, then the videos as SGLang's
`get_new_expanded_mm_items` leaves them (docs/behaviour.md §15.3): one VIDEO item per video whose
`offsets` are its placeholder runs (one per temporal patch for Qwen3 and 3.5), except that SGLang
keeps several Qwen2 or 2.5 videos in ONE item unless every one is a single temporal patch: that item
holds all their runs, their features one after the other, `video_grid_thw` [n, 3] and Qwen2.5's
`second_per_grid_ts` [n], and a hash of theirs.

Where the pool lives: SGLang builds this processor in the TokenizerManager, which serves requests,
and again in each scheduler with `skip_mm_pool=True`, only for its M-RoPE fallback. Only the first
owns a pool (started here, closed by `shutdown()`, by garbage collection or at exit; a SIGKILL of
the serving process takes the workers with it and leaves no segment, as the pool guarantees); the
scheduler's starts no process and maps no shared memory. Workers: `--mm-processor-worker-num` when
set, else the pool's automatic plan, which keeps the cores SGLang reserves for its scheduler free.

The hand-off copies nothing but such a bundle's features (SGLang's item holds one tensor, so the
videos' features are concatenated into a new one): each other item's `feature` is `torch.from_numpy`
of the pool's read-only view into its worker's ring (SGLang copies CPU features itself on the way to
the scheduler, into its message frames or shared-memory stubs, and never writes to them), and so are
the M-RoPE positions.
With the spec's `feature_dtype` "bfloat16" (an operator's choice, float32 by default:
mmworker.sglang.plan) the view is uint16 holding bf16 bits and the tensor is its
`.view(torch.bfloat16)`, the same memory; SGLang's Qwen models cast features to the vision tower's dtype.
The reply's memory goes back to its worker when SGLang has dropped every tensor viewing it; a
consumer that keeps them too long makes later requests fail with a clear "shared memory full"
error (HTTP 503), never a hang or overwritten data. Hashes are mmworker's (blake3 of the encoded
bytes); SGLang derives pad values from them and never hashes the features.

Errors: a bad image or video or a failed fetch raises `MediaRejected` (a ValueError: SGLang answers
400, naming "image k" or "video k" and the cause; `ImageRejected`, its name before videos, is the same
class); a full queue or full shared memory raises `PoolBusy` (HTTP 503 from
SGLang's OpenAI and native endpoints); anything else the pool reports (a worker crashed, a deadline)
raises `PoolFailure` (500). The pool keeps serving after any of them. A request the workers find
outside what mmworker reproduces (an image format it does not decode, a video container it does not
open, say) is handed to SGLang's own path instead of failing. The pool's UsageError (it was used
after `shutdown()`) is a bug here, not a request's fault: a RuntimeError, it reaches SGLang as one,
which answers 500.
"""

import dataclasses
import logging
import warnings
from collections import Counter
from typing import Any

import numpy as np
import torch
from fastapi import HTTPException
from sglang.srt.environ import envs
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalProcessorOutput
from sglang.srt.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from sglang.srt.models.qwen2_vl import Qwen2VLForConditionalGeneration
from sglang.srt.models.qwen3_5 import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration
from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration
from sglang.srt.models.qwen3_vl_moe import Qwen3VLMoeForConditionalGeneration
from sglang.srt.multimodal.processors import qwen_vl as sglang_qwen_vl
from sglang.srt.multimodal.processors.qwen_vl import QwenVLImageProcessor
from sglang.srt.platforms import current_platform
from sglang.srt.runtime_context import get_mm, get_serving
from sglang.srt.utils import ImageData, VideoData, is_cpu, is_npu, is_xpu, video_decoder

from mmworker.common.hashing import content_hash
from mmworker.errors import MmError, Outcome
from mmworker.pipeline import VIDEO
from mmworker.pool import Reply, WorkerPool
from mmworker.sglang import plan as planning
from mmworker.sglang.requests import Delegated, Prompting, fast_encode, route

log = logging.getLogger("mmworker.sglang")
# torch warns once that it wraps a read-only array (the rings are mapped read-only here); SGLang only
# reads features, and a per-call catch_warnings would cost each request more than the wrapping.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=__name__)


class MediaRejected(ValueError):
    """A request's image or video could not be used (corrupt, failed fetch, over a budget): SGLang answers
    400. The message names the item ("image k", "video k", counted within its modality) and the cause."""


# The name before videos were served, kept: the same class, so `except ImageRejected` still catches
# every rejected item, a video's too.
ImageRejected = MediaRejected


class PoolBusy(HTTPException, ValueError):
    """The pool's queue or shared memory is full: SGLang answers 503 (retry later).

    An HTTPException for SGLang's OpenAI endpoints, a ValueError with `status_code` for its native ones.
    """

    def __init__(self, message: str) -> None:
        HTTPException.__init__(self, status_code=503, detail=message)

    def __str__(self) -> str:
        return str(self.detail)


class PoolFailure(RuntimeError):
    """The pool could not produce a reply (a worker crashed, a deadline passed): SGLang answers 500."""


_BUSY = (Outcome.QUEUE_FULL, Outcome.MEMORY_FULL)
# stats()'s reason for requests the workers found outside what mmworker reproduces (Outcome.UNSUPPORTED).
UNREPRODUCED = "input mmworker does not reproduce (image format, sample depth, size; video container, codec)"


class MmworkerQwenVLProcessor(QwenVLImageProcessor):
    """SGLang's Qwen-VL processor with image and video requests served by mmworker's worker pool."""

    models = [  # noqa: RUF012 (SGLang reads this class attribute as a list)
        Qwen2VLForConditionalGeneration,
        Qwen2_5_VLForConditionalGeneration,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeForConditionalGeneration,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5MoeForConditionalGeneration,
    ]

    def __init__(self, hf_config: Any, server_args: Any, _processor: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(hf_config, server_args, _processor, *args, **kwargs)
        self._served = 0
        self._delegated: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._pool: WorkerPool | None = None
        self._prompting: Prompting | None = None
        self._bf16 = False  # features are uint16 bf16 bits, handed on as torch.bfloat16 (module docstring)
        if kwargs.get("skip_mm_pool", False):  # the scheduler's instance: M-RoPE only, no processes, no memory
            self.plan = planning.Plan(spec=None, declined="the scheduler's instance (skip_mm_pool)")
            return
        self.plan = planning.resolve(getattr(self._processor, "image_processor", None), self._facts(),
                                     video=self._video_facts())  # fmt: skip
        self._prompting = self._prompting_of()
        if self.plan.spec is not None and self._prompting is None:
            why = "the HF processor has no tokenizer or no image placeholder token"
            self.plan = dataclasses.replace(self.plan, spec=None, declined=why)
        log.info(self.plan.describe())
        if self.plan.spec is None:
            return
        self._bf16 = self.plan.spec.get("feature_dtype") == "bfloat16"
        try:
            self._pool = WorkerPool(self.plan.spec, self.plan.pool_config)
        except MmError as exc:  # SGLang's own path still serves everything: say so, do not stop the server
            log.error("mmworker: the worker pool did not start (%s); every request goes to SGLang's own path", exc)
            return
        log.info("mmworker: %d worker(s) ready; %s", self._pool.stats().workers,
                 self._pool.plan.describe().replace("\n", "; "))  # fmt: skip

    # --- SGLang's entry point ----------------------------------------------------------------------

    async def process_mm_data_async(
        self, image_data: list[Any], input_text: Any, request_obj: Any, *args: Any, **kwargs: Any
    ) -> MultimodalProcessorOutput:
        if self._pool is None:
            decision = Delegated("not served for this model")
        else:
            avoid_retokenize = envs.SGLANG_MM_AVOID_RETOKENIZE.get()
            decision = route(image_data, input_text, request_obj, self._prompting, urls=self.plan.urls,
                             avoid_retokenize=avoid_retokenize, image_data_type=ImageData, videos=self.plan.videos,
                             video_data_type=VideoData)  # fmt: skip
        if isinstance(decision, Delegated):
            return await self._delegate(decision.reason, image_data, input_text, request_obj, *args, **kwargs)
        reply = await self._pool.aprocess(decision.prompt, decision.sources, videos=decision.videos,
                                          content_hashes=self._hashes(request_obj))  # fmt: skip
        if not reply.ok:
            if reply.kind is Outcome.UNSUPPORTED:
                why = UNREPRODUCED  # a stable key for stats(); the worker's own words go to the log
                log.debug("mmworker: %s: %s", why, reply.error)
                return await self._delegate(why, image_data, input_text, request_obj, *args, **kwargs)
            self._rejected[reply.kind.value] += 1
            raise self._error(reply)
        self._served += 1
        return self._output(reply)

    def _hashes(self, request_obj: Any) -> list[str | None] | None:
        """The request's content hashes (SGLang's `mm_content_hashes`, one per image, normalised by
        its TokenizerManager), for a pool that trusts them (--trust-mm-content-hashes) to key its
        cache with; None otherwise."""
        if not self._pool.config.trust_content_hashes:
            return None
        return getattr(request_obj, "mm_content_hashes", None)

    def stats(self) -> dict[str, Any]:
        """Requests served by mmworker, handed to SGLang's own path (by reason) and rejected (by kind)."""
        return {
            "serving": self._pool is not None,
            "declined": self.plan.declined,
            "served": self._served,
            "delegated": sum(self._delegated.values()),
            "delegated_by_reason": dict(self._delegated),
            "rejected_by_kind": dict(self._rejected),
            "pool": self._pool.stats() if self._pool is not None else None,
        }

    def shutdown(self) -> None:
        """Close the pool (its workers and shared memory), then SGLang's own executors."""
        if self._pool is not None:
            self._pool.close()
        super().shutdown()

    # --- the parts ---------------------------------------------------------------------------------

    def _facts(self) -> planning.ServerFacts:
        mm, serving = get_mm(), get_serving()
        return planning.ServerFacts(
            model_type=self.model_type,
            image_token_id=self.IM_TOKEN_ID,
            vision_start_token_id=self.vision_start_token_id,
            vision_end_token_id=self.vision_end_token_id,
            video_token_id=self.VIDEO_TOKEN_ID,
            image_overrides=dict(self.image_config or {}),
            processor_workers=int(mm.mm_processor_worker_num or 0),
            tokenizer_workers=max(int(serving.tokenizer_worker_num or 1), 1),
            allowed_media_domains=tuple(mm.allowed_media_domains or ()),
            media_url_max_file_size_mb=int(mm.media_url_max_file_size_mb),
            preprocess_cache_mb=None if mm.mm_preprocess_cache_size_mb is None else int(mm.mm_preprocess_cache_size_mb),
            trust_content_hashes=bool(mm.trust_mm_content_hashes),
        )

    def _video_facts(self) -> planning.VideoFacts:
        """What the plan needs of SGLang's video path for this model, read as SGLang reads it."""
        processor = self._processor
        tokenizer = getattr(processor, "tokenizer", None)
        encode = fast_encode(tokenizer) if tokenizer is not None else None
        return planning.VideoFacts(
            processor_class=type(processor).__name__,
            video_processor=getattr(processor, "video_processor", None),
            tokenize=(lambda text: encode(text, False)) if encode is not None else None,
            tokens_per_second=self._tokens_per_second,  # SGLang's: the vision config's, or None
            overrides=dict(self.video_config or {}),
            decoder=video_decoder._BACKEND,
            accelerator=_video_accelerator(),
            sglang_constants={name: getattr(sglang_qwen_vl, name, None) for name in planning.SGLANG_VIDEO_CONSTANTS},
        )

    def _prompting_of(self) -> Prompting | None:
        tokens = self.mm_tokens
        tokenizer = getattr(self._processor, "tokenizer", None)
        if tokenizer is None or not isinstance(tokens.image_token, str) or tokens.image_token_id is None:
            return None
        pad = tokenizer.convert_ids_to_tokens([tokens.image_token_id])[0]
        others = tuple(t for t in (tokens.audio_token, "<image>") if isinstance(t, str) and t)
        video_pad = tokens.video_token if isinstance(tokens.video_token, str) and tokens.video_token else None
        video_token = None
        if video_pad is not None and None not in (self.vision_start_token_id, self.vision_end_token_id):
            start, end = tokenizer.convert_ids_to_tokens([self.vision_start_token_id, self.vision_end_token_id])
            video_token = f"{start}{video_pad}{end}"
        bos = getattr(tokenizer, "bos_token", None)
        return Prompting(
            tokenizer=tokenizer,
            encode=fast_encode(tokenizer),
            image_token=tokens.image_token,
            image_pad=pad,
            image_token_id=tokens.image_token_id,
            other_placeholders=others,
            artifact_path=bool(self.mm_preprocess_cache.enabled or self.uses_media_artifacts_without_cache),
            bos_guard=bos if (self._tokenizer_auto_adds_specials and bos) else None,
            video_token=video_token,
            video_pad=video_pad,
            video_token_id=tokens.video_token_id,
            vision_start_token_id=self.vision_start_token_id,
            vision_end_token_id=self.vision_end_token_id,
        )

    async def _delegate(self, reason: str, *args: Any, **kwargs: Any) -> MultimodalProcessorOutput:
        if reason not in self._delegated:
            log.info("mmworker: handing requests to SGLang's own path: %s (stats() counts them)", reason)
        self._delegated[reason] += 1
        return await super().process_mm_data_async(*args, **kwargs)

    def _error(self, reply: Reply) -> Exception:
        if reply.kind in _BUSY:
            return PoolBusy(f"mmworker: {reply.error}")
        if reply.kind is Outcome.BAD_INPUT:
            return MediaRejected(f"mmworker: {reply.error}")
        return PoolFailure(f"mmworker: {reply.error}")

    def _feature(self, view: np.ndarray) -> torch.Tensor:
        feature = torch.from_numpy(view)
        if self._bf16:  # uint16 bf16 bits -> the bf16 tensor they are, zero-copy (numpy has no bfloat16)
            feature = feature.view(torch.bfloat16)
        return feature

    def _output(self, reply: Reply) -> MultimodalProcessorOutput:
        """SGLang's processor output over the reply's views; the reply's memory goes back when SGLang drops them."""
        items, videos = [], []
        for item, runs in zip(reply.items, reply.runs, strict=True):
            if item.modality == VIDEO:
                videos.append((item, runs))
                continue
            grid = torch.from_numpy(item.aux["image_grid_thw"].reshape(1, 3))  # int64 [[t, h, w]], as SGLang's
            mm_item = MultimodalDataItem(
                modality=Modality.IMAGE,
                feature=self._feature(item.feature),
                offsets=[(int(start), int(end)) for start, end in runs],
                model_specific_data={"image_grid_thw": grid},
            )
            mm_item.set_hash(item.hash)
            items.append(mm_item)
        items += self._video_items(videos)
        input_ids = reply.input_ids.tolist()
        positions = torch.from_numpy(reply.positions)
        reply.release_on_drop()
        if self.keep_mm_features_on_device:  # SGLang's CUDA transports: mark items as its own path does
            self._mark_cuda_ipc_features_for_deferred_reconstruction(items)
        return MultimodalProcessorOutput(
            input_ids=input_ids,
            padded_input_ids=MultimodalProcessorOutput.build_padded_input_ids(input_ids, items),
            mm_items=items,
            im_start_id=self.vision_start_token_id,
            im_end_id=self.vision_end_token_id,
            im_token_id=self.mm_tokens.image_token_id,
            video_token_id=self.mm_tokens.video_token_id,
            audio_token_id=self.mm_tokens.audio_token_id,
            mrope_positions=positions,
            mrope_position_delta=torch.from_numpy(np.array([[reply.delta]], np.int64)),
        )

    def _video_items(self, videos: list[tuple[Any, Any]]) -> list[MultimodalDataItem]:
        """The VIDEO items SGLang's own path hands on for these videos (module docstring): one per video,
        or, where SGLang's `get_new_expanded_mm_items` leaves its per-modality item whole (more than one
        run in all, and fewer runs than temporal patches: several Qwen2/2.5 videos, not all of one
        temporal patch), one for all."""
        data = [{key: torch.from_numpy(value) for key, value in self._pool.family.model_data(item.aux).items()}
                for item, _ in videos]  # fmt: skip
        runs = [[(int(start), int(end)) for start, end in item_runs] for _, item_runs in videos]
        patches = sum(int(d["video_grid_thw"][0, 0]) for d in data)
        if sum(map(len, runs)) <= 1 or sum(map(len, runs)) == patches:
            items = []
            for (item, _), item_runs, model_data in zip(videos, runs, data, strict=True):
                mm_item = MultimodalDataItem(modality=Modality.VIDEO, feature=self._feature(item.feature),
                                             offsets=item_runs, model_specific_data=model_data)  # fmt: skip
                mm_item.set_hash(item.hash)
                items.append(mm_item)
            return items
        # SGLang's processor output holds all the videos in one tensor; this copy is the one the bundle costs.
        feature = torch.cat([self._feature(item.feature) for item, _ in videos])
        model_data = {key: torch.cat([d[key] for d in data]) for key in data[0]}
        bundle = MultimodalDataItem(modality=Modality.VIDEO, feature=feature,
                                    offsets=[run for item_runs in runs for run in item_runs],
                                    model_specific_data=model_data)  # fmt: skip
        # One hash for the bundle, from its videos' in order (each the blake3 of the video's bytes).
        bundle.set_hash(content_hash(b"".join(int(item.hash).to_bytes(8, "big") for item, _ in videos)))
        return [bundle]


def _video_accelerator() -> str | None:
    """The device SGLang would decode or process this process's videos on, or None for the CPU.

    SGLang's Qwen processor has no `video_preprocessing_device`, so `load_video` asks torchcodec for
    its CUDA decoder (NVDEC) and falls back to the CPU only when that fails: whenever torch sees a
    GPU. And the HF processor runs where the fast image processor runs (`device` is passed to the
    video processor too): on any accelerator unless SGLANG_USE_CPU_ENGINE says the CPU."""
    if torch.cuda.is_available():
        return "CUDA"
    if not is_cpu() and (is_xpu() or is_npu() or current_platform.is_cuda_alike()):
        return str(current_platform.device_type).upper()
    return None
