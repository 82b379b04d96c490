"""Inter-process transport: shared-memory rings, wire format, ZeroMQ channels, socket pairs (knows nothing of images).

| module | owns |
|---|---|
| `segment` | POSIX shared-memory segments: create (0600, fallocate), attach or map an inherited fd, unlink, sweep |
| `ring` | `RingWriter` (a writer's allocator over its own segment), `RingReader` (checked zero-copy views) |
| `heap` | `HeapWriter`: a writer's any-order, best-fit allocator over its own segment (read with `RingReader`) |
| `wire` | versioned msgspec messages and their checked decoding; never pickle |
| `channels` | ZeroMQ on private ipc:// endpoints: the client's `Router`, its peers' `Dealer`s (the I/O process) |
| `records` | wire messages as SOCK_SEQPACKET records: size limit, adopting an inherited end, receiving |
| `inbox` | a worker's inbox: what its client sends it, on a SOCK_SEQPACKET pair of its own (with a descriptor) |
| `results` | workers' answers to their client on one shared SOCK_SEQPACKET pair, past libzmq's threads |
| `peer_memory` | reading another process's buffers in place (process_vm_readv); whether the kernel allows it |
| `lifeline` | children that die with their parent |
| `errors` | the `IpcError` family |

Never imports mmworker.
"""
