"""mmworker inside SGLang: a multimodal processor package SGLang 0.5.23 loads by name.

    SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE=mmworker.sglang python -m sglang.launch_server ...

SGLang's TokenizerManager imports every submodule of the package it is pointed at and registers
each `BaseMultimodalProcessor` subclass it finds there for the architectures in its `models`
(classes defined in this `__init__` would not be seen). The submodules:

- `plan`: what the plug-in serves for this model and server, decided once from the HF image
  processor and SGLang's arguments, and why it declines the rest;
- `requests`: one request, served (prompt ids and mmworker sources) or handed to SGLang's own
  path, with the reason;
- `qwen_vl`: the processor SGLang instantiates: its worker pool, the hand-off as SGLang's
  `MultimodalProcessorOutput`, errors, counters.

This is the only part of mmworker that imports sglang; nothing else in mmworker imports this.
"""
