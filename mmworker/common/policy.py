"""Where media may come from: the pool's media policy (schemes, domains, addresses, local roots, redirects).

The library's `fetch_bytes` keeps SGLang's permissive behaviour (no policy) for parity; the pool
applies `MediaPolicy.safe()` by default. What it enforces, and where:

- URLs: scheme in `schemes` (http, https; for every redirect hop too), host in `allowed_domains`
  if that list is given (exact name or a subdomain of an entry), at most `max_redirects` hops. A
  redirect's target is checked when its Location header arrives, before libcurl follows it.
- Addresses: every connection libcurl opens, including each redirect hop and each DNS answer it
  tries, is checked on the resolved address right before the socket exists (CURLOPT_OPENSOCKET-
  FUNCTION), so a name that resolves to a private address - or re-resolves to one later (DNS
  rebinding) - is refused without a packet being sent. Refused unless `allow_private`: every
  address that is not globally routable (loopback, RFC 1918, link-local incl. the 169.254.169.254
  metadata service, CGNAT, multicast, reserved, unspecified), also when embedded in IPv6
  (IPv4-mapped, NAT64, 6to4, Teredo). `allowed_networks` re-allows specific networks (e.g. a
  media server on 127.0.0.1). With a proxy, the connection goes to the proxy the operator chose;
  then only the scheme and domain rules apply to the URL.
- Local files (`file://` and absolute paths): refused unless the path, with every symlink
  resolved, lies inside one of `allowed_local_roots` (so `..` and symlinks cannot escape).
"""

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mmworker.common.noproxy import host_matches, url_host_port
from mmworker.errors import MmError

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
HTTP_SCHEMES = ("http", "https")  # all a fetch ever speaks; a policy may narrow them
MAX_REDIRECTS = 5  # ureq 2's default, which sglang-mm relies on


@dataclass(frozen=True)
class MediaPolicy:
    schemes: tuple[str, ...] = HTTP_SCHEMES
    allowed_domains: tuple[str, ...] = ()  # empty: any domain
    allow_private: bool = False
    allowed_networks: tuple[str, ...] = ()
    allowed_local_roots: tuple[str, ...] = ()
    max_redirects: int = MAX_REDIRECTS
    _networks: tuple = field(default=(), init=False, repr=False, compare=False)
    _roots: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bad = [s for s in self.schemes if s not in HTTP_SCHEMES]
        if bad:
            raise MmError(f"media policy: unsupported scheme(s) {bad}; only http and https can be allowed")
        if not isinstance(self.max_redirects, int) or self.max_redirects < 0:
            raise MmError(f"media policy: max_redirects must be a non-negative int, got {self.max_redirects!r}")
        try:
            networks = tuple(ipaddress.ip_network(n, strict=False) for n in self.allowed_networks)
        except ValueError as exc:
            raise MmError(f"media policy: allowed_networks: {exc}") from exc
        object.__setattr__(self, "_networks", networks)
        object.__setattr__(self, "_roots", tuple(os.path.realpath(r) for r in self.allowed_local_roots))
        object.__setattr__(self, "allowed_domains", tuple(d.lower().lstrip(".") for d in self.allowed_domains))

    @classmethod
    def safe(cls) -> "MediaPolicy":
        """The pool's default: http(s) only, no private addresses, no local files, 5 redirects."""
        return cls()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> "MediaPolicy":
        if not data:
            return cls.safe()
        known = {"schemes", "allowed_domains", "allow_private", "allowed_networks", "allowed_local_roots",
                 "max_redirects"}  # fmt: skip
        unknown = sorted(set(data) - known)
        if unknown:
            raise MmError(f"media policy: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**values)

    def to_mapping(self) -> dict[str, Any]:
        return {"schemes": list(self.schemes), "allowed_domains": list(self.allowed_domains),
                "allow_private": self.allow_private, "allowed_networks": list(self.allowed_networks),
                "allowed_local_roots": list(self.allowed_local_roots), "max_redirects": self.max_redirects}  # fmt: skip

    # --- URLs ------------------------------------------------------------------------------------

    def check_url(self, url: str) -> None:
        """Scheme and domain of one URL (the first request, or a redirect hop)."""
        scheme = url.partition("://")[0]
        if scheme.lower() not in self.schemes:
            raise MmError(f"media fetch: {url}: scheme {scheme!r} is not allowed")
        if self.allowed_domains:
            host, _ = url_host_port(url)
            if not any(host_matches(host, d) for d in self.allowed_domains):
                raise MmError(f"media fetch: {url}: host {host!r} is not in the allowed domains")

    def address_refusal(self, ip: str) -> str | None:
        """Why a connection to `ip` is refused, or None if it is allowed."""
        try:
            address = ipaddress.ip_address(ip.split("%", 1)[0])  # drop an IPv6 zone id
        except ValueError:
            return f"address {ip!r} cannot be parsed"
        if any(address in net for net in self._networks if net.version == address.version):
            return None
        if self.allow_private:
            return None
        for candidate in _embedded(address):
            if not candidate.is_global or candidate.is_multicast:
                return f"address {ip} is not public ({_kind(candidate)})"
        return None

    # --- local files -------------------------------------------------------------------------------

    def check_path(self, path: str) -> str:
        """The resolved path if local file `path` may be read; MmError otherwise."""
        if not self._roots:
            raise MmError(f"media fetch: {path}: local files are not allowed")
        real = os.path.realpath(path)
        for root in self._roots:
            if os.path.commonpath([real, root]) == root:
                return real
        raise MmError(f"media fetch: {path}: outside the allowed local roots")


def _embedded(address: IpAddress) -> list[IpAddress]:
    """The addresses to judge: an IPv4-mapped IPv6 address is its IPv4 address; other IPv6 forms that
    carry an IPv4 address (NAT64, 6to4, Teredo) are judged both ways, the carried address first."""
    if isinstance(address, ipaddress.IPv4Address):
        return [address]
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    out: list[IpAddress] = []
    if address.sixtofour is not None:
        out.append(address.sixtofour)
    if address.teredo is not None:
        out.extend(address.teredo)
    if address in _NAT64:
        out.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [*out, address]


def _kind(address: IpAddress) -> str:
    for name in ("loopback", "unspecified", "link_local", "multicast", "reserved", "private"):
        if getattr(address, f"is_{name}", False):
            return name.replace("_", "-")
    return "not globally routable"
