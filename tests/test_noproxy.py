"""NO_PROXY matching and URL host extraction (docs/behaviour.md §3.5, vectors TV-N1..N4)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmworker.common.noproxy import no_proxy_from_env, no_proxy_matches, url_host_port


def _matches(host_and_port: str, no_proxy: str) -> bool:
    return no_proxy_matches(f"http://{host_and_port}/img.png", no_proxy)


# --- TV-N1..N4, verbatim -------------------------------------------------------------------------


def test_tv_n1_suffix_and_exact_entries_trimmed_and_dot_stripped():
    no_proxy = " .internal ,localhost"
    assert _matches("images.internal", no_proxy)
    assert _matches("internal", no_proxy)
    assert _matches("localhost", no_proxy)
    assert not _matches("notinternal", no_proxy)


@pytest.mark.parametrize("no_proxy", ["", " , "])
def test_tv_n2_empty_lists_match_nothing(no_proxy):
    for host in ("localhost", "images.internal", "10.1.2.3", "a"):
        assert not _matches(host, no_proxy)


def test_tv_n3_ipv4_cidr():
    assert _matches("10.1.2.3", "10.0.0.0/8")
    assert not _matches("11.1.2.3", "10.0.0.0/8")
    assert not _matches("example.com", "10.0.0.0/8")
    for ip in ("0.0.0.0", "1.2.3.4", "127.0.0.1", "255.255.255.255"):
        assert _matches(ip, "0.0.0.0/0")


def test_tv_n4_host_port_needs_that_explicit_port():
    assert no_proxy_matches("https://img.internal:8443/a.png", "internal:8443")
    assert not no_proxy_matches("http://img.internal:80/a.png", "internal:8443")
    assert not no_proxy_matches("https://img.internal/a.png", "internal:8443")


# --- further rules -------------------------------------------------------------------------------


def test_star_matches_everything_even_among_other_entries():
    assert no_proxy_matches("http://anything.example/x", "*")
    assert no_proxy_matches("http://10.9.8.7:1234/x", "foo, *")
    assert not no_proxy_matches("http://anything.example/x", "*.example")  # not a glob


def test_matching_is_case_insensitive_on_both_sides():
    assert no_proxy_matches("http://IMG.Example.COM/x", "example.com")
    assert no_proxy_matches("http://img.example.com/x", "EXAMPLE.Com")


def test_cidr_never_matches_a_hostname_spelled_like_the_network():
    assert not _matches("10.0.0.0", "10.0.0.0/33")  # not a CIDR (prefix > 32): plain entry, no match
    assert not no_proxy_matches("http://10.0.0.0.nip.io/x", "10.0.0.0/8")
    assert _matches("10.0.0.0", "10.0.0.0/32")
    assert not _matches("10.0.0.1", "10.0.0.0/32")


def test_cidr_with_port_in_url_still_matches():
    assert _matches("127.0.0.1:8080", "127.0.0.0/8")


def test_host_port_entry_with_ip_and_ipv6():
    assert _matches("127.0.0.1:8080", "127.0.0.1:8080")
    assert not _matches("127.0.0.1:8081", "127.0.0.1:8080")
    assert no_proxy_matches("http://[::1]:8080/x", "[::1]:8080")
    assert no_proxy_matches("http://[::1]/x", "::1")  # bare IPv6 is a plain entry, not host:port
    assert not no_proxy_matches("http://[::2]/x", "::1")


def test_suffix_match_needs_a_dot_boundary():
    assert _matches("a.b.example.com", "example.com")
    assert not _matches("badexample.com", "example.com")


def test_userinfo_query_and_fragment_do_not_leak_into_the_host():
    assert no_proxy_matches("http://user:pw@internal.corp/x", "corp")
    assert not no_proxy_matches("http://evil.com/?next=internal.corp", "internal.corp")
    assert not no_proxy_matches("http://evil.com#@internal.corp", "internal.corp")
    assert no_proxy_matches("http://a@b@internal.corp/x", "internal.corp")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://Example.COM/x", ("example.com", None)),
        ("https://example.com:8443/x?y#z", ("example.com", 8443)),
        ("http://user:pass@host:99", ("host", 99)),
        ("http://[2001:DB8::1]:8080/x", ("2001:db8::1", 8080)),
        ("http://[::1]/x", ("::1", None)),
        ("http://host:/x", ("host", None)),
        ("http://host:abc/x", ("host", None)),
        ("http://host:99999/x", ("host", None)),
        ("http://host?x=1:2", ("host", None)),
        ("http://host#frag:5", ("host", None)),
        ("host.example:81", ("host.example", 81)),
        ("http://[::1", ("::1", None)),
        ("", ("", None)),
    ],
)
def test_url_host_port(url, expected):
    assert url_host_port(url) == expected


def test_no_proxy_from_env_lowercase_first_even_when_empty():
    assert no_proxy_from_env({"no_proxy": "a", "NO_PROXY": "b"}) == "a"
    assert no_proxy_from_env({"NO_PROXY": "b"}) == "b"
    assert no_proxy_from_env({"no_proxy": "", "NO_PROXY": "b"}) == ""
    assert no_proxy_from_env({}) == ""


# --- properties ----------------------------------------------------------------------------------

_hostnames = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z0-9]{1,8}){0,3}", fullmatch=True)


@given(st.text(), st.text())
def test_never_raises_on_arbitrary_text(url, no_proxy):
    assert isinstance(no_proxy_matches(url, no_proxy), bool)
    host, port = url_host_port(url)
    assert host == host.lower()
    assert port is None or 0 <= port <= 65535


@given(
    st.text(alphabet="0123456789.:/[]@,*- abcxyz", max_size=40),
    st.text(alphabet="0123456789./:,* ", max_size=40),
)
def test_never_raises_on_address_like_text(url, no_proxy):
    no_proxy_matches("http://" + url, no_proxy)


@given(_hostnames, st.lists(_hostnames, max_size=4))
def test_own_host_always_matches_and_empty_entries_are_ignored(host, others):
    entries = [*others, host.upper(), "", " "]
    assert no_proxy_matches(f"http://{host}/x", " , ".join(entries))
    assert no_proxy_matches(f"http://sub.{host}:8080/x", "." + host)


@given(_hostnames, _hostnames)
def test_match_implies_equal_or_dot_suffix(host, entry):
    if no_proxy_matches(f"http://{host}/x", entry):
        assert host == entry or host.endswith("." + entry)


@given(st.ip_addresses(v=4), st.integers(0, 32))
def test_cidr_agrees_with_ipaddress(ip, prefix):
    import ipaddress

    network = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    assert no_proxy_matches(f"http://{ip}/x", f"{network.network_address}/{prefix}")
    outside = network.broadcast_address + 1 if network.broadcast_address.packed != b"\xff" * 4 else None
    if outside is not None:
        assert not no_proxy_matches(f"http://{outside}/x", str(network))
