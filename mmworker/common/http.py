"""HTTP(S) media download: one bounded GET through libcurl (pycurl), with timeout, redirects and proxies.

Each call builds one Curl handle and closes it before returning; there is no pool, no module-level
mutable state and no thread. The body is streamed through a write callback that charges every decoded
chunk to the request's ByteBudget and stops the transfer (by returning a short count) as soon as the
body passes the per-stream cap (MAX_FETCH_BYTES unless the caller passes `cap`) or the budget; the
matching MmError is raised after ``perform`` returns, chained to libcurl's error.

Upstream (ureq 2) behaviour kept: GET only, gzip accepted, redirects followed up to 5, status >= 400 is
an error naming the code, ``REQUEST_TIMEOUT`` seconds (default 3) bound the whole call, proxies from
the environment unless NO_PROXY matches. The proxy is computed here, never by libcurl, so the rules
are ours and testable (see `proxy_for`).

With a media policy (mmworker.common.policy; the pool always passes one, the library's
`fetch_bytes` none, as upstream) the transfer also refuses what the policy refuses, where it
happens: the URL and every redirect target before it is followed (its Location header), and the
resolved address of every connection libcurl opens, each redirect hop and DNS answer included,
before the socket exists (CURLOPT_OPENSOCKETFUNCTION), so a refused address never gets a packet;
through a proxy that address is the proxy the operator chose, and is not checked. `_apply_policy`
sets the schemes and the redirect cap. docs/reliability.md lists what is refused.
"""

import io
import os
import re
import socket
import urllib.parse
from collections.abc import Mapping

import pycurl

from mmworker.common.budget import CHUNK_BYTES, MAX_FETCH_BYTES, ByteBudget, check_cap
from mmworker.common.noproxy import no_proxy_from_env, no_proxy_matches
from mmworker.common.policy import HTTP_SCHEMES, MAX_REDIRECTS, MediaPolicy
from mmworker.errors import MmError

DEFAULT_TIMEOUT_S = 3  # Python's `int(os.getenv("REQUEST_TIMEOUT", "3"))`, kept by sglang-mm

# libcurl would read TIMEOUT_MS = 0 as "no timeout"; a fetch is never unbounded, so 0 s means 1 ms
# (fails at once). The upper clamp keeps absurd REQUEST_TIMEOUT values inside a C long of milliseconds.
_MIN_TIMEOUT_MS = 1
_MAX_TIMEOUT_MS = 2**31 - 1

# Rust's `u64::from_str`: ASCII digits with an optional '+', nothing else (no spaces, no '_').
_U64 = re.compile(r"\+?[0-9]+", re.ASCII)

# Proxy variables per URL scheme, first non-empty wins. Lowercase before uppercase, scheme-specific
# before ALL_PROXY, as curl and Python `requests` do. Upstream delegates this to ureq 2, believed to take
# the first set of ALL_PROXY, all_proxy, HTTPS_PROXY, https_proxy, HTTP_PROXY, http_proxy for every
# scheme; that is unverified (docs/behaviour.md §3.4), so the conventional per-scheme rule is used. curl
# ignores uppercase HTTP_PROXY (the CGI "httpoxy" hazard); a worker is no CGI script, so it is honoured.
# Empty values count as unset, as in curl and requests.
_PROXY_VARS = {
    "https": ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"),
    "http": ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"),
}


def timeout_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``REQUEST_TIMEOUT`` as whole seconds; unset or not an unsigned integer → 3 (Python would raise)."""
    raw = (os.environ if environ is None else environ).get("REQUEST_TIMEOUT")
    if raw is None or not _U64.fullmatch(raw):
        return DEFAULT_TIMEOUT_S
    digits = raw.lstrip("+").lstrip("0") or "0"
    if len(digits) > 20:  # cannot be a u64; also keeps int() clear of CPython's digit limit
        return DEFAULT_TIMEOUT_S
    value = int(digits)
    return value if value < 2**64 else DEFAULT_TIMEOUT_S


def proxy_for(url: str, environ: Mapping[str, str] | None = None) -> str:
    """The proxy URL to use for `url` ("" for a direct connection), from `environ` (default os.environ)."""
    env = os.environ if environ is None else environ
    if no_proxy_matches(url, no_proxy_from_env(env)):
        return ""
    scheme = "https" if url.startswith("https://") else "http"
    for name in _PROXY_VARS[scheme]:
        value = env.get(name)
        if value:
            return value
    return ""


def http_get(
    url: str, budget: ByteBudget, timeout_s: float, policy: MediaPolicy | None = None, *, cap: int = MAX_FETCH_BYTES
) -> bytes:
    """GET `url` and return the decoded body, charging it to `budget` and capping it at `cap` bytes.

    On failure nothing stays claimed from `budget`. Errors (all MmError):
    status >= 400 → "media fetch: GET {url}: {final url}: status code {code}" (ureq 2's wording);
    timeout → "media fetch: GET {url}: timed out after {t} s ({curl message})";
    body too large → "media fetch: {url}: exceeds {cap} bytes" (67108864 by default);
    budget exhausted → "media fetch: {url}: exceeds the request media byte budget";
    anything else → "media fetch: GET {url}: {curl message} (curl error {code})";
    refused by `policy` → "media fetch: GET {url}: {why}" (or the policy's own message for the first URL).
    """
    transfer = Transfer(url, budget, timeout_s, policy, cap=cap)
    try:
        transfer.curl.perform()
    except pycurl.error as err:
        return transfer.finish(err)
    except BaseException:
        transfer.abandon()
        raise
    return transfer.finish(None)


class Transfer:
    """One configured GET: a Curl handle and its body sink, run by `http_get` or by a CurlMulti.

    The owner runs `curl` (perform, or add it to a multi handle) and then calls `finish` exactly
    once (or `abandon`), which closes the handle and turns the outcome into bytes or an MmError.
    """

    def __init__(
        self,
        url: str,
        budget: ByteBudget,
        timeout_s: float,
        policy: MediaPolicy | None = None,
        *,
        cap: int = MAX_FETCH_BYTES,
    ) -> None:
        check_cap(cap)
        if not timeout_s >= 0:  # also rejects NaN
            raise MmError(f"media fetch: timeout must be a non-negative number of seconds, got {timeout_s}")
        if policy is not None:
            policy.check_url(url)
        self.url = url
        self.policy = policy
        self.refused: str | None = None  # why the policy stopped a connection, if it did
        self.sink = _BodySink(budget, cap)
        self.timeout_ms = min(max(round(timeout_s * 1000), _MIN_TIMEOUT_MS), _MAX_TIMEOUT_MS)
        self.proxy = proxy_for(url)
        curl = pycurl.Curl()
        self.curl = curl
        try:
            _apply_policy(curl, policy)
            if policy is not None:
                self._current_url, self._status = url, 0
                curl.setopt(pycurl.OPENSOCKETFUNCTION, self._open_socket)
                curl.setopt(pycurl.HEADERFUNCTION, self._on_header)
            curl.setopt(pycurl.URL, url)
            curl.setopt(pycurl.NOSIGNAL, 1)  # no SIGALRM-based DNS timeouts: unsafe in threaded hosts
            curl.setopt(pycurl.TIMEOUT_MS, self.timeout_ms)
            # An explicit PROXY (even "") and an empty NOPROXY stop libcurl from consulting the environment
            # itself, so `proxy_for` is the only rule in force.
            curl.setopt(pycurl.PROXY, self.proxy)
            curl.setopt(pycurl.NOPROXY, "")
            curl.setopt(pycurl.ACCEPT_ENCODING, "gzip")
            curl.setopt(pycurl.USERAGENT, "mmworker")
            # Status >= 400 fails before any body byte reaches the sink, so error pages cost no budget.
            curl.setopt(pycurl.FAILONERROR, 1)
            # A declared Content-Length above the cap is refused before the body is read (libcurl >= 8.4
            # also applies it to the bytes received; the sink's own check covers older libcurl).
            curl.setopt(pycurl.MAXFILESIZE_LARGE, cap)
            curl.setopt(pycurl.BUFFERSIZE, CHUNK_BYTES)  # fewer, larger Python callbacks than the 16 KiB default
            curl.setopt(pycurl.WRITEFUNCTION, self.sink.write)
        except BaseException:
            curl.close()
            raise

    def _open_socket(self, purpose: int, address: tuple) -> socket.socket | int:
        """libcurl asks for every socket it connects (each hop, each DNS answer): check the address first."""
        family, socktype, protocol, sockaddr = address
        if not self.proxy:  # through a proxy, the address is the operator's proxy, not the URL's host
            why = self.policy.address_refusal(sockaddr[0])
            if why is not None:
                self.refused = why
                return pycurl.SOCKET_BAD
        return socket.socket(family, socktype, protocol)

    def _on_header(self, line: bytes) -> int | None:
        """Every response header line: a redirect's target must pass the scheme and domain rules before
        libcurl follows it (returning 0 aborts the transfer)."""
        text = line.decode("latin-1").strip()
        if text.startswith("HTTP/"):
            parts = text.split()
            self._status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        elif 300 <= self._status < 400 and text.lower().startswith("location:"):
            target = urllib.parse.urljoin(self._current_url, text.split(":", 1)[1].strip())
            try:
                self.policy.check_url(target)
            except MmError as exc:
                self.refused = f"redirect to {str(exc).removeprefix('media fetch: ')}"
                return 0
            self._current_url = target
        return None

    def finish(self, err: pycurl.error | None) -> bytes:
        """The body, or the MmError for `err` (the transfer's libcurl error, None on success)."""
        try:
            if err is not None:
                self.sink.discard()
                if self.refused is not None:
                    raise MmError(f"media fetch: GET {self.url}: refused by the media policy: {self.refused}") from err
                raise _transfer_error(self.url, self.curl, err, self.sink, self.timeout_ms) from err
            if self.curl.getinfo(pycurl.RESPONSE_CODE) >= 400:  # FAILONERROR covers this; kept so the rule
                self.sink.discard()  # does not hinge on a libcurl option
                raise _status_error(self.url, self.curl)
            return self.sink.take()
        finally:
            self.curl.close()

    def abandon(self) -> None:
        """Drop the transfer unfinished: its claims go back, its handle is closed."""
        self.sink.discard()
        self.curl.close()


def _apply_policy(curl: pycurl.Curl, policy: MediaPolicy | None) -> None:
    """Where a transfer may go: http/https only (for redirects too) and a bounded number of hops.

    PROTOCOLS limits every hop, REDIR_PROTOCOLS says the same for redirects explicitly (libcurl's
    default redirect set includes ftp). Both are the bitmask options: pycurl 7.49 does not expose the
    *_STR variants (libcurl >= 7.85); the bitmask forms are deprecated but still honoured by libcurl 8.
    A media policy narrows the schemes and the hop count; its address and domain checks are the
    transfer's socket and pre-request callbacks.
    """
    schemes = policy.schemes if policy is not None else HTTP_SCHEMES
    allowed = (pycurl.PROTO_HTTP if "http" in schemes else 0) | (pycurl.PROTO_HTTPS if "https" in schemes else 0)
    curl.setopt(pycurl.PROTOCOLS, allowed)
    curl.setopt(pycurl.REDIR_PROTOCOLS, allowed)
    curl.setopt(pycurl.FOLLOWLOCATION, 1)
    curl.setopt(pycurl.MAXREDIRS, policy.max_redirects if policy is not None else MAX_REDIRECTS)


class _BodySink:
    """The write callback's state: bytes received so far, claimed from the budget chunk by chunk.

    The callback never raises (pycurl would print and swallow the exception); it records why it
    stopped and returns 0, which makes libcurl abort with CURLE_WRITE_ERROR.
    """

    __slots__ = ("_budget", "_buf", "_claimed", "cap", "failure", "unexpected")

    def __init__(self, budget: ByteBudget, cap: int = MAX_FETCH_BYTES) -> None:
        self._budget = budget
        self.cap = cap  # bytes this one body may have (the error message names it)
        # BytesIO.getvalue() hands over its buffer without a copy when nothing else holds it, so a
        # body of `cap` bytes peaks near `cap` rather than twice that with a list of chunks plus join().
        self._buf = io.BytesIO()
        self._claimed = 0
        self.failure: str | None = None  # "cap" or "budget"
        self.unexpected: BaseException | None = None

    def write(self, chunk: bytes) -> int | None:
        try:
            n = len(chunk)
            # The body is decoded (gzip) before it gets here, so the caps apply to what we keep.
            if self._claimed + n > self.cap:
                self.failure = "cap"
                return 0
            if not self._budget.claim(n):
                self.failure = "budget"
                return 0
            self._claimed += n
            self._buf.write(chunk)
            return None
        except BaseException as e:  # e.g. MemoryError: report it after perform instead of losing it
            self.unexpected = e
            return 0

    def take(self) -> bytes:
        return self._buf.getvalue()

    def discard(self) -> None:
        """Give back every byte this transfer claimed: a failed source delivers nothing."""
        self._budget.release(self._claimed)
        self._claimed = 0
        self._buf = io.BytesIO()


def _status_error(url: str, curl: pycurl.Curl) -> MmError:
    # ureq 2 reports "{final url}: status code {n}", which upstream wraps as "GET {url}: {e}".
    final_url = curl.getinfo(pycurl.EFFECTIVE_URL)
    return MmError(f"media fetch: GET {url}: {final_url}: status code {curl.getinfo(pycurl.RESPONSE_CODE)}")


def _transfer_error(url: str, curl: pycurl.Curl, err: pycurl.error, sink: _BodySink, timeout_ms: int) -> BaseException:
    code, message = err.args[0], err.args[1] if len(err.args) > 1 else str(err)
    if sink.unexpected is not None:
        return sink.unexpected
    if sink.failure == "cap" or code == pycurl.E_FILESIZE_EXCEEDED:
        return MmError(f"media fetch: {url}: exceeds {sink.cap} bytes")
    if sink.failure == "budget":
        return MmError(f"media fetch: {url}: exceeds the request media byte budget")
    if code == pycurl.E_HTTP_RETURNED_ERROR:
        return _status_error(url, curl)
    if code == pycurl.E_OPERATION_TIMEDOUT:
        return MmError(f"media fetch: GET {url}: timed out after {timeout_ms / 1000:g} s ({message})")
    return MmError(f"media fetch: GET {url}: {message} (curl error {code})")
