"""One request: served by mmworker (its prompt ids and image sources), or handed to SGLang's own path.

A request is served only when the result is certain to be what SGLang's built-in Qwen-VL processor
would produce; anything else is delegated with a short reason (counted in `stats()`):

- **Modalities.** Images only: a request with video or audio, or with a preprocessed
  (`processor_output`) or `precomputed_embedding` item, goes to SGLang.
- **Sources**, resolved the way SGLang's `load_image` resolves them: `bytes`; `ImageData` (its
  `url`, when it asks for no preprocessing of its own); strings: `http(s)://` (when the plan serves
  URLs), `file://` (its unquoted URL path), paths starting with `/`, `data:` URLs (everything after
  the first comma is base64) and bare base64. A payload SGLang's strict base64 decoder would reject
  for whitespace is delegated, so that SGLang says so. PIL images and anything else go to SGLang.
- **Prompt.** A string whose image placeholders are exactly SGLang's
  `<|vision_start|><|image_pad|><|vision_end|>`, one per image (no `<image>` sentinel, no runs of
  pads, no video or audio placeholders), tokenised as SGLang tokenises it: by the HF processor's
  tokenizer, unexpanded (the image pad is a special token, so expanding after tokenising gives the
  same ids as tokenising the expanded text), with SGLang's guard against a second BOS. A list of
  ids (a pre-tokenised prompt) is decoded for that check and then used as SGLang uses it: as given
  where SGLang keeps the caller's ids (its artifact path, or `SGLANG_MM_AVOID_RETOKENIZE`, on by
  default), else decoded and tokenised again.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from mmworker.common.budget import MAX_ITEMS_PER_REQUEST

_WHITESPACE = " \t\n\r\x0b\x0c"


@dataclass(frozen=True)
class Served:
    prompt: list[int]  # the prompt's ids, one image placeholder per image, unexpanded
    sources: list[str | bytes]  # mmworker sources, in image order


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
    other_placeholders: tuple[str, ...]  # video and audio placeholder strings, "<image>"
    artifact_path: bool  # SGLang's artifact path: caller ids kept, text tokenised with plain encode()
    bos_guard: str | None  # the BOS of a tokenizer that adds specials itself (SGLang's double-BOS guard)


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
) -> Served | Delegated:
    """Decide one request; `image_data_type` is SGLang's `ImageData` class."""
    if not image_data:
        return Delegated("no images")
    if getattr(request_obj, "video_data", None) or getattr(request_obj, "audio_data", None):
        return Delegated("video or audio")
    if len(image_data) > MAX_ITEMS_PER_REQUEST:
        return Delegated(f"more than {MAX_ITEMS_PER_REQUEST} images")
    sources: list[str | bytes] = []
    for item in image_data:
        source = _source(item, urls, image_data_type)
        if isinstance(source, Delegated):
            return source
        sources.append(source)
    prompt = _prompt(input_text, len(sources), prompting, avoid_retokenize)
    if isinstance(prompt, Delegated):
        return prompt
    return Served(prompt, sources)


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
    payload = item[item.find(",") + 1 :] if item.startswith("data:") else item
    if not payload or payload[0] in _WHITESPACE or payload[-1] in _WHITESPACE:
        return Delegated("base64 with surrounding whitespace")  # SGLang rejects it; mmworker would trim
    return item


def _prompt(text: Any, n_images: int, p: Prompting, avoid_retokenize: bool) -> list[int] | Delegated:
    ids_given = None
    if isinstance(text, list):
        if not text or not all(type(t) is int for t in text):
            return Delegated("prompt ids that are not a list of ints")
        ids_given, text = text, p.tokenizer.decode(text)
    if not isinstance(text, str):
        return Delegated("no prompt text")
    if text.count(p.image_token) != n_images or text.count(p.image_pad) != n_images:
        return Delegated("image placeholders other than one <|vision_start|><|image_pad|><|vision_end|> per image")
    if any(other and other in text for other in p.other_placeholders):
        return Delegated("video, audio or <image> placeholders in the prompt")
    if ids_given is not None and (p.artifact_path or avoid_retokenize):
        ids = list(ids_given)
    elif p.artifact_path or not (p.bos_guard and text.startswith(p.bos_guard)):
        ids = p.encode(text, True)
    else:  # the HF processor's call, with SGLang's guard against a second BOS
        ids = p.encode(text, False)
    if ids.count(p.image_token_id) != n_images:
        return Delegated("image placeholder ids that do not match the images")
    return ids
