"""SGLang's real TokenizerManager with mmworker.sglang plugged in, and what its scheduler receives.

    .venv-sglang/bin/python tests/sglang_env/tokenizer_manager_check.py OUT.json [--builtin]

Run by test_tokenizer_manager.py in a process of its own (a TokenizerManager binds sockets and
installs process-wide state). It writes a tiny Qwen2.5-VL model directory (config and processor, no
weights), sets SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE=mmworker.sglang (unless --builtin) before the
TokenizerManager exists, and stands in for the scheduler with a PULL socket connected to the
TokenizerManager's scheduler endpoint. Each request goes through the TokenizerManager's own
tokenize-and-send steps; what arrives is unpacked as the scheduler unpacks it
(`unwrap_pickle_fields`, `unwrap_shm_features`, `MultimodalInputs.from_processor_output`) and
compared with SGLang's built-in processor run directly on the same inputs. Writes a JSON report.
"""

import asyncio
import json
import os
import sys
import tempfile
import time

import plugin_env as env

BUILTIN = "--builtin" in sys.argv
if not BUILTIN:
    os.environ["SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE"] = "mmworker.sglang"

import torch  # noqa: E402
import zmq  # noqa: E402
from sglang.srt.managers import mm_utils  # noqa: E402
from sglang.srt.managers.io_struct import GenerateReqInput, TokenizedGenerateReqInput, sock_recv  # noqa: E402
from sglang.srt.managers.schedule_batch import MultimodalInputs  # noqa: E402
from sglang.srt.runtime_context import publish, reset_context  # noqa: E402
from sglang.srt.server_args import PortArgs, ServerArgs  # noqa: E402
from sglang.srt.utils.network import get_zmq_socket  # noqa: E402
from transformers import Qwen2_5_VLConfig  # noqa: E402


def model_dir() -> str:
    path = tempfile.mkdtemp(prefix="mmworker-tm-")
    ids = env.TOKEN_IDS
    config = Qwen2_5_VLConfig(
        vision_start_token_id=ids["<|vision_start|>"], image_token_id=ids["<|image_pad|>"],
        vision_end_token_id=ids["<|vision_end|>"], video_token_id=ids["<|video_pad|>"],
        bos_token_id=None, eos_token_id=0, vocab_size=512,
        text_config={"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "intermediate_size": 64, "eos_token_id": 0, "bos_token_id": None},
        vision_config={"depth": 1, "hidden_size": 32, "out_hidden_size": 64, "num_heads": 2, "intermediate_size": 64},
    )  # fmt: skip
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    config.save_pretrained(path)
    env.hf_processor("qwen2_5_vl", "torchvision").save_pretrained(path)
    return path


async def shm_held_once_released(pool, timeout: float) -> int | None:
    """The pool's shared memory held by replies, once that is 0 or `timeout` has passed (None
    without a pool: SGLang's built-in processor). The loop keeps running meanwhile."""
    if pool is None:
        return None
    deadline = time.monotonic() + timeout
    while (held := pool.stats().shm_held_bytes) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return held


async def main(out_path: str) -> None:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    path = model_dir()
    server_args = ServerArgs(model_path=path, device="cpu", mm_processor_worker_num=2)
    reset_context()
    publish(server_args, role="tokenizer")
    port_args = PortArgs.init_new(server_args)
    tm = TokenizerManager(server_args, port_args)
    processor = tm.mm_processor
    report = {"processor": type(processor).__module__ + "." + type(processor).__name__, "cases": []}
    scheduler = get_zmq_socket(zmq.Context(1), zmq.PULL, port_args.scheduler_input_ipc_name, False)
    builtin = env.builtin_class("qwen2_5_vl")(tm.model_config.hf_config, server_args, tm.processor, "default")

    requests = [
        [env.encoded(640, 480, "JPEG", 1)],
        [env.encoded(300, 301, "PNG", 2), env.encoded(1024, 768, "JPEG", 3)],
        [env.encoded(97, 211, "RGBA-PNG", 4), env.encoded(120, 90, "GIF", 5), env.encoded(500, 375, "WEBP", 6)],
    ]
    for k, images in enumerate(requests):
        text = env.prompt(len(images))
        obj = GenerateReqInput(text=text, image_data=images, sampling_params={"max_new_tokens": 1}, rid=f"req-{k}")
        obj.normalize_batch_and_arguments()
        tm._init_req_state(obj, None)
        tokenized = await tm._tokenize_one_request(obj)
        await tm._send_one_request(tokenized)
        del tokenized
        # The loop runs on as SGLang's does (no collection forced, no poll by hand): the drop of the
        # last tensor posts the release, and the pool's reader on the loop applies it. Wait for
        # that up to a deadline; what is still held then is recorded (the test expects none).
        held = await shm_held_once_released(getattr(processor, "_pool", None), 10.0)
        received = await asyncio.wait_for(asyncio.to_thread(sock_recv, scheduler), 60)
        assert isinstance(received, TokenizedGenerateReqInput), type(received)
        received.unwrap_pickle_fields()
        mm_utils.unwrap_shm_features(received)
        inputs = MultimodalInputs.from_processor_output(received.mm_inputs)
        expected = await builtin.process_mm_data_async(
            image_data=images, input_text=text, request_obj=env.Request(rid=f"req-{k}")
        )
        features_equal = [
            bool(torch.equal(a.feature, b.feature)) for a, b in zip(inputs.mm_items, expected.mm_items, strict=True)
        ]
        report["cases"].append({
            "images": len(images),
            "ids_equal": list(received.input_ids) == list(expected.input_ids),
            "features_equal": features_equal,
            "offsets_equal": [a.offsets == b.offsets for a, b in zip(inputs.mm_items, expected.mm_items, strict=True)],
            "mrope_equal": bool(torch.equal(inputs.mrope_positions, expected.mrope_positions)),
            "pad_values_from_hash": all(item.pad_values is not None and item.hash is not None for item in inputs.mm_items),
            "shm_held_after_dispatch": held,
        })  # fmt: skip
    report["stats"] = (
        {k: v for k, v in processor.stats().items() if k != "pool"} if hasattr(processor, "stats") else None
    )
    with open(out_path, "w") as f:
        json.dump(report, f)
    processor.shutdown()
    builtin.shutdown()
    os._exit(0)  # the TokenizerManager's background threads are not ours to join


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
