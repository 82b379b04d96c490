"""The MmError family (every failure mmworker reports to a caller), `Outcome` and `UsageError` (API misuse)."""

import enum
import re


def item_name(index: int, n_images: int) -> str:
    """How messages name item `index` of a request whose first `n_images` items are images and the
    rest videos: "image k" or "video k", k counted within its kind."""
    return f"image {index}" if index < n_images else f"video {index - n_images}"


class Outcome(enum.Enum):
    """What became of a request: the kind of its one reply (`Reply.kind`), beside the reply's message.

    The values are plain strings: they travel as such between the pool's processes (ipc.wire's
    `Failed.kind`) and can be logged or mapped to status codes without importing this module.
    """

    ACCEPTED = "accepted"
    # The request's own content: a corrupt image, a failed fetch, a request over a budget (bytes,
    # items, CPU), a malformed prompt. Retrying it unchanged fails the same way.
    BAD_INPUT = "bad_input"
    # Valid input that mmworker deliberately does not reproduce (image formats it refuses by name,
    # samples deeper than 8 bits, images above its pixel or side limits, results larger than a
    # worker's ring): another implementation may take it.
    UNSUPPORTED = "unsupported"
    QUEUE_FULL = "queue_full"  # queue_depth requests were in flight; the pool took nothing
    # A worker's ring stayed full for memory_wait_s: the caller holds too many replies too long.
    MEMORY_FULL = "memory_full"
    WORKER_CRASHED = "worker_crashed"  # the process handling it (a worker, the I/O process) died
    DEADLINE_EXCEEDED = "deadline_exceeded"  # its worker overran deadline_s and was replaced
    ABORTED = "aborted"  # cancelled by the caller
    POOL_CLOSED = "pool_closed"  # the pool was closed before it was answered
    INTERNAL = "internal"  # a bug or an environment failure on mmworker's side


class MmError(ValueError):
    """A request, source or argument was rejected; the message names the input and the cause.

    A ValueError so that callers written against SGLang's Rust extension (whose errors all
    surface as ValueError) keep working unchanged.

    `kind` says which Outcome the rejection is: the one given (`MmError(text, kind=...)`), else
    that of the MmError it was raised from (`raise MmError(f"image 0: {exc}") from exc` keeps an
    UnsupportedInput's kind through the layers that prefix its message), else BAD_INPUT.
    """

    def __init__(self, *args: object, kind: Outcome | None = None) -> None:
        super().__init__(*args)
        self._kind = kind

    @property
    def kind(self) -> Outcome:
        if self._kind is not None:
            return self._kind
        cause = self.__cause__
        return cause.kind if isinstance(cause, MmError) else Outcome.BAD_INPUT


class UnsupportedInput(MmError):
    """Valid input mmworker refuses on purpose (Outcome.UNSUPPORTED): a format it does not decode,
    samples deeper than 8 bits, an image above its pixel or side limits."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args, kind=Outcome.UNSUPPORTED)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def image_decode_error(exc: BaseException) -> MmError:
    """The MmError for an image decoder's exception: its text, without heap addresses.

    Pillow sometimes puts object reprs (heap addresses) in messages; those are never passed on.
    """
    text = _ADDRESS.sub("", str(exc)) or type(exc).__name__
    return MmError(f"image decode: {text}")


class UsageError(RuntimeError):
    """The calling code used the API wrongly: a call the object's state does not allow (submit after
    `close()`, a request id still in flight) or an argument of the wrong type that is not a
    request's content (an unhashable request id, `mm_hashes` that is not a list of strings).

    Raised at the call, and nothing is owed for it: no reply, no request. Not an MmError: an
    MmError (a ValueError) says a request's content was bad and becomes that request's rejection,
    which a server answers as the client's fault (SGLang: 400). A UsageError is a bug in the code
    calling mmworker, so it is a RuntimeError, which no `except ValueError` takes for bad input and
    a server answers as its own failure (500).
    """


class BudgetExceeded(BaseException):
    """A pool worker's CPU budget for a request ran out (mmworker.pool.cpu_budget).

    It is raised from a signal handler, so it can strike between any two bytecodes. It is not an
    MmError (a ValueError) on purpose: an `except ValueError` or `except Exception` on the way,
    Pillow's or ours, would relabel it as that code's own failure ("image decode: ...") or swallow
    it. Like KeyboardInterrupt it passes them by; the driver names the image it struck, and the
    worker turns it into the request's rejection.
    """
