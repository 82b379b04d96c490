"""The MmError family: every failure mmworker reports to a caller."""

import re


class MmError(ValueError):
    """A request, source or argument was rejected; the message names the input and the cause.

    A ValueError so that callers written against SGLang's Rust extension (whose errors all
    surface as ValueError) keep working unchanged.
    """


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def image_decode_error(exc: BaseException) -> MmError:
    """The MmError for an image decoder's exception: its text, without heap addresses.

    Pillow sometimes puts object reprs (heap addresses) in messages; those are never passed on.
    """
    text = _ADDRESS.sub("", str(exc)) or type(exc).__name__
    return MmError(f"image decode: {text}")


class BudgetExceeded(BaseException):
    """A pool worker's CPU budget for a request ran out (mmworker.pool.cpu_budget).

    It is raised from a signal handler, so it can strike between any two bytecodes. It is not an
    MmError (a ValueError) on purpose: an `except ValueError` or `except Exception` on the way,
    Pillow's or ours, would relabel it as that code's own failure ("image decode: ...") or swallow
    it. Like KeyboardInterrupt it passes them by; the driver names the image it struck, and the
    worker turns it into the request's rejection.
    """
