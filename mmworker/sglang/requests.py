"""One request: served by mmworker (its prompt ids, image and video sources), or handed to SGLang's own path.

A request is served only when the result is certain to be what SGLang's built-in Qwen-VL processor
would produce; anything else is delegated with a short reason (counted in `stats()`):

- **Modalities.** Images and videos (videos when the plan serves them): a request with audio, or
  with a preprocessed (`processor_output`) or `precomputed_embedding` item, goes to SGLang.
- **Image sources**, resolved the way SGLang's `load_image` resolves them: `bytes`; `ImageData`
  (its `url`, when it asks for no preprocessing of its own); strings: `http(s)://` (when the plan
  serves URLs), `file://` (its unquoted URL path), paths starting with `/`, `data:` URLs
  (everything after the first comma is base64) and bare base64. A payload SGLang's strict base64
  decoder would reject for whitespace is delegated, so that SGLang says so. PIL images and anything
  else go to SGLang.
- **Video sources**, resolved the way SGLang's `load_video` resolves them: `bytes`; `VideoData` (its
  `url`, when it carries no preprocessing options); strings: `http(s)://` (when the plan serves
  URLs), `data:` URLs, `file://` (its unquoted URL path), an absolute path that SGLang opens as
  written (no `%`-escapes, `?`, `#` or `;` that its URL parsing would take apart) and bare base64.
  A string naming a file relative to SGLang's working directory, which SGLang would open, is
  delegated; so are decoded frames (lists, tensors, arrays) and preprocessed dicts.
- **Prompt.** A string whose placeholders are exactly SGLang's
  `<|vision_start|><|image_pad|><|vision_end|>`, one per image, and
  `<|vision_start|><|video_pad|><|vision_end|>`, one per video (no `<image>` sentinel, no runs of
  pads, no audio placeholders), tokenised as SGLang tokenises it: by the HF processor's tokenizer,
  unexpanded (the pads are special tokens, and so are the vision start and end around them, which
  isolate Qwen3's timestamp text: expanding after tokenising gives the same ids as tokenising the
  expanded text, docs/behaviour.md §15.2), with SGLang's guard against a second BOS. A list of
  ids (a pre-tokenised prompt) is decoded for that check and then used as SGLang uses it: as given
  where SGLang keeps the caller's ids (for image-only requests: its artifact path, or
  `SGLANG_MM_AVOID_RETOKENIZE`, on by default), else decoded and tokenised again (always, with a
  video).
"""

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from mmworker.common.budget import MAX_ITEMS_PER_REQUEST

_WHITESPACE = " \t\n\r\x0b\x0c"
# Longer strings name no file (Linux's PATH_MAX): SGLang's is-it-a-file check cannot succeed on them,
# so a long base64 payload is never parsed as a URL or looked up.
_PATH_MAX = 4096


@dataclass(frozen=True)
class Served:
    prompt: list[int]  # the prompt's ids, one placeholder per image and per video, unexpanded
    sources: list[str | bytes]  # mmworker sources, in image order
    videos: list[str | bytes] = field(default_factory=list)  # mmworker sources, in video order


@dataclass(frozen=True)
class Delegated:
    reason: str  # short and stable: stats() counts requests by it


@dataclass(frozen=True)
class Prompting:
    """What the router needs of the processor it serves for: tokenizer, placeholder strings and ids."""

    tokenizer: Any
    encode: Callable[[str, bool], list[int]]  # (text, add_special_tokens) -> ids: `fast_encode(tokenizer)`
    image_token: str  # "<|vision_start|><|image_pad|><|vision_end|>"
    image_pad: str  # "<|image_pad|>"
    image_token_id: int
    other_placeholders: tuple[str, ...]  # audio placeholder strings, "<image>"
    artifact_path: bool  # SGLang's artifact path: caller ids kept, text tokenised with plain encode()
    bos_guard: str | None  # the BOS of a tokenizer that adds specials itself (SGLang's double-BOS guard)
    video_token: str | None = None  # "<|vision_start|><|video_pad|><|vision_end|>"
    video_pad: str | None = None  # "<|video_pad|>" (SGLang's video placeholder)
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None


def fast_encode(tokenizer: Any) -> Callable[[str, bool], list[int]]:
    """`tokenizer.encode(text, add_special_tokens=...)` of a fast HF tokenizer, without its Python layers.

    For one text that call comes down to the Rust tokenizer's `encode_batch([text])` with
    truncation and padding off and `encode_special_tokens` set from `split_special_tokens`; its
    Python around that (validation, BatchEncoding twice) costs the event loop ~4 times the Rust
    call. So this calls the Rust tokenizer itself whenever its state is what HF would set, and HF's
    encode otherwise (a tokenizer without a Rust backend, or one configured to truncate).
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    if not callable(getattr(backend, "encode", None)) or not hasattr(backend, "truncation"):
        return lambda text, specials: tokenizer.encode(text, add_special_tokens=specials)
    split = bool(getattr(tokenizer, "split_special_tokens", False))

    def encode(text: str, specials: bool) -> list[int]:
        if backend.truncation is not None or backend.encode_special_tokens != split:
            return tokenizer.encode(text, add_special_tokens=specials)
        return backend.encode(text, add_special_tokens=specials).ids

    return encode


def route(
    image_data: Sequence[Any] | None,
    input_text: str | list[int] | None,
    request_obj: Any,
    prompting: Prompting,
    *,
    urls: bool,
    avoid_retokenize: bool,
    image_data_type: type | None = None,
    videos: bool = False,
    video_data_type: type | None = None,
) -> Served | Delegated:
    """Decide one request; `image_data_type` is SGLang's `ImageData` class, `video_data_type` its
    `VideoData`; `videos`: the plan serves videos (else a request with one is delegated)."""
    video_data = getattr(request_obj, "video_data", None)
    if getattr(request_obj, "audio_data", None):
        return Delegated("audio")
    if not image_data and not video_data:
        return Delegated("no images")
    if video_data:
        if not videos:
            return Delegated("video (not served for this model)")
        if not isinstance(video_data, list):
            return Delegated("video_data that is not a list")
    image_data, video_data = list(image_data or ()), list(video_data or ())
    if len(image_data) + len(video_data) > MAX_ITEMS_PER_REQUEST:
        return Delegated(f"more than {MAX_ITEMS_PER_REQUEST} images and videos")
    sources = _sources(image_data, lambda item: _source(item, urls, image_data_type))
    if isinstance(sources, Delegated):
        return sources
    video_sources = _sources(video_data, lambda item: _video_source(item, urls, video_data_type))
    if isinstance(video_sources, Delegated):
        return video_sources
    # With a video SGLang's path never keeps the caller's ids (its avoid-retokenize step is for
    # image-only requests, and the artifact path takes no video): decoded and tokenised again.
    keep_ids = not video_sources and (prompting.artifact_path or avoid_retokenize)
    prompt = _prompt(input_text, len(sources), len(video_sources), prompting, keep_ids)
    if isinstance(prompt, Delegated):
        return prompt
    return Served(prompt, sources, video_sources)


def _sources(items: list[Any], resolve: Callable[[Any], str | bytes | Delegated]) -> list[str | bytes] | Delegated:
    """Each item as an mmworker source, or the first item's reason to delegate the request."""
    sources = []
    for item in items:
        source = resolve(item)
        if isinstance(source, Delegated):
            return source
        sources.append(source)
    return sources


def _source(item: Any, urls: bool, image_data_type: type | None) -> str | bytes | Delegated:
    """`item` as an mmworker source, resolved as SGLang's `load_image` resolves it."""
    if image_data_type is not None and isinstance(item, image_data_type):
        if any(getattr(item, key, None) for key in ("preprocess_kwargs", "max_long_side_pixel", "max_dynamic_patch")):
            return Delegated("ImageData with preprocessing options")
        item = item.url
    if type(item) is bytes:  # SGLang takes bytes only (a bytearray is an error there)
        return item
    if not isinstance(item, str):
        return Delegated(f"{type(item).__name__} image" if not isinstance(item, dict) else "preprocessed input")
    if item.startswith(("http://", "https://")):
        return item if urls else Delegated("http(s) URL")
    if item.startswith("file://"):
        path = unquote(urlparse(item).path)  # what SGLang opens
        return path if path.startswith("/") else Delegated("file:// URL without an absolute path")
    if item.startswith("/"):
        return item
    return _base64(item[item.find(",") + 1 :] if item.startswith("data:") else item, item)


def _video_source(item: Any, urls: bool, video_data_type: type | None) -> str | bytes | Delegated:
    """`item` as an mmworker source, resolved as SGLang's `load_video` (`_normalize_video_input`) resolves it."""
    if video_data_type is not None and isinstance(item, video_data_type):
        if getattr(item, "preprocess_kwargs", None) or getattr(item, "max_long_side_pixel", None) is not None:
            return Delegated("VideoData with preprocessing options")
        item = item.url
    if type(item) is bytes:  # SGLang takes bytes only (a bytearray is an error there)
        return item
    if isinstance(item, dict):
        return Delegated("preprocessed input")
    if not isinstance(item, str):  # decoded frames (a list, tensor or array), which SGLang uses as they are
        return Delegated(f"{type(item).__name__} video")
    if item.startswith(("http://", "https://")):
        return item if urls else Delegated("http(s) URL")
    if item.startswith("data:"):
        return _base64(item[item.find(",") + 1 :], item)
    if item.startswith("file://"):
        path = unquote(urlparse(item).path)  # what SGLang opens
        return path if path.startswith("/") else Delegated("file:// URL without an absolute path")
    # Any other string naming an existing file SGLang opens as written (relative ones from its working
    # directory); the rest it decodes as base64.
    try:
        named = unquote(urlparse(item).path) if len(item) <= _PATH_MAX else None
    except ValueError:  # urlparse refuses it (a bracket in what it takes for a host)
        return Delegated("a video source SGLang's URL parsing refuses")
    if item.startswith("/"):
        # mmworker reads the path as written; SGLang looks for the file under its URL-parsed form.
        return item if named == item else Delegated("a video path that SGLang's URL parsing changes")
    if named and os.path.isfile(named):
        return Delegated("relative video path")
    return _base64(item, item)


def _base64(payload: str, source: str) -> str | Delegated:
    if not payload or payload[0] in _WHITESPACE or payload[-1] in _WHITESPACE:
        return Delegated("base64 with surrounding whitespace")  # SGLang rejects it; mmworker would trim
    return source


def _prompt(text: Any, n_images: int, n_videos: int, p: Prompting, keep_ids: bool) -> list[int] | Delegated:
    ids_given = None
    if isinstance(text, list):
        if not text or not all(type(t) is int for t in text):
            return Delegated("prompt ids that are not a list of ints")
        ids_given, text = text, p.tokenizer.decode(text)
    if not isinstance(text, str):
        return Delegated("no prompt text")
    if text.count(p.image_token) != n_images or text.count(p.image_pad) != n_images:
        return Delegated("image placeholders other than one <|vision_start|><|image_pad|><|vision_end|> per image")
    if p.video_pad and (text.count(p.video_pad) != n_videos or text.count(p.video_token or p.video_pad) != n_videos):
        return Delegated("video placeholders other than one <|vision_start|><|video_pad|><|vision_end|> per video")
    if any(other and other in text for other in p.other_placeholders):
        return Delegated("audio or <image> placeholders in the prompt")
    if ids_given is not None and keep_ids:
        ids = list(ids_given)
    elif (p.artifact_path and not n_videos) or not (p.bos_guard and text.startswith(p.bos_guard)):
        ids = p.encode(text, True)
    else:  # the HF processor's call, with SGLang's guard against a second BOS
        ids = p.encode(text, False)
    if ids.count(p.image_token_id) != n_images:
        return Delegated("image placeholder ids that do not match the images")
    if n_videos and not _video_blocks(ids, n_videos, p):
        return Delegated("video placeholder ids that do not match the videos")
    return ids


def _video_blocks(ids: list[int], n_videos: int, p: Prompting) -> bool:
    """Exactly `n_videos` video pads in `ids`, each between a vision start and a vision end: what
    mmworker's expansion needs of a Qwen3 prompt (the timestamp text cannot join the text before it)."""
    if p.video_token_id is None or ids.count(p.video_token_id) != n_videos:
        return False
    at = -1
    for _ in range(n_videos):
        at = ids.index(p.video_token_id, at + 1)
        if not 0 < at < len(ids) - 1 or ids[at - 1] != p.vision_start_token_id or ids[at + 1] != p.vision_end_token_id:
            return False
    return True
