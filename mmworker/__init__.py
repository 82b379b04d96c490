"""mmworker: Qwen-VL image preprocessing for SGLang, bit-exact with Hugging Face."""

from mmworker.errors import MmError

__all__ = ["MmError"]
