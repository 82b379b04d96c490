"""NO_PROXY matching: which URLs bypass the proxy, as pure functions of a URL and a NO_PROXY string.

The rules are those of sglang-mm (docs/behaviour.md §3.5), which in turn follow Python `requests`:

- entries are split on commas, trimmed, stripped of leading dots and lowercased; empty entries are ignored;
- an entry ``*`` matches every URL;
- an IPv4 CIDR entry ``a.b.c.d/n`` (n <= 32) matches IPv4-literal hosts inside the network, never hostnames;
- a ``host:port`` entry (all-digit port) matches only URLs that carry that port explicitly;
- any other entry matches when the host equals it or ends with ``"." + entry``.

Nothing here reads the environment except `no_proxy_from_env`, which takes the mapping as an argument.
"""

import ipaddress
import re
from collections.abc import Mapping

# Dotted-quad CIDR only: ipaddress alone would also accept netmask forms ("10.0.0.0/255.0.0.0") and
# bare addresses, which the upstream rule does not treat as networks.
_CIDR = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}/[0-9]{1,2}", re.ASCII)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def url_host_port(url: str) -> tuple[str, int | None]:
    """The lowercased host of `url` and its explicit port (None when the URL names no port).

    Host: the text after ``scheme://`` (the whole string when there is no scheme) up to the first
    ``/``, ``?`` or ``#``, without userinfo, with ``[IPv6]`` brackets removed and ``:port`` split off.
    A port that is empty, not all digits or above 65535 counts as absent. Never raises.
    """
    _, sep, rest = url.partition("://")
    if not sep:
        rest = url
    end = len(rest)
    for stop in "/?#":
        idx = rest.find(stop)
        if idx != -1 and idx < end:
            end = idx
    authority = rest[:end].rpartition("@")[2]  # the last '@' ends the userinfo, as in urllib
    if authority.startswith("["):
        close = authority.find("]")
        if close != -1:
            host, tail = authority[1:close], authority[close + 1 :]
            port_text = tail[1:] if tail.startswith(":") else ""
        else:  # unterminated bracket: keep the text, there is no port to find
            host, port_text = authority[1:], ""
    else:
        host, colon, port_text = authority.rpartition(":")
        if not colon:
            host, port_text = authority, ""
    return host.lower(), _parse_port(port_text)


def no_proxy_matches(url: str, no_proxy: str) -> bool:
    """True when `url` must bypass the proxy under the NO_PROXY value `no_proxy`. Never raises."""
    host, port = url_host_port(url)
    host_ip = _ipv4(host)
    for raw in no_proxy.split(","):
        entry = raw.strip().lstrip(".").lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if _CIDR.fullmatch(entry):
            network = _ipv4_network(entry)
            if network is not None:
                # A CIDR never matches a hostname, even one spelled like the network address.
                if host_ip is not None and host_ip in network:
                    return True
                continue
        entry_host, entry_port = _split_entry_port(entry)
        if entry_port is not None:
            if port == entry_port and host_matches(host, entry_host):
                return True
            continue
        if host_matches(host, entry):
            return True
    return False


def no_proxy_from_env(environ: Mapping[str, str]) -> str:
    """The NO_PROXY value in force: lowercase ``no_proxy`` if set (even empty), else ``NO_PROXY``, else ""."""
    value = environ.get("no_proxy")
    if value is None:
        value = environ.get("NO_PROXY")
    return value or ""


def host_matches(host: str, entry: str) -> bool:
    """`host` is `entry` or a subdomain of it."""
    return host == entry or host.endswith("." + entry)


def _split_entry_port(entry: str) -> tuple[str, int | None]:
    """``host:port`` → (host, port); anything else (incl. bare IPv6 such as ``::1``) → (entry, None)."""
    if entry.startswith("["):
        close = entry.find("]")
        if close != -1 and entry[close + 1 : close + 2] == ":":
            port = _parse_port(entry[close + 2 :])
            if port is not None:
                return entry[1:close], port
        return entry, None
    host, colon, port_text = entry.rpartition(":")
    # A second ':' in the host part means an unbracketed IPv6 literal, not host:port.
    if not colon or ":" in host:
        return entry, None
    port = _parse_port(port_text)
    return (host, port) if port is not None else (entry, None)


def _parse_port(text: str) -> int | None:
    # The length guard keeps int() away from CPython's digit limit on hostile input.
    if not _DIGITS.fullmatch(text) or len(text.lstrip("0")) > 5:
        return None
    port = int(text)
    return port if port <= 65535 else None


def _ipv4(host: str) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        return None


def _ipv4_network(entry: str) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(entry, strict=False)
    except ValueError:  # octet > 255, prefix > 32, leading zeros
        return None
