"""Streaming (non-temporal) writes of float32 outputs that this core will not read back.

A feature tensor is written once, in order, and then read by another process. Ordinary stores
first read every destination cache line in (read-for-ownership) and evict whatever was cached;
for an output far larger than L2 that doubles the memory traffic: filling 22.5 MB (one ~1 MP
image's pixel_values) not in cache took 3.1 ms here against 1.1 ms with non-temporal stores (and
1.1 ms with ordinary stores into a buffer already in cache, which a ring slot or a fresh
allocation never is).

A kernel builds its output in order in a small staging array that stays in L1 and hands each
filled chunk to `stream_out`, which stores 64-byte aligned runs non-temporally and the unaligned
edges normally. `stream_fence` must follow the last store: non-temporal stores are weakly
ordered, and the consumer is told the output is ready right after.
"""

from llvmlite import ir
from numba import njit, types, uint64
from numba.extending import intrinsic

# Floats per non-temporal store: one 64-byte cache line.
LINE_FLOATS = 16


@intrinsic
def _store_line(typingctx, dst, dst_index, src, src_index):
    """dst[dst_index : dst_index + 16] = src[src_index : ...] with one non-temporal store.

    dst's element at dst_index must be 64-byte aligned; src may be unaligned.
    """
    sig = types.void(dst, dst_index, src, src_index)

    def codegen(context, builder, signature, args):
        dst_type, _, src_type, _ = signature.args
        dst_value, dst_at, src_value, src_at = args
        line = ir.VectorType(ir.FloatType(), LINE_FLOATS).as_pointer()
        dst_data = context.make_array(dst_type)(context, builder, dst_value).data
        src_data = context.make_array(src_type)(context, builder, src_value).data
        value = builder.load(builder.bitcast(builder.gep(src_data, [src_at]), line), align=4)
        store = builder.store(value, builder.bitcast(builder.gep(dst_data, [dst_at]), line), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def stream_fence(typingctx):
    """Order every earlier store (non-temporal ones included) before any later one: an mfence on x86."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def stream_out(flat, at, stage, n, address):
    """Write stage[:n] to flat[at : at + n]; `address` is flat's data address (flat.ctypes.data).

    The run is split into a head up to the next 64-byte boundary, whole lines stored
    non-temporally, and a tail; head and tail use ordinary stores. An address that is not even
    float-aligned never reaches a boundary, so everything then takes ordinary stores.
    """
    at, n, address = uint64(at), uint64(n), uint64(address)
    head = n
    if address % uint64(4) == 0:
        head = min(n, ((uint64(64) - (address + at * uint64(4)) % uint64(64)) % uint64(64)) // uint64(4))
    for k in range(head):
        flat[at + k] = stage[k]
    k = head
    while k + uint64(LINE_FLOATS) <= n:
        _store_line(flat, at + k, stage, k)
        k += uint64(LINE_FLOATS)
    while k < n:
        flat[at + k] = stage[k]
        k += uint64(1)
