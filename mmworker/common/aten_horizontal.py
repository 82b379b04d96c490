"""aten_u8's horizontal pass as our own kernel: ATen's (pillow-simd's) bytes, coefficients computed once per image.

aten_u8 equals ATen's arithmetic, which pillow-simd's BICUBIC is too (mmworker.common.resize).
pillow-simd computes its coefficients again on every call (once per band of a streamed JPEG: 24
calls for a 12 MP image) and its kernel is written for AVX2. This one takes the same
coefficients once (`resample.axis_coefficients(aten=True)`: ATen's quantisation, which is
pillow-simd's; the tests compare every byte with pillow-simd where it is installed, and with our
fixed-point pass everywhere) and applies them to bands of 4-byte rows:

- every output pixel reads G * 8 consecutive source pixels (G = 1..4 groups of 8 taps; a window
  near the right edge is shifted left to stay in the row, and the taps it gains weigh 0), or 4
  when no window has more taps (a half group: every widening pass, whose bicubic windows have 4);
- a group is 8 pixels, bytes reordered so that the same channel of two neighbouring pixels
  sits side by side as int16, multiplied by that pair's two weights and summed pairwise (LLVM
  makes that one vpdpwssd, or vpmaddwd + vpaddd, on 512 bits); a half group is the windows of
  two outputs side by side in one such vector;
- 4 output pixels at a time, so that their sums over the groups reduce together (6 shuffles and
  3 adds for 4 pixels; 2 and 1 for half groups), then round, shift, clip and store as 16 bytes;
- two rows at a time, so that each quad's weights and window starts are loaded once for both.

All sums are int32 sums of int16 x uint8 products (|weight| < 2^15, at most 32 taps): exact in any
order, so the bytes equal pillow-simd's. Per row it is faster than pillow-simd's resize of the
same band, narrowing and widening (widening only since the half groups: with whole groups of 8
taps it was no faster there); bench/HISTORY.md has the figures. The kernel is generic LLVM IR and
compiles for any CPU; which pass it replaces decides where it is used (`aten_horizontal`). In
place of pillow-simd (the installed PIL in the project's .venv) only where it is faster: with
AVX-512 BW. In place of our generic fixed-point pass (resample.horizontal_pass, what runs with
stock Pillow) everywhere: compiled for AVX2 or SSE4.2 alone it is still several times faster than
that pass, as with AVX-512.
"""

import numpy as np
from llvmlite import binding, ir
from numba import config, int64, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from mmworker.common import resample
from mmworker.errors import MmError

_TAPS_PER_GROUP = 8
_MAX_GROUPS = 4
# `groups` of a pass whose windows have at most 4 taps (every widening one): half a group per
# output, two outputs per vector, so half the work of a group of 8 taps.
_HALF_GROUP = 0
# Rows the band kernel computes together, each quad's weights and windows loaded once for all of
# them (4032 -> 1148 on 128 rows 0.157 -> 0.130 ms, 1280 -> 1288 on 720 rows 0.394 -> 0.352; 3 or
# 4 rows measured no better than 2 beyond the noise).
_ROWS_PER_PASS = 2
# Bytes of 8 RGBX pixels, reordered to (p0.r p1.r p0.g p1.g p0.b p1.b p0.x p1.x, then p2, p3 ...).
_PAIR_ORDER = [8 * j + b for j in range(4) for b in (0, 4, 1, 5, 2, 6, 3, 7)]
# Lanes of two <16 x i32> (4 blocks of R, G, B, X each): blocks 0 and 2 of both, and blocks 1 and 3.
_EVEN_BLOCKS = [i for block in (0, 2, 4, 6) for i in range(4 * block, 4 * block + 4)]
_ODD_BLOCKS = [i + 4 for i in _EVEN_BLOCKS]


def _fast_on_this_host() -> bool:
    """AVX-512 BW, where the kernel was measured faster than pillow-simd."""
    if config.CPU_NAME not in (None, "host"):  # numba told to compile for another CPU
        return False
    return bool(binding.get_host_cpu_features().get("avx512bw", False))


FAST_HERE = _fast_on_this_host()


class AtenHorizontal:
    """The horizontal pass from `in_w` to `out_w` pixels; call it on bands of rows. Make it with `aten_horizontal`."""

    def __init__(self, in_w: int, out_w: int, bounds: np.ndarray, weights: np.ndarray, precision: int, groups: int):
        self.in_w, self.out_w, self.groups, self.precision = in_w, out_w, groups, precision
        quads = (out_w + 3) // 4
        self.starts = np.zeros(quads * 4, np.int32)
        self.table = np.zeros(quads * 4 * _table_per_output(groups), np.int16)
        _fill_table(bounds, weights, in_w, groups, self.starts, self.table)

    def __call__(self, rows: np.ndarray, out: np.ndarray) -> None:
        """out[r, x, :] from rows[r]: rows (n, in_w, 4) and out (n, out_w, 4) uint8, C-contiguous, apart."""
        n = rows.shape[0]
        if rows.shape != (n, self.in_w, 4) or out.shape != (n, self.out_w, 4):
            raise MmError(f"horizontal pass {self.in_w} -> {self.out_w}: rows {rows.shape}, out {out.shape}")
        if not (rows.flags.c_contiguous and out.flags.c_contiguous and rows.dtype == out.dtype == np.uint8):
            raise MmError("horizontal pass: rows and out must be C-contiguous uint8")
        _horizontal(rows.reshape(n, -1), self.starts, self.table, self.groups, self.precision, out.reshape(n, -1))


def aten_horizontal(in_w: int, out_w: int, *, pillow_simd: bool) -> AtenHorizontal | None:
    """The kernel for this pass, or None where another should run it. `pillow_simd`: the other is
    pillow-simd's resize (the installed PIL is pillow-simd), else our fixed-point pass.

    None for an unchanged width, a window of more than 32 taps, or a row narrower than one window;
    and against pillow-simd also without AVX-512 BW here, or for a widening pass with windows of
    more than 4 taps (bicubic's have at most 4; with a whole group of 8 taps widening was no
    faster than pillow-simd: 640x480 and 1280x720 JPEGs took 0.7% and 1.7% longer end to end)."""
    if out_w == in_w or (pillow_simd and not FAST_HERE):
        return None
    bounds, weights, precision = resample.axis_coefficients(in_w, out_w, resample.BICUBIC, aten=True)
    taps = int(bounds[:, 1].max())
    groups = _HALF_GROUP if taps <= _TAPS_PER_GROUP // 2 else -(-taps // _TAPS_PER_GROUP)
    if pillow_simd and out_w > in_w and groups != _HALF_GROUP:
        return None
    if groups > _MAX_GROUPS or in_w < _window(groups) or np.abs(weights).max() >= 1 << 15:
        return None
    return AtenHorizontal(in_w, out_w, bounds, weights, precision, groups)


@njit(cache=True)
def _window(groups: int) -> int:
    """Taps every output reads (those past its own weigh 0)."""
    return _TAPS_PER_GROUP // 2 if groups == _HALF_GROUP else groups * _TAPS_PER_GROUP


@njit(cache=True)
def _table_per_output(groups: int) -> int:
    """Weights (int16) per output in the table: its window's taps, each repeated for the 4 channels."""
    return 4 * _window(groups)


@njit(cache=True)
def _fill_table(bounds, weights, in_w, groups, starts, table):
    """starts[x]: the first pixel of output x's window (shifted left to stay in the row); table: per
    quad of outputs, per group, per output, the group's 4 weight pairs each repeated for the 4
    channels, (w0 w1) x 4, (w2 w3) x 4, (w4 w5) x 4, (w6 w7) x 4; the taps a window gains weigh 0.
    A half group has 2 pairs per output, (w0 w1) x 4, (w2 w3) x 4, so that two outputs fill a vector."""
    span = _window(groups)
    # int16 weights per output and group (a half group's output fills half a row), groups per quad
    row, per_quad = (16, 1) if groups == _HALF_GROUP else (32, groups)
    for x in range(bounds.shape[0]):
        first, count = bounds[x, 0], bounds[x, 1]
        start = min(first, in_w - span)
        starts[x] = start
        quad, i = x // 4, x % 4
        for k in range(count):
            tap = first - start + k  # its place in the window
            g, pair, side = tap // _TAPS_PER_GROUP, (tap % _TAPS_PER_GROUP) // 2, tap % 2
            at = ((quad * per_quad + g) * 4 + i) * row + pair * 8 + side
            for channel in range(4):
                table[at + 2 * channel] = weights[x, k]


def _emit_quad(context, builder, groups, src_p, src_ats, starts_p, table_p, x0, out_p, out_ats, shift) -> None:
    """IR for 4 output pixels of each row given: out_p[out_at : out_at + 16] from the row at src_p[src_at:],
    for every (src_at, out_at) of `src_ats`, `out_ats`; their weights and windows are loaded once for all."""
    i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    v32i8, v32i16, v32i32 = ir.VectorType(i8, 32), ir.VectorType(i16, 32), ir.VectorType(i32, 32)
    v16i32, v16i8 = ir.VectorType(i32, 16), ir.VectorType(i8, 16)

    def mask(indices):
        return ir.Constant(ir.VectorType(i32, len(indices)), indices)

    def splat(value):
        undef = ir.Constant(v16i32, None)
        return builder.shuffle_vector(builder.insert_element(undef, value, ir.Constant(i32, 0)), undef, mask([0] * 16))

    quad_table = builder.gep(table_p, [builder.mul(x0, ir.Constant(i64, _table_per_output(groups)))])

    starts = [
        builder.mul(builder.sext(builder.load(builder.gep(starts_p, [builder.add(x0, ir.Constant(i64, i))])), i64),
                    ir.Constant(i64, 4))
        for i in range(4)
    ]  # fmt: skip
    loaded_weights = {}

    def pair_sums(pixels, weights_at):  # 32 bytes of pixels, 32 weights: <16 x i32> of pairwise sums
        paired = builder.zext(builder.shuffle_vector(pixels, ir.Constant(v32i8, None), mask(_PAIR_ORDER)), v32i32)
        if weights_at not in loaded_weights:
            weights_p = builder.gep(quad_table, [ir.Constant(i64, weights_at)])
            loaded = builder.load(builder.bitcast(weights_p, v32i16.as_pointer()), align=2)
            loaded_weights[weights_at] = builder.sext(loaded, v32i32)
        products = builder.mul(paired, loaded_weights[weights_at])
        return builder.add(
            builder.shuffle_vector(products, products, mask(list(range(0, 32, 2)))),
            builder.shuffle_vector(products, products, mask(list(range(1, 32, 2)))),
        )

    def fold(a, b):  # per pixel: its 4 blocks summed; a's two halves first, then b's
        even, odd = mask(_EVEN_BLOCKS), mask(_ODD_BLOCKS)
        return builder.add(builder.shuffle_vector(a, b, even), builder.shuffle_vector(a, b, odd))

    rounding = splat(builder.shl(ir.Constant(i32, 1), builder.sub(shift, ir.Constant(i32, 1))))
    shifts = splat(shift)
    low, high = ir.Constant(v16i32, None), ir.Constant(v16i32, [255] * 16)
    for src_at, out_at in zip(src_ats, out_ats, strict=True):
        if groups == _HALF_GROUP:
            # Two outputs per vector: their 4-pixel windows side by side, then 2 blocks per output.
            halves = []
            for i in (0, 2):
                first, second = (
                    builder.load(
                        builder.bitcast(builder.gep(src_p, [builder.add(src_at, starts[j])]), v16i8.as_pointer()),
                        align=1,
                    )
                    for j in (i, i + 1)
                )
                pixels = builder.shuffle_vector(first, second, mask(list(range(32))))
                halves.append(pair_sums(pixels, i * 16))
            result = fold(halves[0], halves[1])
        else:
            sums = []
            for i in range(4):
                at = builder.add(src_at, starts[i])
                total = None
                for g in range(groups):
                    pixels_p = builder.gep(src_p, [builder.add(at, ir.Constant(i64, g * _TAPS_PER_GROUP * 4))])
                    pixels = builder.load(builder.bitcast(pixels_p, v32i8.as_pointer()), align=1)
                    summed = pair_sums(pixels, (g * 4 + i) * 32)
                    total = summed if total is None else builder.add(total, summed)
                sums.append(total)
            result = fold(fold(sums[0], sums[1]), fold(sums[2], sums[3]))
        result = builder.ashr(builder.add(result, rounding), shifts)
        result = builder.select(builder.icmp_signed("<", result, low), low, result)
        result = builder.select(builder.icmp_signed(">", result, high), high, result)
        target = builder.bitcast(builder.gep(out_p, [out_at]), v16i8.as_pointer())
        builder.store(builder.trunc(result, v16i8), target, align=1)


def _band_intrinsic(groups: int):
    """An intrinsic writing the first `quads` * 4 output pixels of `rows` rows, `groups` groups of 8 taps each,
    `_ROWS_PER_PASS` rows at a time (the rest one by one).

    The loops are in the IR: written in numba, choosing the kernel inside them slowed the pass down."""

    def band(typingctx, src, starts, table, out, rows, in_row, out_row, quads, precision):
        sig = types.void(src, starts, table, out, rows, in_row, out_row, quads, precision)

        def codegen(context, builder, signature, args):
            src_t, starts_t, table_t, out_t = signature.args[:4]
            src_v, starts_v, table_v, out_v, rows_v, in_row_v, out_row_v, quads_v, precision_v = args
            i64 = ir.IntType(64)

            def data(array_type, value):
                return context.make_array(array_type)(context, builder, value).data

            src_p, starts_p, table_p, out_p = (
                data(src_t, src_v), data(starts_t, starts_v), data(table_t, table_v), data(out_t, out_v)
            )  # fmt: skip
            shift = builder.trunc(precision_v, ir.IntType(32))

            def rows_at(first, count):  # every quad of `count` rows from row `first`, weights loaded once
                src_ats = [builder.mul(builder.add(first, ir.Constant(i64, r)), in_row_v) for r in range(count)]
                out_ats = [builder.mul(builder.add(first, ir.Constant(i64, r)), out_row_v) for r in range(count)]
                with cgutils.for_range(builder, quads_v) as quad:
                    x0 = builder.mul(quad.index, ir.Constant(i64, 4))
                    ats = [builder.add(at, builder.mul(x0, ir.Constant(i64, 4))) for at in out_ats]
                    _emit_quad(context, builder, groups, src_p, src_ats, starts_p, table_p, x0, out_p, ats, shift)

            together = ir.Constant(i64, _ROWS_PER_PASS)
            with cgutils.for_range(builder, builder.udiv(rows_v, together)) as group:
                rows_at(builder.mul(group.index, together), _ROWS_PER_PASS)
            done = builder.mul(builder.udiv(rows_v, together), together)
            with cgutils.for_range(builder, builder.sub(rows_v, done)) as rest:
                rows_at(builder.add(done, rest.index), 1)
            return context.get_dummy_value()

        return sig, codegen

    band.__name__ = band.__qualname__ = "_band_half" if groups == _HALF_GROUP else f"_band{groups}"
    return intrinsic(band)


_band_half = _band_intrinsic(_HALF_GROUP)
_band1, _band2, _band3, _band4 = (_band_intrinsic(groups) for groups in range(1, _MAX_GROUPS + 1))


@njit(cache=True, inline="always")
def _band(groups, src, starts, table, out, rows, in_row, out_row, quads, precision):
    """The band kernel for `groups` groups of taps (chosen here, outside its loops)."""
    if groups == _HALF_GROUP:
        _band_half(src, starts, table, out, rows, in_row, out_row, quads, precision)
    elif groups == 1:
        _band1(src, starts, table, out, rows, in_row, out_row, quads, precision)
    elif groups == 2:
        _band2(src, starts, table, out, rows, in_row, out_row, quads, precision)
    elif groups == 3:
        _band3(src, starts, table, out, rows, in_row, out_row, quads, precision)
    else:
        _band4(src, starts, table, out, rows, in_row, out_row, quads, precision)


@njit(cache=True)
def _horizontal(src, starts, table, groups, precision, out):
    """src (n, in_w * 4) and out (n, out_w * 4) uint8; 4 output pixels per step, the last ones via a stage."""
    n, out_w = int64(src.shape[0]), out.shape[1] // 4
    in_row, out_row = int64(src.shape[1]), int64(out.shape[1])
    flat_src, flat_out = src.reshape(-1), out.reshape(-1)
    whole, precision = out_w // 4 * 4, int64(precision)
    _band(groups, flat_src, starts, table, flat_out, n, in_row, out_row, int64(whole // 4), precision)
    if whole == out_w:
        return
    # The last 1-3 pixels of each row: one more quad (its table is padded to whole quads) into a
    # stage; the columns of starts and table from `whole` on are viewed as if they came first.
    stage = np.empty(16, np.uint8)
    tail_starts, tail_table = starts[whole:], table[whole * _table_per_output(groups) :]
    for r in range(n):
        row = flat_src[r * in_row : (r + 1) * in_row]
        _band(groups, row, tail_starts, tail_table, stage, int64(1), in_row, int64(16), int64(1), precision)
        for k in range((out_w - whole) * 4):
            flat_out[r * out_row + whole * 4 + k] = stage[k]
