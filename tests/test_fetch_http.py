"""HTTP sources against a real local server and forward proxy (docs/behaviour.md §3.4, TV-F2).

Every test runs against servers started (and joined) by its fixtures on 127.0.0.1; nothing touches
the network. Each fetch is wrapped in `_fetch`, which also checks that no fd stays open, and the
server fixture checks that no thread outlives it.
"""

import re
import threading
import time
import urllib.parse

import pytest
from httpserver import ForwardProxy, MediaServer, RunningServer, SilentListener, gzip_of_zeros, pattern
from processes import open_fds

from mmworker.common.budget import MAX_FETCH_BYTES, MAX_VIDEO_FETCH_BYTES, ByteBudget
from mmworker.common.fetch import fetch_bytes
from mmworker.common.http import _BodySink, http_get, proxy_for, timeout_from_env
from mmworker.errors import MmError

_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """The host's proxy settings must not leak into the tests (curl would never see them anyway)."""
    for name in (*_PROXY_VARS, "no_proxy", "NO_PROXY", "REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server():
    baseline = threading.active_count()
    srv = MediaServer()
    try:
        yield srv
    finally:
        srv.stop()
    assert threading.active_count() == baseline, "a server or handler thread outlived the test"


@pytest.fixture
def proxy(server):
    srv = ForwardProxy()
    try:
        yield srv
    finally:
        srv.stop()


def _fetch(
    servers: RunningServer | tuple[RunningServer, ...], source: str, budget: ByteBudget | None = None, **kw
) -> bytes:
    """fetch_bytes, asserting that the call leaves no fd behind whether it returns or raises.

    The servers live in this process, so their side of each connection is waited for first.
    """
    servers = servers if isinstance(servers, tuple) else (servers,)
    for srv in servers:
        srv.wait_idle()
    before = open_fds()
    try:
        return fetch_bytes(source, budget, **kw)
    finally:
        for srv in servers:
            srv.wait_idle()
        after = open_fds()
        assert after == before, f"fetch left a file descriptor open: {set(after.items()) - set(before.items())}"


def test_200_ok(server):
    budget = ByteBudget()
    assert _fetch(server, server.url("/bytes/100000"), budget) == pattern(100000)
    assert budget.used == 100000


def test_empty_body(server):
    assert _fetch(server, server.url("/bytes/0")) == b""


@pytest.mark.parametrize("code", [404, 503, 400, 500])
def test_error_status_names_the_code_and_costs_no_budget(server, code):
    url = server.url(f"/status/{code}")
    budget = ByteBudget()
    with pytest.raises(MmError) as exc:
        _fetch(server, url, budget)
    assert str(exc.value) == f"media fetch: GET {url}: {url}: status code {code}"
    assert budget.used == 0
    assert exc.value.__cause__ is not None  # libcurl's error is chained, not swallowed


def test_three_redirects_are_followed(server):
    assert _fetch(server, server.url("/redirect/3")) == b"landed"
    assert _fetch(server, server.url("/redirect/5")) == b"landed"  # the limit itself is allowed


def test_six_redirects_are_refused(server):
    url = server.url("/redirect/6")
    expected = rf"^media fetch: GET {re.escape(url)}: Maximum \(5\) redirects followed \(curl error 47\)$"
    with pytest.raises(MmError, match=expected):
        _fetch(server, url)


def test_redirect_error_reports_the_final_url(server):
    target = server.url("/status/404")
    url = server.url("/redirect-to?url=" + urllib.parse.quote(target))
    with pytest.raises(MmError) as exc:
        _fetch(server, url)
    assert str(exc.value) == f"media fetch: GET {url}: {target}: status code 404"


def test_redirect_to_ftp_is_refused_without_connecting(server):
    listener = SilentListener()
    try:
        target = f"ftp://127.0.0.1:{listener.port}/img.png"
        url = server.url("/redirect-to?url=" + urllib.parse.quote(target))
        with pytest.raises(MmError, match=r'Protocol "ftp" is disabled \(in redirect\) \(curl error 1\)$'):
            _fetch(server, url, timeout=2)
        assert not listener.was_contacted()
    finally:
        listener.close()


def test_redirect_to_a_local_file_is_refused(server):
    url = server.url("/redirect-to?url=" + urllib.parse.quote("file:///etc/passwd"))
    with pytest.raises(MmError, match=r'Protocol "file" is disabled \(in redirect\)') as exc:
        _fetch(server, url)
    assert "root:" not in str(exc.value)


def test_timeout_from_env(server, monkeypatch):
    monkeypatch.setenv("REQUEST_TIMEOUT", "1")
    url = server.url("/slow/10")
    start = time.monotonic()
    with pytest.raises(MmError, match=rf"^media fetch: GET {re.escape(url)}: timed out after 1 s \(") as exc:
        _fetch(server, url)
    elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 2.0, elapsed
    assert exc.value.__cause__ is not None


def test_timeout_argument_overrides_env(server, monkeypatch):
    monkeypatch.setenv("REQUEST_TIMEOUT", "30")
    start = time.monotonic()
    with pytest.raises(MmError, match=r"timed out after 0\.3 s"):
        _fetch(server, server.url("/slow/10"), timeout=0.3)
    assert time.monotonic() - start < 1.5


def test_slow_but_in_time_succeeds(server, monkeypatch):
    monkeypatch.setenv("REQUEST_TIMEOUT", "2")
    assert _fetch(server, server.url("/slow/0.3")) == b"late"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, 3),
        ("1", 1),
        ("0", 0),
        ("+7", 7),
        ("007", 7),
        ("abc", 3),
        ("-1", 3),
        (" 5", 3),
        ("5 ", 3),
        ("1.5", 3),
        ("1_0", 3),
        ("", 3),
        ("18446744073709551615", 18446744073709551615),
        ("18446744073709551616", 3),
        ("9" * 5000, 3),
    ],
)
def test_request_timeout_parsing(raw, expected):
    env = {} if raw is None else {"REQUEST_TIMEOUT": raw}
    assert timeout_from_env(env) == expected


def test_negative_timeout_argument_is_rejected(server):
    with pytest.raises(MmError, match="non-negative"):
        _fetch(server, server.url("/bytes/1"), timeout=-1)


def test_tv_f2_body_of_64_mib_plus_2_with_content_length(server):
    url = server.url(f"/bytes/{MAX_FETCH_BYTES + 2}")
    budget = ByteBudget()
    with pytest.raises(MmError) as exc:
        _fetch(server, url, budget)
    assert str(exc.value) == f"media fetch: {url}: exceeds 67108864 bytes"
    assert budget.used == 0


def test_declared_oversize_is_refused_before_the_body_is_read(server):
    url = server.url(f"/bytes/{1 << 40}")  # 1 TiB declared
    with pytest.raises(MmError, match=rf"^media fetch: {re.escape(url)}: exceeds 67108864 bytes$"):
        _fetch(server, url)
    # What the server got out before the hang-up sits in socket buffers, far below the cap.
    assert server.server.body_bytes_sent < MAX_FETCH_BYTES // 2


def test_tv_f2_streamed_body_of_64_mib_plus_2(server):
    # Chunked: no Content-Length to refuse early, so the write callback has to stop the transfer.
    url = server.url(f"/chunked/{MAX_FETCH_BYTES + 2}")
    budget = ByteBudget()
    with pytest.raises(MmError, match=rf"^media fetch: {re.escape(url)}: exceeds 67108864 bytes$"):
        _fetch(server, url, budget)
    assert budget.used == 0


def test_streamed_body_of_exactly_64_mib_is_accepted(server):
    body = _fetch(server, server.url(f"/chunked/{MAX_FETCH_BYTES}"), ByteBudget())
    assert len(body) == MAX_FETCH_BYTES
    assert body[:4096] == pattern(4096)


def test_chunked_body(server):
    n = (1 << 20) + 7
    assert _fetch(server, server.url(f"/chunked/{n}")) == pattern(n)


def test_gzip_body_is_decoded_and_charged_decoded(server):
    budget = ByteBudget()
    assert _fetch(server, server.url("/gzip/200000"), budget) == pattern(200000)
    assert budget.used == 200000


def test_gzip_bomb_is_stopped_at_the_decoded_cap(server):
    assert len(gzip_of_zeros(MAX_FETCH_BYTES + 1)) < 1 << 20  # it really is a small download
    url = server.url(f"/gzip-bomb/{MAX_FETCH_BYTES + 1}")
    budget = ByteBudget()
    with pytest.raises(MmError, match=rf"^media fetch: {re.escape(url)}: exceeds 67108864 bytes$"):
        _fetch(server, url, budget)
    assert budget.used == 0
    # One byte less inflates to exactly the cap and is accepted.
    assert _fetch(server, server.url(f"/gzip-bomb/{MAX_FETCH_BYTES}"), ByteBudget()) == bytes(MAX_FETCH_BYTES)


def test_request_budget_exhaustion_across_two_downloads(server):
    size = 1 << 20
    budget = ByteBudget(size + size // 2)
    assert _fetch(server, server.url(f"/bytes/{size}"), budget) == pattern(size)
    url = server.url(f"/chunked/{size}")
    with pytest.raises(MmError) as exc:
        _fetch(server, url, budget)
    assert str(exc.value) == f"media fetch: {url}: exceeds the request media byte budget"
    assert budget.used == size  # the failed download gave back what it had claimed


def test_default_budget_is_64_mib(server):
    # Without a budget argument, the 64 MiB standalone budget applies; below the cap, so it succeeds.
    assert len(_fetch(server, server.url(f"/bytes/{3 << 20}"))) == 3 << 20


# --- a per-stream cap other than 64 MiB (videos: MAX_VIDEO_FETCH_BYTES) ----------------------------------
_BIG_CAP = MAX_FETCH_BYTES + (1 << 20)  # above 64 MiB, yet a test downloads no more than 65 MiB


def test_a_larger_cap_admits_a_streamed_body_over_64_mib(server):
    n = MAX_FETCH_BYTES + (512 << 10)
    budget = ByteBudget()
    body = _fetch(server, server.url(f"/chunked/{n}"), budget, cap=_BIG_CAP)
    assert len(body) == n and budget.used == n
    assert body[-4096:] == pattern(n)[-4096:]


@pytest.mark.parametrize("route", ["bytes", "chunked"])
def test_a_larger_cap_refuses_one_byte_past_itself_naming_its_number(server, route):
    # /bytes: the declared length is refused (MAXFILESIZE); /chunked: the write callback stops it.
    url = server.url(f"/{route}/{_BIG_CAP + 1}")
    budget = ByteBudget()
    with pytest.raises(MmError) as exc:
        _fetch(server, url, budget, cap=_BIG_CAP)
    assert str(exc.value) == f"media fetch: {url}: exceeds {_BIG_CAP} bytes"
    assert budget.used == 0


@pytest.mark.parametrize("route", ["bytes", "chunked", "gzip"])
def test_a_small_cap_is_exact_on_every_body_kind(server, route):
    # Declared length, streamed body and decoded gzip each meet the caller's cap, not 64 MiB.
    assert _fetch(server, server.url(f"/{route}/1000"), ByteBudget(), cap=1000) == pattern(1000)
    url = server.url(f"/{route}/1000")
    with pytest.raises(MmError, match=rf"^media fetch: {re.escape(url)}: exceeds 999 bytes$"):
        _fetch(server, url, ByteBudget(), cap=999)


def test_http_get_takes_the_cap_and_the_budget_still_wins_where_smaller(server):
    url = server.url(f"/chunked/{2 << 20}")
    budget = ByteBudget(1 << 20)  # what is left of the request: less than this video
    with pytest.raises(MmError) as exc:
        http_get(url, budget, 5, cap=MAX_VIDEO_FETCH_BYTES)
    assert str(exc.value) == f"media fetch: {url}: exceeds the request media byte budget"
    assert budget.used == 0
    assert http_get(server.url("/bytes/10"), ByteBudget(), 5, cap=10) == pattern(10)


@pytest.mark.parametrize("cap", [0, -5, 1 << 63, False])
def test_a_cap_that_bounds_nothing_is_refused_before_any_request(server, cap):
    with pytest.raises(MmError, match=rf"byte cap must be an int from 1 to 2\*\*63 - 1, got {re.escape(repr(cap))}$"):
        _fetch(server, server.url("/bytes/10"), cap=cap)
    assert server.server.received == []


def test_connection_refused(server):
    listener = SilentListener()
    port = listener.port
    listener.close()  # nothing listens there any more
    url = f"http://127.0.0.1:{port}/x"
    with pytest.raises(MmError, match=rf"^media fetch: GET {re.escape(url)}: .*\(curl error 7\)$"):
        _fetch(server, url)


# --- proxies -------------------------------------------------------------------------------------


def test_http_proxy_is_used(server, proxy, monkeypatch):
    monkeypatch.setenv("http_proxy", proxy.url(""))
    url = server.url("/bytes/1000")
    assert _fetch((server, proxy), url) == pattern(1000)
    assert proxy.requests == [url]


@pytest.mark.parametrize("var", ["HTTP_PROXY", "all_proxy", "ALL_PROXY"])
def test_other_proxy_variables_for_http(server, proxy, monkeypatch, var):
    # curl alone would ignore uppercase HTTP_PROXY; our rule honours it.
    monkeypatch.setenv(var, proxy.url(""))
    url = server.url("/bytes/10")
    assert _fetch((server, proxy), url) == pattern(10)
    assert proxy.requests == [url]


def test_https_proxy_is_not_used_for_http(server, proxy, monkeypatch):
    monkeypatch.setenv("https_proxy", proxy.url(""))
    monkeypatch.setenv("HTTPS_PROXY", proxy.url(""))
    assert _fetch((server, proxy), server.url("/bytes/10")) == pattern(10)
    assert proxy.requests == []


def test_redirects_through_the_proxy(server, proxy, monkeypatch):
    monkeypatch.setenv("http_proxy", proxy.url(""))
    assert _fetch((server, proxy), server.url("/redirect/2")) == b"landed"
    assert proxy.requests == [server.url(f"/redirect/{n}") for n in (2, 1, 0)]


@pytest.mark.parametrize(
    "no_proxy",
    ["127.0.0.1", "127.0.0.0/8", "127.0.0.1:{port}", "localhost, 127.0.0.1:{port}", "*", " .0.0.1"],
)
@pytest.mark.parametrize("var", ["no_proxy", "NO_PROXY"])
def test_no_proxy_bypasses_the_proxy(server, proxy, monkeypatch, no_proxy, var):
    monkeypatch.setenv("http_proxy", proxy.url(""))
    monkeypatch.setenv(var, no_proxy.format(port=server.port))
    assert _fetch((server, proxy), server.url("/bytes/10")) == pattern(10)
    assert proxy.requests == []


@pytest.mark.parametrize("no_proxy", ["127.0.0.1:{other}", "10.0.0.0/8", "localhost", "127.0.0.1 foo"])
def test_non_matching_no_proxy_keeps_the_proxy(server, proxy, monkeypatch, no_proxy):
    # "127.0.0.1 foo" is one entry for us; libcurl's own NO_PROXY parser stops at the blank and would
    # bypass, so this also shows libcurl never applies its environment logic on top of ours.
    monkeypatch.setenv("http_proxy", proxy.url(""))
    monkeypatch.setenv("no_proxy", no_proxy.format(other=server.port + 1 if server.port < 65535 else 1))
    url = server.url("/bytes/10")
    assert _fetch((server, proxy), url) == pattern(10)
    assert proxy.requests == [url]


def test_lowercase_no_proxy_wins_even_when_empty(server, proxy, monkeypatch):
    monkeypatch.setenv("http_proxy", proxy.url(""))
    monkeypatch.setenv("no_proxy", "")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    url = server.url("/bytes/10")
    assert _fetch((server, proxy), url) == pattern(10)
    assert proxy.requests == [url]


def test_proxy_for_rules():
    env = {"https_proxy": "http://s", "all_proxy": "http://a", "http_proxy": "", "HTTP_PROXY": "http://H"}
    assert proxy_for("https://x/", env) == "http://s"
    assert proxy_for("http://x/", env) == "http://H"  # empty lowercase counts as unset
    assert proxy_for("http://x/", {"all_proxy": "http://a", "ALL_PROXY": "http://A"}) == "http://a"
    assert proxy_for("https://x/", {"ALL_PROXY": "http://A", "http_proxy": "http://h"}) == "http://A"
    assert proxy_for("http://x/", {"https_proxy": "http://s"}) == ""
    assert proxy_for("http://x/", {**env, "NO_PROXY": "x"}) == ""
    assert proxy_for("http://x/", {}) == ""


# --- the write callback on its own ---------------------------------------------------------------
# libcurl >= 8.4 also enforces MAXFILESIZE on streamed and decoded bodies, which would hide a broken
# callback in the end-to-end tests above; older libcurl checks only Content-Length.


def test_sink_stops_one_byte_past_the_cap():
    budget = ByteBudget()
    sink = _BodySink(budget)
    chunk = bytes(1 << 20)
    for _ in range(MAX_FETCH_BYTES // len(chunk)):
        assert sink.write(chunk) is None
    assert budget.used == MAX_FETCH_BYTES
    assert sink.write(b"x") == 0
    assert sink.failure == "cap"
    sink.discard()
    assert budget.used == 0


def test_sink_stops_one_byte_past_its_own_cap():
    budget = ByteBudget()
    sink = _BodySink(budget, cap=10)
    assert sink.write(b"0123456789") is None
    assert sink.write(b"x") == 0
    assert sink.failure == "cap" and sink.cap == 10
    sink.discard()
    assert budget.used == 0


def test_sink_stops_at_the_budget():
    budget = ByteBudget(10)
    sink = _BodySink(budget)
    assert sink.write(b"123456") is None
    assert sink.write(b"12345") == 0
    assert sink.failure == "budget"
    assert budget.used == 6
    sink.discard()
    assert budget.used == 0


def test_sink_records_unexpected_errors_instead_of_raising():
    sink = _BodySink(ByteBudget())
    assert sink.write(None) == 0  # type: ignore[arg-type]
    assert isinstance(sink.unexpected, TypeError)
