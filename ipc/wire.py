"""The wire format: versioned msgspec messages, never pickle, validated into plain values on receipt.

A message on a ZeroMQ socket is a multipart message:

    [header: msgpack of one message struct below] [payload frame 0] [payload frame 1] ...

(On the socket pairs a message is one record, without payload frames: in a worker's inbox,
ipc.inbox, the header, and with a Job optionally one descriptor of the memory holding its inputs;
on the results channel, ipc.results, the sender's identity, then the header.)

Only the header is decoded; payload frames (raw image bytes, for instance) are passed on as they
are, zero-copy, and never interpreted by the transport. Decoding checks the version, the header's
size, the schema (msgspec: exact types, no unknown tags, no arbitrary objects) and the number of
payload frames the header announces. Tensor descriptors are checked again, against the ring's
bounds, by `ipc.ring.RingReader.view` before any view exists.

Message flow (C = client, W = worker):
    W -> C  Hello      after start-up: which ring it writes, its pid, whether it can read C's memory
    C -> W  Job        one unit of work + `frames` payload frames, or its `inputs` in C's request ring
                       (or in the descriptor that came with it, or in C's own memory for W to read in
                       place) (+ releases, piggybacked: see Release)
    W -> C  Done       result tensors (descriptors into W's ring), small metadata, optional frames
    W -> C  Failed     the job's one-line reason and its kind (a plain string the application defines)
    C -> W  Release    allocations the client no longer uses (W may reuse their space); a client may
                       instead hand them over in the `released` field of W's next Job (one message
                       fewer) when W needs no space before that job

There is no message that stops a worker: its client ends it with SIGTERM or by closing its inbox,
and a worker whose client dies dies with it (ipc.lifeline). docs/wire.md describes the protocol.
"""

import msgspec

from ipc.errors import WireError

WIRE_VERSION = 1
MAX_HEADER_BYTES = 1 << 20  # headers are small; anything bigger is hostile or a bug
MAX_FRAMES = 1024
FAILED_KIND_DEFAULT = "bad_input"  # what a Failed without a kind means: the request's own content

# Plain values an application may put in `args` / `meta`: no objects, no nesting beyond lists.
Scalar = int | float | str | bool | None
Value = Scalar | list[Scalar | list[int]]


class TensorDesc(msgspec.Struct, frozen=True, array_like=True):
    """Where a tensor lives: ring id, byte offset, allocation sequence number, size, dtype, shape."""

    ring: int
    offset: int
    seq: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


class Hello(msgspec.Struct, frozen=True, tag="hello"):
    version: int
    worker: int
    pid: int
    ring: int
    ring_name: str
    ring_size: int
    ready_ms: float = 0.0  # time from process start to this message
    # It can read its client's memory (ipc.peer_memory), so Jobs may name their inputs there.
    reads_in_place: bool = False


class Job(msgspec.Struct, frozen=True, tag="job"):
    rid: int
    frames: int
    deadline_ms: int
    args: dict[str, Value] = {}
    released: list[tuple[int, int]] = []  # (offset, seq) of the receiver's ring, applied before the job
    # The job's inputs as (offset, nbytes) in the sender's request ring (or in the descriptor sent
    # with the Job), instead of payload frames (then frames == 0); the sender keeps them unchanged
    # until the job's answer arrives.
    inputs: list[tuple[int, int]] = []
    # The inputs are (address, nbytes) in the sender's own memory instead, for the receiver to read
    # in place (ipc.peer_memory); no descriptor comes with such a Job.
    inputs_in_sender: bool = False


class Done(msgspec.Struct, frozen=True, tag="done"):
    rid: int
    tensors: dict[str, TensorDesc]
    meta: dict[str, Value] = {}
    busy_ms: float = 0.0
    frames: int = 0
    # The worker's CLOCK_MONOTONIC (s) when the job began: one clock for every process on the host,
    # so the receiver can split the time around the job into "to the worker" and "back".
    started: float = 0.0


class Failed(msgspec.Struct, frozen=True, tag="failed"):
    rid: int
    error: str
    busy_ms: float = 0.0
    # Which kind of failure, as the application names its kinds (mmworker: an Outcome's value). A
    # plain string with a default, so that a Failed from a sender that does not set it still decodes.
    kind: str = FAILED_KIND_DEFAULT


class Release(msgspec.Struct, frozen=True, tag="release"):
    ring: int
    allocations: list[tuple[int, int]]  # (offset, seq)


Message = Hello | Job | Done | Failed | Release


class _Envelope(msgspec.Struct, frozen=True, array_like=True):
    version: int
    body: Message


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Envelope)


def encode(message: Message) -> bytes:
    """The header frame for `message`."""
    return _encoder.encode(_Envelope(WIRE_VERSION, message))


def decode(frames: list) -> tuple[Message, list]:
    """(message, payload frames) from a received multipart message; WireError if anything is off.

    `frames` may hold bytes, memoryviews or zmq.Frame objects; the payload frames are returned as
    given (no copy).
    """
    if not frames:
        raise WireError("empty message")
    header = frames[0]
    raw = header.buffer if hasattr(header, "buffer") else header
    if len(raw) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        envelope = _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(f"malformed header: {exc}") from exc
    if envelope.version != WIRE_VERSION:
        raise WireError(f"wire version {envelope.version}, expected {WIRE_VERSION}")
    message = envelope.body
    payload = frames[1:]
    expected = message.frames if isinstance(message, (Job, Done)) else 0
    if len(payload) != expected or expected > MAX_FRAMES:
        raise WireError(f"{type(message).__name__} announces {expected} payload frame(s), got {len(payload)}")
    if isinstance(message, Job) and message.inputs and (message.frames or len(message.inputs) > MAX_FRAMES):
        raise WireError(f"Job has {len(message.inputs)} input place(s) and {message.frames} payload frame(s)")
    return message, payload
