"""Streaming (non-temporal) writes of float32 outputs that this core will not read back, and their staging.

A feature tensor is written once, in order, and then read by another process. Ordinary stores
first read every destination cache line in (read-for-ownership) and evict whatever was cached;
for an output far larger than L2 (one ~1 MP image's pixel_values is 22.5 MB) that doubles the
memory traffic. Non-temporal stores write the lines without reading them, as fast as ordinary
stores into a buffer already in cache, which a ring slot or a fresh allocation never is.

A kernel builds its output in order in a small staging array that stays in L1 and hands each
filled chunk to `stream_out`, which stores 64-byte aligned runs non-temporally and the unaligned
edges normally. `stream_fence` must follow the last store: non-temporal stores are weakly
ordered, and the consumer is told the output is ready right after. `copy_line` moves 16 floats
into the stage as one vector load and store: LLVM cannot prove that two numba arrays do not
overlap, so it leaves short copies between them scalar.

An output made of equal runs of `n` floats gathered from elsewhere (a patch row each, in
pixel_values) needs no stage when `runs_to_lines(n)` has an intrinsic for it: it loads the runs
of a group of lcm(n, 16) floats into vectors, shuffles them into whole lines and stores those
non-temporally, so every float is loaded and stored once instead of twice.
"""

import math

from llvmlite import ir
from numba import njit, types, uint64
from numba.core import cgutils
from numba.extending import intrinsic

# Floats per non-temporal store: one 64-byte cache line.
LINE_FLOATS = 16
LINE_BYTES = 4 * LINE_FLOATS


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


def runs_to_lines(n: int):
    """(intrinsic, floats per group) streaming runs of `n` floats as whole lines; None unless every
    line is a shuffle of at most two runs (n = 8, 12, 14, 15, 16).

    `lines(dst, dst_index, src, src_index, runs, groups)` writes `groups` groups of
    lcm(n, 16) floats to dst from dst_index on, which must be 64-byte aligned: run k (k < groups *
    lcm(n, 16) / n) is src[src_index + runs[k] :][:n]. Each run is loaded as 16 floats, so src
    must have 16 - n readable floats after every run. Lines are stored non-temporally:
    `stream_fence` must follow.
    """
    if not 0 < n <= LINE_FLOATS:
        return None
    per_group = LINE_FLOATS // math.gcd(n, LINE_FLOATS)  # runs
    lines = []  # per line of a group: the run its first float is in, and the shuffle of that run and the next
    for line in range(n * per_group // LINE_FLOATS):
        first_run = LINE_FLOATS * line // n
        order = []
        for lane in range(LINE_FLOATS):
            run, offset = divmod(LINE_FLOATS * line + lane, n)
            order.append(offset + LINE_FLOATS * (run - first_run))
        if max(order) >= 2 * LINE_FLOATS:
            return None
        lines.append((first_run, order))

    def runs_as_lines(typingctx, dst, dst_index, src, src_index, runs, groups):
        sig = types.void(dst, dst_index, src, src_index, runs, groups)

        def codegen(context, builder, signature, args):
            dst_type, _, src_type, _, runs_type, _ = signature.args
            dst_value, dst_at, src_value, src_at, runs_value, groups_value = args
            i32, i64 = ir.IntType(32), ir.IntType(64)
            runs_data = context.make_array(runs_type)(context, builder, runs_value).data
            nontemporal = builder.module.add_metadata([ir.Constant(i32, 1)])
            with cgutils.for_range(builder, groups_value) as group:
                first = builder.mul(group.index, ir.Constant(i64, per_group))
                loaded = []
                for k in range(per_group):
                    offset = builder.load(builder.gep(runs_data, [builder.add(first, ir.Constant(i64, k))]))
                    at = builder.add(src_at, builder.sext(offset, i64) if offset.type.width < 64 else offset)
                    loaded.append(builder.load(_line_pointer(context, builder, src_type, src_value, at), align=4))
                base = builder.add(dst_at, builder.mul(group.index, ir.Constant(i64, len(lines) * LINE_FLOATS)))
                for i, (run, order) in enumerate(lines):
                    second = loaded[run + 1] if run + 1 < per_group else loaded[run]
                    shuffle = ir.Constant(ir.VectorType(i32, LINE_FLOATS), order)
                    value = builder.shuffle_vector(loaded[run], second, shuffle)
                    at = builder.add(base, ir.Constant(i64, i * LINE_FLOATS))
                    store = builder.store(value, _line_pointer(context, builder, dst_type, dst_value, at), align=64)
                    store.set_metadata("nontemporal", nontemporal)
            return context.get_dummy_value()

        return sig, codegen

    runs_as_lines.__name__ = runs_as_lines.__qualname__ = f"runs_of_{n}_as_lines"
    return intrinsic(runs_as_lines), n * per_group
