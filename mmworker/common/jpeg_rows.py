"""Colour JPEGs (libjpeg-turbo): decoded whole into a buffer the result owns, or through a ring of rows in bands.

`JpegRows` is an opened colour (YCbCr or RGB) JPEG whose header has been checked and whose pixels
are not decoded yet. `load()` decodes it whole; `stream(sink)` decodes it into a ring
of rows and calls `sink(first_row, rows)` with every band of rows as soon as it is decoded, so that
a consumer that reads rows in order (a resize, then a patchify) never has the whole image in
memory: at 12 MP the decoded image (48.8 MB of 4-byte pixels) is twice Qwen's pixel_values.

How it works. Pillow's decoder writes row y wherever the image's row pointer y points
(im->image[y]), and ImageFile.load reads the file in chunks through the plugin's `load_read`,
between which the decoder has written every complete row it could. So:
- the image Pillow decodes into maps an untouched anonymous mapping of the image's size (which
  Pillow's size check wants; no page of it is touched unless rows spill there, below), and its
  row pointers are aimed at the slots of a ring of R rows, row y at slot y mod R;
- on every read the rows decoded since the last one are found from a mark: the decoder writes
  255 as every pixel's fourth byte, and the last fourth byte of a slot is set to 0 whenever its
  row has been handed on, so rows y, y+1, ... are decoded while their slots read 255;
- rows are handed on in bands aligned with the ring, and a slot takes a new row only after the
  row it held was handed on: rows that would need a slot still in use point into the untouched
  mapping instead (where the mark reads 0 until written). A chunk that decodes more rows than the
  ring holds (flat areas compress to a few bytes a row) lands there, costs page faults and
  memory, and loses nothing; those pages are released once handed on.
The pixels are the decoder's own, from the same library call as an eager decode; only where rows
land differs. Reading the row pointers needs the layout of Pillow's image struct
(ImagingMemoryInstance); it is checked against what is known of the image before anything is
written, and if it does not match the image is decoded whole and handed on as one band.

`load()` takes another way into the same library first: libjpeg-turbo's whole-image call
(TurboJPEG, through simplejpeg), which fills all rows in one pass where Pillow's decoder asks for
one row at a time and copies each out, which takes longer. Its settings are
Pillow's (accurate integer IDCT, fancy upsampling) and libjpeg-turbo's releases decode alike, so
the pixels are the same; a file about which libjpeg has anything to say, warning or error, is
decoded by Pillow instead, which says what it says about it.

`stream(sink, lent)`, given memory its consumer will fill anyway, first tries TurboJPEG there: a
4:2:0 file whose Y, Cb and Cr planes fit is decoded into them and handed on in bands of the same
rows (mmworker.common.jpeg_planes, where the system's libturbojpeg is installed); any other goes
through the ring above.
"""

import ctypes
import io
import mmap
import traceback
import warnings
from collections.abc import Callable

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from mmworker.common.jpeg_planes import LentMemory, decode_planes, hand_on_planes
from mmworker.common.pixels import RgbImage, copy_rgb
from mmworker.errors import MmError, image_decode_error

# sink(first_row, rows): rows (n, width, 4) uint8 are image rows first_row .. first_row + n - 1,
# valid only during the call (their memory is reused afterwards).
RowSink = Callable[[int, np.ndarray], None]

# Decoded bytes per band handed on (the ring holds two). Small enough to stay in L2/L3 while the
# consumer reads it, large enough that a consumer's per-call setup is paid rarely (where
# pillow-simd runs the horizontal pass, it computes its coefficients on every call: ~65 us at
# 4032 -> 1148; 4 and 8 MB bands were no faster end to end with the aten_u8 kernel either).
_BAND_BYTES = 2 << 20
# File bytes per read: the decoder may produce rows for a whole chunk at once, so a chunk should
# not decode to more rows than the ring has free (below); more only spills, never fails.
_READ_MIN, _READ_MAX = 4096, 65536
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, MemoryError)
# libjpeg's colour spaces of a 3-component file, which Pillow opens as "RGB".
_COLOUR_SPACES = ("YCbCr", "RGB")


def colour_jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) of a colour (YCbCr or RGB) JPEG, from TurboJPEG's reading of its header; None
    for any other JPEG, or one whose header it cannot read (Pillow then opens it)."""
    try:
        height, width, colour_space, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    return (width, height) if colour_space in _COLOUR_SPACES else None


def open_with_pillow(data: bytes | memoryview, fmt: str) -> Image.Image:
    """Pillow's opening of a file of format `fmt` (its header only); its errors as MmError.

    Sizes are our own policy, checked by the caller: Pillow's decompression-bomb warning would
    only be noise, and its bomb error (twice its limit) says the image is too large.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data), formats=[fmt])
    except Image.DecompressionBombError as exc:
        raise MmError(f"image decode: image too large: {exc}") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        raise image_decode_error(exc) from exc


def _open_pillow(data: bytes | memoryview, width: int, height: int) -> Image.Image:
    """Pillow's opening of a colour JPEG whose header TurboJPEG read as width x height."""
    image = open_with_pillow(data, "JPEG")
    if image.size != (width, height) or image.mode != "RGB":
        w, h = image.size
        image.close()
        raise MmError(f"image decode: libjpeg reads a {width}x{height} colour JPEG, Pillow {w}x{h} {image.mode}")
    return image


def band_rows(width: int, height: int) -> int:
    """Rows per band that `JpegRows.stream` hands on for an image of this size (the last may be fewer)."""
    return min(height, max(16, _BAND_BYTES // (width * 4) // 16 * 16))


class _ImagingHead(ctypes.Structure):
    """The leading fields of Pillow 12's ImagingMemoryInstance (Imaging.h), up to the line size."""

    _fields_ = [
        ("mode", ctypes.c_int),
        ("type", ctypes.c_int),
        ("depth", ctypes.c_int),
        ("bands", ctypes.c_int),
        ("xsize", ctypes.c_int),
        ("ysize", ctypes.c_int),
        ("palette", ctypes.c_void_p),
        ("image8", ctypes.c_void_p),
        ("image32", ctypes.c_void_p),
        ("image", ctypes.c_void_p),
        ("block", ctypes.c_void_p),
        ("blocks", ctypes.c_void_p),
        ("pixelsize", ctypes.c_int),
        ("linesize", ctypes.c_int),
    ]


class _Memory:
    """Memory owned elsewhere, for numpy to view (np.asarray) without a copy."""

    def __init__(self, address: int, shape: tuple[int, ...], typestr: str) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": shape, "typestr": typestr, "version": 3}


def _capsule_pointer(capsule: object) -> int:
    get_name, get_pointer = ctypes.pythonapi.PyCapsule_GetName, ctypes.pythonapi.PyCapsule_GetPointer
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, get_name(capsule))


def _row_pointers(core: object, width: int, height: int, first_row: int) -> np.ndarray | None:
    """The row pointer array of a 4-byte Pillow image mapping rows from `first_row` on, as uint64[height].

    None unless the struct read has this image's size, 4-byte pixels, one array for image32 and
    image, and that array holds exactly the rows frombuffer mapped: then the layout is not the one
    assumed and nothing may be written.
    """
    ptr = getattr(core, "ptr", None)
    if ptr is None:
        return None
    head = _ImagingHead.from_address(_capsule_pointer(ptr))
    line = width * 4
    if (head.xsize, head.ysize, head.bands, head.pixelsize, head.linesize) != (width, height, 4, 4, line):
        return None
    if not head.image or head.image32 != head.image or head.image8:
        return None
    # Through numpy's array interface: a ctypes array type made per call would be cyclic garbage.
    rows = np.asarray(_Memory(head.image, (height,), "<u8"))
    if not np.array_equal(rows, first_row + np.arange(height, dtype=np.uint64) * np.uint64(line)):
        return None
    return rows


def _clear_frames(exc: BaseException | None) -> None:
    """Drop the local variables of the finished frames in exc's tracebacks and those of its causes."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


class JpegRows:
    """An opened colour JPEG, header checked, pixels not decoded: `load()` or `stream(sink)`, once.

    `image` is Pillow's opening of the file, if the caller has one; otherwise the file is opened
    by Pillow only when Pillow decodes it (a stream, or a file TurboJPEG leaves to it): TurboJPEG's
    reading of the header (`colour_jpeg_size`) costs a fraction of Pillow's open, which a worker
    would otherwise pay per image with caches that the decodes in between have swept.
    """

    def __init__(self, data: bytes | memoryview, width: int, height: int, image: Image.Image | None = None) -> None:
        self._image = image
        self._data: bytes | memoryview | None = data  # until the decode begins
        self._file_bytes = len(data)
        self.width, self.height = width, height

    @property
    def started(self) -> bool:
        """Its decode began (load or stream; either closes the file when done)."""
        return self._data is None

    def __repr__(self) -> str:
        return f"JpegRows({self.width}x{self.height})"

    def load(self) -> RgbImage:
        """Decode the whole image into a numpy buffer of 4-byte pixels that the result owns alone.

        Both decoders write 4 bytes per pixel (R, G, B, 255) into the buffer they are given:
        TurboJPEG directly, Pillow through an image that maps the buffer (ImageFile.load allocates
        nothing when the image already has its memory). The buffer is not zero-filled first
        (Pillow's own allocation is), and whoever consumes the result may overwrite and shrink it
        (mmworker.common.resize.horizontal_resize does).
        """
        w, h = self.width, self.height
        buffer = np.empty(h * w * 4, np.uint8)
        if not self._decode_at_once(buffer, "RGBX"):
            self._decode_into(buffer)
        return RgbImage(pixels=buffer.reshape(h, w, 4), buffer=buffer)

    def load_rgb(self) -> np.ndarray:
        """Decode the whole image into a fresh (height, width, 3) array, for callers that want 3-byte pixels.

        TurboJPEG writes them directly; Pillow's decoder writes 4-byte pixels only, so a file it
        decodes costs a second buffer and a copy.
        """
        w, h = self.width, self.height
        pixels = np.empty((h, w, 3), np.uint8)
        if self._decode_at_once(pixels, "RGB"):
            return pixels
        buffer = np.empty(h * w * 4, np.uint8)
        self._decode_into(buffer)
        return copy_rgb(buffer.reshape(h, w, 4), out=pixels)

    def _decode_at_once(self, out: np.ndarray, layout: str) -> bool:
        """TurboJPEG's decode of the whole file into `out` ("RGBX" or "RGB"); False if Pillow must decode it."""
        data, self._data = self._data, None
        try:
            # strict: a libjpeg warning (corrupt data it would paper over) raises too, so that the
            # file goes to Pillow, whose pixels or error it then gets.
            pixels = simplejpeg.decode_jpeg(data, layout, fastdct=False, fastupsample=False, buffer=out, strict=True)
            done = pixels.shape == (self.height, self.width, len(layout))  # else another reading of the header
        except ValueError:
            done = False
        if done:
            if self._image is not None:
                self._image.close()
        elif self._image is None:
            self._image = _open_pillow(data, self.width, self.height)
        return done

    def _decode_into(self, buffer: np.ndarray) -> None:
        """Pillow's decode of the whole image into `buffer`, 4 bytes per pixel."""
        self._image.im = Image.frombuffer("RGBX", (self.width, self.height), buffer, "raw", "RGBX", 0, 1).im
        self._decode(None)

    def stream(self, sink: RowSink, lent: LentMemory | None = None) -> None:
        """Decode, calling `sink` with consecutive bands of rows that cover the image once, in order.

        With `lent` memory a 4:2:0 file is decoded by TurboJPEG into planes there
        (mmworker.common.jpeg_planes) when they fit and libturbojpeg is installed; any other file,
        or one that does not fit, is decoded by Pillow into a ring of rows. A progressive file gives
        Pillow no row before its last scan: it is then decoded whole, as one band.
        """
        w, h = self.width, self.height
        if lent is not None:
            band = band_rows(w, h)
            layout = decode_planes(self._data, w, h, lent, band)
            if layout is not None:
                self._data = None
                if self._image is not None:
                    self._image.close()
                hand_on_planes(lent.buffer, layout, w, h, band, sink)
                return
        if self._image is None:
            self._image = _open_pillow(self._data, w, h)
        if self._image.info.get("progressive"):
            sink(0, self.load().pixels)
            return
        try:  # address space for Pillow's size check, and where rows spill (see the module docstring)
            reserve = mmap.mmap(-1, h * w * 4)
        except OSError as exc:
            raise MmError(f"image decode: no address space for a {w}x{h} image: {exc}") from exc
        ring = spill = None
        try:
            self._image.im = Image.frombuffer("RGBX", (w, h), reserve, "raw", "RGBX", 0, 1).im
            spill = np.frombuffer(reserve, np.uint8).reshape(h, w, 4)
            pointers = _row_pointers(self._image.im, w, h, spill.ctypes.data)
            if pointers is None:  # not the image struct this was written for
                sink(0, self.load().pixels)
                return
            ring = _Ring(self, reserve, spill, pointers, sink)
            self._decode(ring.before_read)
            ring.finish()
        except BaseException as exc:
            # The failed decode's frames (Pillow's load, its decoder) hold the image that maps the
            # reserve, and the exception's traceback would keep them, and the mapping, alive.
            _clear_frames(exc)
            raise
        finally:
            self._image.close()  # drops Pillow's mapping of the reserve (and its row pointers)
            if ring is not None:
                ring.drop()
            spill = pointers = None  # the last views of the reserve
            reserve.close()

    def _decode(self, before_read: Callable[[int], int] | None) -> None:
        """Pillow's load, with `before_read(size) -> size` run before it reads each chunk of the file."""
        self._data = None
        image = self._image
        ours: list[BaseException] = []  # raised by before_read (the consumer), not by Pillow
        if before_read is not None:
            read = image.load_read  # the plugin's; ImageFile.load reads every chunk through it

            def hooked(size: int) -> bytes:
                try:
                    size = before_read(size)
                except BaseException as exc:
                    ours.append(exc)
                    raise
                return read(size)

            image.load_read = hooked
        try:
            image.load()  # (Pillow's decompression-bomb check ran at open: mmworker.common.decode)
        except _DECODE_ERRORS as exc:
            if exc in ours:
                raise  # the consumer's, as it raised it
            raise image_decode_error(exc) from exc
        finally:
            image.close()  # drops the mapping (and with it Pillow's hold on the memory)
            if before_read is not None:
                del image.load_read  # else image and hook would hold each other until a gc pass


class _Ring:
    """One streaming decode's state: the ring, where each row points, what is decoded and handed on."""

    def __init__(self, jpeg: JpegRows, reserve: mmap.mmap, spill: np.ndarray, pointers: np.ndarray, sink: RowSink):
        w, h = jpeg.width, jpeg.height
        self.height, self.row_bytes, self.sink, self.reserve = h, w * 4, sink, reserve
        self.spill = spill  # the reserve's rows, where rows point that the ring cannot take
        self.pointers = pointers  # Pillow's row pointers (`_row_pointers`)
        self.band = band_rows(w, h)
        self.slots = min(h, 2 * self.band)  # a multiple of `band`, or every row: bands never wrap
        self.ring = np.empty((self.slots, w, 4), np.uint8)
        self.marks = self.ring[:, -1, 3]  # each slot's last fourth byte
        self.marks[:] = 0
        self.slot_addresses = np.uint64(self.ring.ctypes.data) + np.arange(self.slots, dtype=np.uint64) * np.uint64(
            self.row_bytes
        )
        self.bounce: np.ndarray | None = None  # spilled rows are handed on from here
        self.in_ring = np.zeros(h, np.bool_)
        self.decoded = 0  # rows known to be decoded
        self.handed = 0  # rows handed on (a multiple of `band` until the end)
        self.aimed = 0  # rows [decoded, aimed) point into the ring, rows from max(decoded, aimed) do not
        # File bytes that decode to about half a band of this image's average rows.
        self.read_bytes = max(_READ_MIN, min(_READ_MAX, jpeg._file_bytes * self.band // (2 * h)))
        self._aim()

    def before_read(self, _size: int) -> int:
        self._scan()
        while self.decoded >= min(self.height, self.handed + self.band) > self.handed:
            self._hand_on(min(self.height, self.handed + self.band))
        self._aim()
        return self.read_bytes

    def finish(self) -> None:
        """After load() returned: every row is written, wherever it points; hand on the rest."""
        self.decoded = self.height
        while self.handed < self.height:
            self._hand_on(min(self.height, self.handed + self.band))

    def drop(self) -> None:
        """Let go of every view of the reserve and of Pillow's row pointers (freed with the image)."""
        self.spill = self.pointers = None

    def _aim(self) -> None:
        # Row r may take slot r % slots once the row there before it (r - slots) has been handed on.
        start, stop = max(self.decoded, self.aimed), min(self.height, self.handed + self.slots)
        if start < stop:  # at most `slots` rows (start >= handed), so their slots wrap once at most
            first = start % self.slots
            head = min(stop - start, self.slots - first)
            self.pointers[start : start + head] = self.slot_addresses[first : first + head]
            self.pointers[start + head : stop] = self.slot_addresses[: stop - start - head]
            self.in_ring[start:stop] = True
            self.aimed = stop

    def _scan(self) -> None:
        row, marks, slots = self.decoded, self.marks, self.slots
        if row < self.aimed:
            # The ring's rows read 255 up to the first one not decoded yet, 0 from there on (the
            # decoder writes rows in order, into slots freed with a 0): a binary search finds it.
            low, high = row, self.aimed
            if marks[(high - 1) % slots] != 255:
                while low < high:
                    middle = (low + high) // 2
                    if marks[middle % slots] == 255:
                        low = middle + 1
                    else:
                        high = middle
                self.decoded = low
                return
            row = self.aimed
        while row < self.height and self.spill[row, -1, 3] == 255:  # spilled rows, if any
            row += 1
        self.decoded = row

    def _hand_on(self, end: int) -> None:
        """Hand rows [handed, end) to the sink, one run of rows in one place at a time, and free them."""
        row = self.handed
        while row < end:
            home = self.in_ring[row]
            changes = np.flatnonzero(self.in_ring[row:end] != home)
            stop = row + int(changes[0]) if changes.size else end
            if home:
                slot = row % self.slots
                self.sink(row, self.ring[slot : slot + stop - row])
                self.marks[slot : slot + stop - row] = 0
            else:
                self._hand_on_spilled(row, stop)
            row = stop
        self.handed = end

    def _hand_on_spilled(self, start: int, stop: int) -> None:
        # Through a bounce buffer, so that no view of the reserve leaves this object (it is unmapped
        # at the end, and an exception's traceback may keep the sink's arguments alive).
        if self.bounce is None:
            self.bounce = np.empty_like(self.ring[: self.band])
        for row in range(start, stop, self.band):
            n = min(self.band, stop - row)
            self.bounce[:n] = self.spill[row : row + n]
            self.sink(row, self.bounce[:n])
        page = mmap.PAGESIZE
        first, last = -(-start * self.row_bytes // page) * page, stop * self.row_bytes // page * page
        if last > first:
            self.reserve.madvise(mmap.MADV_DONTNEED, first, last - first)
