"""Streaming (non-temporal) writes of float32 or bfloat16 outputs that this core will not read back, and their staging.

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

A bfloat16 output is uint16 storage holding bf16 bits (numpy has no bfloat16). The same functions
write one when handed a uint16 destination: the values are still computed and staged as float32,
and each is narrowed on its way out, round to nearest, ties to even, exactly as torch's
`.to(torch.bfloat16)` (`bf16_bits`), so a bf16 output is the float32 one rounded, bit for bit. A line
then holds 32 values, narrowed from two float vectors. The rounding is the integer one (add
0x7FFF plus the lowest kept bit, keep the high half), which is exact for every finite float; it is
not NaN-aware (a NaN could round to infinity), and the callers' values are finite by construction.
"""

import math

from llvmlite import ir
from numba import njit, types, uint64
from numba.core import cgutils
from numba.extending import intrinsic

# Floats per non-temporal store: one 64-byte cache line (or twice as many bf16 values).
LINE_FLOATS = 16
LINE_BYTES = 4 * LINE_FLOATS
LINE_BF16 = 2 * LINE_FLOATS


def _line_pointer(context, builder, array_type, array, index, lanes=LINE_FLOATS, element=None):
    """A <lanes x element> pointer (default <16 x float>) to array[index]."""
    line = ir.VectorType(element or ir.FloatType(), lanes).as_pointer()
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), line)


def _is_bf16(array_type) -> bool:
    """Whether a destination array holds bf16 bits (uint16); otherwise it must hold float32."""
    if array_type.dtype == types.uint16:
        return True
    if array_type.dtype != types.float32:
        raise TypeError(f"stream: destinations are float32 or uint16 (bf16 bits), not {array_type.dtype}")
    return False


def _bf16(builder, value):
    """float or <k x float> -> i16 or <k x i16>: bf16 bits, round to nearest, ties to even (finite values:
    module docstring)."""
    if isinstance(value.type, ir.VectorType):
        lanes = value.type.count
        i32, i16 = ir.VectorType(ir.IntType(32), lanes), ir.VectorType(ir.IntType(16), lanes)

        def const(v):
            return ir.Constant(i32, [v] * lanes)
    else:
        i32, i16 = ir.IntType(32), ir.IntType(16)

        def const(v):
            return ir.Constant(i32, v)

    bits = builder.bitcast(value, i32)
    lowest_kept = builder.and_(builder.lshr(bits, const(16)), const(1))
    rounded = builder.add(bits, builder.add(lowest_kept, const(0x7FFF)))
    return builder.trunc(builder.lshr(rounded, const(16)), i16)


def _store_nontemporal(builder, value, pointer):
    store = builder.store(value, pointer, align=64)
    store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


def _store_bf16_pair(context, builder, dst_type, dst, at, first, second):
    """Two <16 x float> narrowed to bf16 and stored as one line at dst[at] (64-byte aligned), non-temporally."""
    both = builder.shuffle_vector(_bf16(builder, first), _bf16(builder, second), ir.Constant(
        ir.VectorType(ir.IntType(32), LINE_BF16), list(range(LINE_BF16))))  # fmt: skip
    _store_nontemporal(builder, both, _line_pointer(context, builder, dst_type, dst, at, LINE_BF16, ir.IntType(16)))


@intrinsic
def _store_line(typingctx, dst, dst_index, src, src_index):
    """dst[dst_index : ...] = one line from src[src_index : ...] with one non-temporal store.

    float32 dst: 16 floats; uint16 dst: 32 floats narrowed to bf16. dst's element at dst_index must
    be 64-byte aligned; src (float32) may be unaligned.
    """
    sig = types.void(dst, dst_index, src, src_index)
    bf16 = _is_bf16(dst)

    def codegen(context, builder, signature, args):
        dst_type, _, src_type, _ = signature.args
        dst_value, dst_at, src_value, src_at = args
        value = builder.load(_line_pointer(context, builder, src_type, src_value, src_at), align=4)
        if bf16:
            after = builder.add(src_at, ir.Constant(src_at.type, LINE_FLOATS))
            second = builder.load(_line_pointer(context, builder, src_type, src_value, after), align=4)
            _store_bf16_pair(context, builder, dst_type, dst_value, dst_at, value, second)
        else:
            _store_nontemporal(builder, value, _line_pointer(context, builder, dst_type, dst_value, dst_at))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _store_one(typingctx, dst, dst_index, value):
    """dst[dst_index] = value (a float32) with an ordinary store, narrowed to bf16 bits for a uint16 dst."""
    sig = types.void(dst, dst_index, types.float32)
    bf16 = _is_bf16(dst)

    def codegen(context, builder, signature, args):
        dst_value, dst_at, x = args
        data = context.make_array(signature.args[0])(context, builder, dst_value).data
        # align 1: a view need not be aligned to its element (numpy allows it; nothing may be lost).
        builder.store(_bf16(builder, x) if bf16 else x, builder.gep(data, [dst_at]), align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _lanes(typingctx, dst):
    """Values per 64-byte line of dst: 16 (float32) or 32 (uint16, bf16 bits)."""
    lanes = LINE_BF16 if _is_bf16(dst) else LINE_FLOATS

    def codegen(context, builder, signature, args):
        return ir.Constant(ir.IntType(64), lanes)

    return types.uint64(dst), codegen


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
    """Write stage[:n] (float32) to flat[at : at + n]; `address` is flat's data address (flat.ctypes.data).

    flat is float32, or uint16 to receive the values as bf16 bits (module docstring). The run is
    split into a head up to the next 64-byte boundary, whole lines stored non-temporally, and a
    tail; head and tail use ordinary stores. An address that is not even element-aligned never
    reaches a boundary, so everything then takes ordinary stores.
    """
    at, n, address = uint64(at), uint64(n), uint64(address)
    lanes = _lanes(flat)
    size = uint64(LINE_BYTES) // lanes  # bytes per element
    head = n
    if address % size == 0:
        head = min(n, ((uint64(64) - (address + at * size) % uint64(64)) % uint64(64)) // size)
    for k in range(head):
        _store_one(flat, at + k, stage[k])
    k = head
    while k + lanes <= n:
        _store_line(flat, at + k, stage, k)
        k += lanes
    while k < n:
        _store_one(flat, at + k, stage[k])
        k += uint64(1)


def runs_to_lines(n: int):
    """(intrinsic, values per group) streaming runs of `n` floats as whole lines; None unless every
    float line is a shuffle of at most two runs (n = 8, 12, 14, 15, 16).

    `lines(dst, dst_index, src, src_index, runs, groups)` writes `groups` groups of lcm(n, 32)
    values (whole lines of either dtype) to dst from dst_index on, which must be 64-byte aligned:
    run k (k < groups * lcm(n, 32) / n) is src[src_index + runs[k] :][:n]. Each run is loaded as 16
    floats, so src must have 16 - n readable floats after every run. dst is float32, or uint16 to
    receive bf16 bits (module docstring): each pair of float lines is then narrowed into one line.
    Lines are stored non-temporally: `stream_fence` must follow.
    """
    if not 0 < n <= LINE_FLOATS:
        return None
    group = n * LINE_BF16 // math.gcd(n, LINE_BF16)  # values: whole lines of floats and of bf16 alike
    per_group = group // n  # runs
    lines = []  # per float line of a group: the run its first float is in, and the shuffle of that run and the next
    for line in range(group // LINE_FLOATS):
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
        bf16 = _is_bf16(dst)

        def codegen(context, builder, signature, args):
            dst_type, _, src_type, _, runs_type, _ = signature.args
            dst_value, dst_at, src_value, src_at, runs_value, groups_value = args
            i32, i64 = ir.IntType(32), ir.IntType(64)
            runs_data = context.make_array(runs_type)(context, builder, runs_value).data
            with cgutils.for_range(builder, groups_value) as group_at:
                first = builder.mul(group_at.index, ir.Constant(i64, per_group))
                loaded = []
                for k in range(per_group):
                    offset = builder.load(builder.gep(runs_data, [builder.add(first, ir.Constant(i64, k))]))
                    at = builder.add(src_at, builder.sext(offset, i64) if offset.type.width < 64 else offset)
                    loaded.append(builder.load(_line_pointer(context, builder, src_type, src_value, at), align=4))
                base = builder.add(dst_at, builder.mul(group_at.index, ir.Constant(i64, group)))
                values = []
                for run, order in lines:
                    second = loaded[run + 1] if run + 1 < per_group else loaded[run]
                    shuffle = ir.Constant(ir.VectorType(i32, LINE_FLOATS), order)
                    values.append(builder.shuffle_vector(loaded[run], second, shuffle))
                if bf16:
                    for i in range(0, len(values), 2):
                        at = builder.add(base, ir.Constant(i64, i * LINE_FLOATS))
                        _store_bf16_pair(context, builder, dst_type, dst_value, at, values[i], values[i + 1])
                else:
                    for i, value in enumerate(values):
                        at = builder.add(base, ir.Constant(i64, i * LINE_FLOATS))
                        _store_nontemporal(builder, value, _line_pointer(context, builder, dst_type, dst_value, at))
            return context.get_dummy_value()

        return sig, codegen

    runs_as_lines.__name__ = runs_as_lines.__qualname__ = f"runs_of_{n}_as_lines"
    return intrinsic(runs_as_lines), group
