"""The MmError family: every failure mmworker reports to a caller."""


class MmError(ValueError):
    """A request, source or argument was rejected; the message names the input and the cause.

    A ValueError so that callers written against SGLang's Rust extension (whose errors all
    surface as ValueError) keep working unchanged.
    """
