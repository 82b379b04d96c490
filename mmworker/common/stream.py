"""Streaming (non-temporal) writes of float32 outputs that this core will not read back, and their staging.

A feature tensor is written once, in order, and then read by another process. Ordinary stores
first read every destination cache line in (read-for-ownership) and evict whatever was cached;
for an output far larger than L2 that doubles the memory traffic: filling 22.5 MB (one ~1 MP
image's pixel_values) not in cache took 3.1 ms here against 1.1 ms with non-temporal stores (and
1.1 ms with ordinary stores into a buffer already in cache, which a ring slot or a fresh
allocation never is).

A kernel builds its output in order in a small staging array that stays in L1 and hands each
filled chunk to `stream_out`, which stores 64-byte aligned runs non-temporally and the unaligned
edges normally. `stream_fence` must follow the last store: non-temporal stores are weakly
ordered, and the consumer is told the output is ready right after. `copy_line` moves 16 floats
into the stage as one vector load and store: LLVM cannot prove that two numba arrays do not
overlap, so it leaves short copies between them scalar (at 1288x728 the stage copies of
pixel_values took 0.55-0.8 ms that way, 0.33 ms with this).
"""

from llvmlite import ir
from numba import njit, types, uint64
from numba.extending import intrinsic

# Floats per non-temporal store: one 64-byte cache line.
LINE_FLOATS = 16


def _line_pointer(context, builder, array_type, array, index):
    """A <16 x float> pointer to array[index]."""
    line = ir.VectorType(ir.FloatType(), LINE_FLOATS).as_pointer()
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), line)


@intrinsic
def _store_line(typingctx, dst, dst_index, src, src_index):
    """dst[dst_index : dst_index + 16] = src[src_index : ...] with one non-temporal store.

    dst's element at dst_index must be 64-byte aligned; src may be unaligned.
    """
    sig = types.void(dst, dst_index, src, src_index)

    def codegen(context, builder, signature, args):
        dst_type, _, src_type, _ = signature.args
        dst_value, dst_at, src_value, src_at = args
        value = builder.load(_line_pointer(context, builder, src_type, src_value, src_at), align=4)
        store = builder.store(value, _line_pointer(context, builder, dst_type, dst_value, dst_at), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy_line(typingctx, dst, dst_index, src, src_index):
    """dst[dst_index : dst_index + 16] = src[src_index : ...] with one vector load and store (any alignment).

    Both ranges must lie inside their arrays; callers pad them for the runs they overshoot.
    """
    sig = types.void(dst, dst_index, src, src_index)

    def codegen(context, builder, signature, args):
        dst_type, _, src_type, _ = signature.args
        dst_value, dst_at, src_value, src_at = args
        value = builder.load(_line_pointer(context, builder, src_type, src_value, src_at), align=4)
        builder.store(value, _line_pointer(context, builder, dst_type, dst_value, dst_at), align=4)
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
