"""The ipc failure taxonomy: every error the transport raises, each with one meaning."""


class IpcError(Exception):
    """Base of everything ipc raises."""


class SharedMemoryError(IpcError):
    """A segment could not be created or attached (e.g. /dev/shm too small): a start-up failure."""


class RingFull(IpcError):
    """The ring had no room for an allocation before the deadline; nothing was overwritten."""


class AllocationTooLarge(IpcError):
    """An allocation can never fit: it is larger than the whole ring."""


class WireError(IpcError):
    """A frame did not decode to a valid message of the expected schema (malformed or hostile)."""


class ChannelClosed(IpcError):
    """The other side is gone or the channel was closed; no further messages will arrive."""
