"""Inter-process transport: shared-memory rings, the wire format and ZeroMQ channels (knows nothing of images).

| module | owns |
|---|---|
| `segment` | POSIX shared-memory segments: create (0600, fallocate), attach or map an inherited fd, unlink, sweep |
| `ring` | `RingWriter` (a writer's allocator over its own segment), `RingReader` (checked zero-copy views) |
| `wire` | versioned msgspec messages and their checked decoding; never pickle |
| `channels` | private ipc:// endpoints, the load-balancing client `Router`, worker `Dealer`s |
| `results` | workers' answers to their client on one shared SOCK_SEQPACKET pair, past libzmq's threads |
| `lifeline` | children that die with their parent |
| `errors` | the `IpcError` family |

Never imports mmworker.
"""
