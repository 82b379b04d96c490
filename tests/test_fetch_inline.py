"""Inline sources: data: URLs, bare base64, strict decoding and the base64 budget (docs/behaviour.md §3.1-3.2)."""

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmworker.common import fetch, inline
from mmworker.common.budget import MAX_FETCH_BYTES, ByteBudget
from mmworker.common.fetch import base64_decode, fetch_bytes
from mmworker.errors import MmError

PAYLOAD = bytes(range(256)) * 3 + b"tail"  # 772 bytes: a length with a padded last quad
B64 = base64.b64encode(PAYLOAD).decode()


def test_data_url_and_bare_base64_give_the_same_bytes():
    assert fetch_bytes(f"data:image/png;base64,{B64}") == PAYLOAD
    assert fetch_bytes(B64) == PAYLOAD


def test_data_url_header_is_not_checked_and_the_first_comma_splits():
    hello = base64.b64encode(b"hello").decode()
    assert fetch_bytes(f"data:text/plain,{hello}") == b"hello"  # no ;base64, still base64
    assert fetch_bytes(f"data:,{hello}") == b"hello"
    with pytest.raises(MmError, match=r"^media fetch: base64 decode: Invalid symbol 44, offset"):
        fetch_bytes(f"data:a,b,{hello}")  # everything after the FIRST comma, so the 2nd comma is data


@pytest.mark.parametrize("src", ["data:image/png;base64", "data:", "data:image/png;base64;" + B64])
def test_data_url_without_comma_is_malformed(src):
    with pytest.raises(MmError, match=r"^media fetch: malformed data: URL$"):
        fetch_bytes(src)


def test_fetch_trims_like_rust_str_trim_but_base64_decode_does_not():
    padded = f" \t\r\n{B64}\n\u3000"
    assert fetch_bytes(padded) == PAYLOAD
    assert fetch_bytes(f"data:image/png;base64,  {B64}\n") == PAYLOAD
    with pytest.raises(MmError, match=r"^media fetch: base64 decode: Invalid symbol 32, offset 0\.$"):
        base64_decode(" " + B64)
    with pytest.raises(MmError, match=r"^media fetch: base64 decode: "):
        base64_decode(B64 + "\n")


def test_trim_keeps_separators_python_would_strip():
    # U+001F is whitespace to str.strip() but not to Rust's str::trim, so it stays and is rejected.
    assert "\x1f".isspace()
    with pytest.raises(MmError, match=r"Invalid symbol 31, offset 0\."):
        fetch_bytes("\x1f" + B64)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("aGVs\nbG8=", r"Invalid symbol 10, offset 4\."),  # embedded newline
        ("aGVs bG8=", r"Invalid symbol 32, offset 4\."),  # embedded space
        ("-_-_", r"Invalid symbol 45, offset 0\."),  # URL-safe alphabet
        ("Pz8_", r"Invalid symbol 95, offset 3\."),
        ("aGVsbG8", r"Invalid padding"),  # missing padding
        ("QQ", r"Invalid padding"),
        ("QQ=", r"Invalid padding"),
        ("QUJD=", r"Invalid padding"),  # extra padding after a full quad
        ("QQ===", r"Invalid symbol 61, offset 2\."),  # a third '='
        ("QQ==QQ==", r"Invalid symbol 61, offset 2\."),  # padding in the middle
        ("QR==", r"Invalid last symbol 82, offset 1\."),  # non-zero trailing bits: Python gives b'A'
        ("QUI=", None),
        ("QUJ=", r"Invalid last symbol 74, offset 2\."),
        ("Q", r"Invalid input length: 1"),
        ("QUJDR", r"Invalid input length: 5"),
        ("aé==", r"Invalid symbol 195, offset 1\."),  # offsets and bytes are UTF-8, as in Rust
        ("=", r"Invalid padding"),
    ],
)
def test_base64_strictness(text, reason):
    if reason is None:
        assert base64_decode(text) == b"AB"
        return
    with pytest.raises(MmError, match=rf"^media fetch: base64 decode: {reason}$"):
        base64_decode(text)
    with pytest.raises(MmError, match=rf"^media fetch: base64 decode: {reason}$"):
        fetch_bytes(text)


def test_python_alone_would_accept_what_we_reject():
    # Guards the premise of the explicit checks: if binascii became strict, they could go.
    assert base64.b64decode("QR==", validate=True) == b"A"
    assert base64.b64decode("aGVs\nbG8=") == b"hello"


def test_empty_input_is_empty_bytes():
    assert base64_decode("") == b""
    assert fetch_bytes("") == b""
    assert fetch_bytes("data:,") == b""


def test_relative_paths_and_other_schemes_fall_through_to_base64():
    for src in ("img.png", "./img.png", "HTTP://example.com/a.png", "ftp://example.com/a.png"):
        with pytest.raises(MmError, match=r"^media fetch: base64 decode: "):
            fetch_bytes(src)


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        fetch_bytes("!!")


@given(st.binary(max_size=300))
def test_roundtrip_and_budget_accounting(data):
    encoded = base64.b64encode(data).decode()
    budget = ByteBudget(10_000)
    assert base64_decode(encoded) == data
    # Via data: because bare base64 that starts with "/" is taken for a path (next test).
    assert fetch_bytes(f"data:;base64,{encoded}", budget) == data
    assert budget.used == len(data)  # the estimate's surplus was given back


def test_bare_base64_starting_with_a_slash_is_read_as_a_path():
    # Upstream precedence: "/..." is an absolute path before it could be base64. Every JPEG's bare
    # base64 starts with "/9j/", so bare-base64 JPEGs fail here; data: URLs are unaffected.
    jpeg_head = base64.b64encode(b"\xff\xd8\xff\xe0\x00\x10JFIF").decode()
    assert jpeg_head.startswith("/9j/")
    with pytest.raises(MmError, match=r"^media fetch: /9j/.*: No such file or directory \(os error 2\)$"):
        fetch_bytes(jpeg_head)
    assert fetch_bytes(f"data:image/jpeg;base64,{jpeg_head}").startswith(b"\xff\xd8")


@given(st.text(max_size=40))
def test_decoder_agrees_with_canonical_reencoding(text):
    try:
        data = base64_decode(text)
    except MmError:
        # Anything we reject must not be a canonical encoding of some byte string.
        try:
            canonical = base64.b64encode(base64.b64decode(text, validate=True)).decode()
        except ValueError:
            return
        assert canonical != text
    else:
        assert base64.b64encode(data).decode() == text


# --- budget (docs/behaviour.md §3.2, TV-F1) -----------------------------------------------------------


def test_tv_f1_two_payloads_share_a_budget():
    budget = ByteBudget(6144)
    b64 = base64.b64encode(bytes(4096)).decode()
    assert fetch_bytes(b64, budget) == bytes(4096)
    assert budget.used == 4096
    with pytest.raises(
        MmError,
        match=r"^media fetch: base64 payload: exceeds the request media byte budget "
        r"\(decoded size 4096 bytes, 2048 bytes remaining\)$",
    ):
        fetch_bytes(f"data:image/png;base64,{b64}", budget)
    assert budget.used == 4096


def test_estimate_formula():
    assert inline.decoded_size_estimate("") == 0
    assert inline.decoded_size_estimate("QQ==") == 1
    assert inline.decoded_size_estimate("QUI=") == 2
    assert inline.decoded_size_estimate("QUJD") == 3
    assert inline.decoded_size_estimate("QUJDRA==") == 4
    assert inline.decoded_size_estimate("QQ===") == 4  # ceil(5/4)*3 - min(3, 2)
    assert inline.decoded_size_estimate("é") == 3  # UTF-8 length 2


def test_budget_is_checked_before_decoding_and_an_exact_fit_passes():
    b64 = base64.b64encode(bytes(30)).decode()  # 40 chars, estimate 30
    with pytest.raises(MmError, match=r"decoded size 30 bytes, 29 bytes remaining"):
        fetch_bytes(b64, ByteBudget(29))
    with pytest.raises(MmError, match=r"base64 payload: exceeds"):
        fetch_bytes("!" * 40, ByteBudget(29))  # invalid, but too big to be worth decoding
    assert fetch_bytes(b64, ByteBudget(30)) == bytes(30)


def test_failed_decode_returns_the_whole_reservation():
    budget = ByteBudget(1000)
    with pytest.raises(MmError, match="base64 decode"):
        fetch_bytes("QUJD" * 10 + "QR==", budget)
    assert budget.used == 0


def test_default_budget_is_64_mib_for_base64():
    assert fetch_bytes.__kwdefaults__ == {"timeout": None, "policy": None, "cap": MAX_FETCH_BYTES}
    # The estimate alone decides, so no 64 MiB string of valid base64 is needed to hit the cap.
    oversized = "A" * ((MAX_FETCH_BYTES // 3 + 1) * 4)
    with pytest.raises(MmError, match=r"decoded size 67108866 bytes, 67108864 bytes remaining"):
        fetch_bytes(oversized)


def test_a_cap_sizes_the_fresh_budget_but_never_bounds_inline_media_under_a_given_budget():
    b64 = base64.b64encode(bytes(30)).decode()
    # No budget: a fresh one of `cap` bytes, so the cap bounds the payload through the budget.
    assert fetch_bytes(b64, cap=30) == bytes(30)
    with pytest.raises(MmError, match=r"decoded size 30 bytes, 29 bytes remaining\)$"):
        fetch_bytes(f"data:video/mp4;base64,{b64}", cap=29)
    # The request's budget given: inline payloads are bounded by it alone, as upstream (no stream cap).
    budget = ByteBudget(30)
    assert fetch_bytes(b64, budget, cap=10) == bytes(30)
    assert budget.used == 30


def test_base64_decode_is_re_exported_from_fetch():
    assert fetch.base64_decode is inline.base64_decode
