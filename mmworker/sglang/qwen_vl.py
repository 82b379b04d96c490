"""The Qwen-VL processor SGLang instantiates when pointed at this package: mmworker's pool behind SGLang's own class.

`MmworkerQwenVLProcessor` subclasses SGLang's `QwenVLImageProcessor` and registers for Qwen2-VL,
2.5-VL, 3-VL, 3-VL-MoE, 3.5 and 3.5-MoE. Per request it either runs the work in a `WorkerPool`
(decode, smart_resize, resize, normalise, patchify, hash, placeholder expansion and M-RoPE, in
worker processes) and returns the `MultimodalProcessorOutput` SGLang's own path returns, or hands
the request to `super()` unchanged (`mmworker.sglang.requests` says which and why). What it can
serve at all is decided once (`mmworker.sglang.plan`) and logged in one line.

Where the pool lives: SGLang builds this processor in the TokenizerManager, which serves requests,
and again in each scheduler with `skip_mm_pool=True`, only for its M-RoPE fallback. Only the first
owns a pool (started here, closed by `shutdown()`, by garbage collection or at exit; a SIGKILL of
the serving process takes the workers with it and leaves no segment, as the pool guarantees); the
scheduler's starts no process and maps no shared memory. Workers: `--mm-processor-worker-num` when
set, else the pool's automatic plan, which keeps the cores SGLang reserves for its scheduler free.

The hand-off copies nothing: each item's `feature` is `torch.from_numpy` of the pool's read-only
view into its worker's ring (SGLang copies CPU features itself on the way to the scheduler, into its
message frames or shared-memory stubs, and never writes to them), and so are the M-RoPE positions.
With the spec's `feature_dtype` "bfloat16" (an operator's choice, float32 by default:
mmworker.sglang.plan) the view is uint16 holding bf16 bits and the tensor is its
`.view(torch.bfloat16)`, the same memory; SGLang's Qwen models cast features to the vision tower's dtype.
The reply's memory goes back to its worker when SGLang has dropped every tensor viewing it; a
consumer that keeps them too long makes later requests fail with a clear "shared memory full"
error (HTTP 503), never a hang or overwritten data. Hashes are mmworker's (blake3 of the encoded
bytes); SGLang derives pad values from them and never hashes the features.

Errors: a bad image or failed fetch raises `ImageRejected` (a ValueError: SGLang answers 400, naming
the image and the cause); a full queue or full shared memory raises `PoolBusy` (HTTP 503 from
SGLang's OpenAI and native endpoints); anything else the pool reports (a worker crashed, a deadline)
raises `PoolFailure` (500). The pool keeps serving after any of them. A request the workers find
outside what mmworker reproduces (an image format it does not decode, say) is handed to SGLang's
own path instead of failing. The pool's UsageError (it was used after `shutdown()`) is a bug here,
not a request's fault: a RuntimeError, it reaches SGLang as one, which answers 500.
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
from sglang.srt.multimodal.processors.qwen_vl import QwenVLImageProcessor
from sglang.srt.runtime_context import get_mm, get_serving
from sglang.srt.utils import ImageData

from mmworker.errors import MmError, Outcome
from mmworker.pool import Reply, WorkerPool
from mmworker.sglang import plan as planning
from mmworker.sglang.requests import Delegated, Prompting, fast_encode, route

log = logging.getLogger("mmworker.sglang")
# torch warns once that it wraps a read-only array (the rings are mapped read-only here); SGLang only
# reads features, and a per-call catch_warnings would cost each request more than the wrapping.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=__name__)


class ImageRejected(ValueError):
    """A request's image could not be used (corrupt, failed fetch, over a budget): SGLang answers 400."""


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
UNREPRODUCED = "input mmworker does not reproduce (image format, sample depth, size)"


class MmworkerQwenVLProcessor(QwenVLImageProcessor):
    """SGLang's Qwen-VL processor with image-only requests served by mmworker's worker pool."""

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
        self.plan = planning.resolve(getattr(self._processor, "image_processor", None), self._facts())
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
                             avoid_retokenize=avoid_retokenize, image_data_type=ImageData)  # fmt: skip
        if isinstance(decision, Delegated):
            return await self._delegate(decision.reason, image_data, input_text, request_obj, *args, **kwargs)
        reply = await self._pool.aprocess(decision.prompt, decision.sources, content_hashes=self._hashes(request_obj))
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

    def _prompting_of(self) -> Prompting | None:
        tokens = self.mm_tokens
        tokenizer = getattr(self._processor, "tokenizer", None)
        if tokenizer is None or not isinstance(tokens.image_token, str) or tokens.image_token_id is None:
            return None
        pad = tokenizer.convert_ids_to_tokens([tokens.image_token_id])[0]
        others = tuple(t for t in (tokens.video_token, tokens.audio_token, "<image>") if isinstance(t, str) and t)
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
            return ImageRejected(f"mmworker: {reply.error}")
        return PoolFailure(f"mmworker: {reply.error}")

    def _output(self, reply: Reply) -> MultimodalProcessorOutput:
        """SGLang's processor output over the reply's views; the reply's memory goes back when SGLang drops them."""
        items = []
        for item, offset in zip(reply.items, reply.offsets, strict=True):
            grid = torch.from_numpy(item.aux["image_grid_thw"].reshape(1, 3))  # int64 [[t, h, w]], as SGLang's
            feature = torch.from_numpy(item.feature)
            if self._bf16:  # uint16 bf16 bits -> the bf16 tensor they are, zero-copy (numpy has no bfloat16)
                feature = feature.view(torch.bfloat16)
            mm_item = MultimodalDataItem(
                modality=Modality.IMAGE,
                feature=feature,
                offsets=[offset],
                model_specific_data={"image_grid_thw": grid},
            )
            mm_item.set_hash(item.hash)
            items.append(mm_item)
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
