"""The media policy: address classes (incl. embedded IPv4), per-hop checks on real connections, local roots."""

import gc
import os

import pytest
from httpserver import MediaServer, SilentListener

from mmworker import MmError
from mmworker.common.budget import ByteBudget
from mmworker.common.fetch import fetch_bytes
from mmworker.common.http import http_get
from mmworker.common.policy import MediaPolicy

SAFE = MediaPolicy.safe()


@pytest.mark.parametrize(
    ("ip", "kind"),
    [("127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.9", "private"), ("172.16.5.5", "private"),
     ("169.254.169.254", "link-local"), ("100.64.1.1", "not globally routable"), ("0.0.0.0", "unspecified"),
     ("224.0.0.1", "multicast"), ("240.0.0.1", "reserved"), ("::1", "loopback"), ("fe80::1%eth0", "link-local"),
     ("fc00::1", "private"), ("::ffff:127.0.0.1", "loopback"), ("64:ff9b::a00:1", "private"),
     ("2002:7f00:1::", "loopback"), ("::", "unspecified")],
)  # fmt: skip
def test_non_public_addresses_are_refused(ip, kind):
    why = SAFE.address_refusal(ip)
    assert why is not None and f"({kind})" in why


@pytest.mark.parametrize("ip", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(ip):
    assert SAFE.address_refusal(ip) is None


def test_allowed_networks_and_allow_private():
    policy = MediaPolicy(allowed_networks=("127.0.0.1/32",))
    assert policy.address_refusal("127.0.0.1") is None
    assert policy.address_refusal("127.0.0.2") is not None
    assert MediaPolicy(allow_private=True).address_refusal("10.0.0.1") is None


def test_scheme_and_domain_rules():
    policy = MediaPolicy(schemes=("https",), allowed_domains=("images.example.com", ".cdn.example"))
    policy.check_url("https://images.example.com/a.jpg")
    policy.check_url("https://x.cdn.example:8443/a.jpg")
    with pytest.raises(MmError, match="scheme 'http' is not allowed"):
        policy.check_url("http://images.example.com/a.jpg")
    with pytest.raises(MmError, match=r"host 'evil.example.com' is not in the allowed domains"):
        policy.check_url("https://evil.example.com/a.jpg")
    with pytest.raises(MmError, match=r"host 'notcdn.example' is not in the allowed domains"):
        policy.check_url("https://notcdn.example/a.jpg")
    with pytest.raises(MmError, match="unsupported scheme"):
        MediaPolicy(schemes=("ftp",))
    with pytest.raises(MmError, match="unknown key"):
        MediaPolicy.from_mapping({"allow_privat": True})


def test_refused_address_gets_no_connection_at_all():
    listener = SilentListener()
    try:
        for host in ("127.0.0.1", "localhost", "2130706433", "127.1"):  # names and IP-literal tricks
            with pytest.raises(MmError, match=r"refused by the media policy: address 127\.0\.0\.1 is not public"):
                http_get(f"http://{host}:{listener.port}/x.jpg", ByteBudget(1 << 20), 2, SAFE)
        assert not listener.was_contacted()
    finally:
        listener.close()


def test_every_redirect_hop_is_checked():
    server = MediaServer()
    try:
        port = server.port
        allow_one = MediaPolicy(allowed_networks=("127.0.0.1/32",))
        assert http_get(server.url("/redirect/2"), ByteBudget(1 << 20), 2, allow_one) == b"landed"
        # A hop to another loopback address is refused at connect time.
        hop = server.url(f"/redirect-to?url=http://127.0.0.2:{port}/redirect/0")
        with pytest.raises(MmError, match=r"refused by the media policy: address 127\.0\.0\.2 is not public"):
            http_get(hop, ByteBudget(1 << 20), 2, allow_one)
        # A hop to a host outside the allowed domains is refused before its request is sent.
        by_name = MediaPolicy(allowed_networks=("127.0.0.1/32",), allowed_domains=("127.0.0.1",))
        hop = server.url(f"/redirect-to?url=http://localhost:{port}/redirect/0")
        with pytest.raises(
            MmError, match=r"refused by the media policy: redirect to .*host .localhost. is not in the allowed"
        ):
            http_get(hop, ByteBudget(1 << 20), 2, by_name)
        with pytest.raises(MmError, match=r"Maximum \(1\) redirects followed"):
            http_get(server.url("/redirect/3"), ByteBudget(1 << 20), 2,
                     MediaPolicy(allowed_networks=("127.0.0.1/32",), max_redirects=1))  # fmt: skip
    finally:
        server.stop()


def test_local_roots(tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    (root / "ok.bin").write_bytes(b"inside")
    (tmp_path / "secret.bin").write_bytes(b"outside")
    os.symlink(tmp_path / "secret.bin", root / "link.bin")
    policy = MediaPolicy(allowed_local_roots=(str(root),))
    assert fetch_bytes(str(root / "ok.bin"), policy=policy) == b"inside"
    assert fetch_bytes(f"file://{root}/ok.bin", policy=policy) == b"inside"
    for escape in (str(root / "link.bin"), f"{root}/../secret.bin", str(tmp_path / "secret.bin")):
        with pytest.raises(MmError, match="outside the allowed local roots"):
            fetch_bytes(escape, policy=policy)
    with pytest.raises(MmError, match="local files are not allowed"):
        fetch_bytes(str(root / "ok.bin"), policy=SAFE)
    assert fetch_bytes(str(tmp_path / "secret.bin")) == b"outside"  # no policy: the crate's behaviour


def test_policy_checked_transfers_leak_no_descriptors():
    server = MediaServer()
    try:
        policy = MediaPolicy(allowed_networks=("127.0.0.1/32",))
        http_get(server.url("/bytes/100"), ByteBudget(1 << 20), 2, policy)  # warm-up: first-use fds
        server.wait_idle()
        gc.collect()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            assert len(http_get(server.url("/redirect/1"), ByteBudget(1 << 20), 2, policy)) == 6
            with pytest.raises(MmError):
                http_get(server.url("/status/404"), ByteBudget(1 << 20), 2, policy)
        server.wait_idle()
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        server.stop()
