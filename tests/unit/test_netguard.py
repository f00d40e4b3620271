"""The address guard's decisions, as pure functions: nothing here opens a socket."""

from __future__ import annotations

import ipaddress

import pytest

from flowforge.errors import FlowForgeError
from flowforge.steps import netguard
from flowforge.steps.netguard import (
    Allowlist,
    NotSent,
    RequestInvalid,
    RequestRefused,
    SentNoResponse,
    refusal_reason,
)

EMPTY = Allowlist.parse("")

REFUSED = [
    "127.0.0.1",
    "127.255.0.9",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "169.254.169.254",
    "100.64.0.1",
    "0.0.0.0",
    "0.1.2.3",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "240.0.0.1",
    "198.18.0.1",
    "198.19.255.1",
    "192.0.2.1",
    "198.51.100.7",
    "203.0.113.9",
    "192.0.0.8",
    "::1",
    "::",
    "fc00::1",
    "fd12::1",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "2001:db8::1",
    "3fff::1",
    "100::1",
    "4000::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::7f00:1",
    "::a00:1",
    "64:ff9b::7f00:1",
    "64:ff9b::a00:1",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::808:808",
    "2002:7f00:1::",
    "2002:a00:1::",
    "2002:a9fe:a9fe::1",
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1
]

ALLOWED = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "2606:4700::1111",
    "2a00:1450:4001:82b::200e",
    "64:ff9b::808:808",
    "::ffff:8.8.8.8",
    "2002:808:808::1",
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, client 8.8.8.8
]


@pytest.mark.parametrize("text", REFUSED)
def test_non_global_addresses_are_refused(text: str) -> None:
    assert refusal_reason(ipaddress.ip_address(text), EMPTY)


@pytest.mark.parametrize("text", ALLOWED)
def test_global_addresses_are_allowed(text: str) -> None:
    assert refusal_reason(ipaddress.ip_address(text), EMPTY) is None


def test_reason_names_the_embedded_ipv4() -> None:
    reason = refusal_reason(ipaddress.ip_address("::ffff:127.0.0.1"), EMPTY)
    assert reason == "loopback (embedded IPv4 127.0.0.1)"


def test_cidr_entries_allow_only_their_networks() -> None:
    allow = Allowlist.parse("10.0.0.0/8, fd00::/8, 127.0.0.1")
    assert refusal_reason(ipaddress.ip_address("10.1.2.3"), allow) is None
    assert refusal_reason(ipaddress.ip_address("fd12::1"), allow) is None
    assert refusal_reason(ipaddress.ip_address("127.0.0.1"), allow) is None
    assert refusal_reason(ipaddress.ip_address("127.0.0.2"), allow)
    assert refusal_reason(ipaddress.ip_address("192.168.1.1"), allow)
    assert refusal_reason(ipaddress.ip_address("fe80::1"), allow)


def test_embedded_forms_are_not_allowed_by_an_ipv4_entry() -> None:
    allow = Allowlist.parse("127.0.0.1")
    assert refusal_reason(ipaddress.ip_address("::ffff:127.0.0.1"), allow)


def test_ipv6_network_never_matches_an_ipv4_address() -> None:
    allow = Allowlist.parse("::/0")
    assert refusal_reason(ipaddress.ip_address("::1"), allow) is None
    assert refusal_reason(ipaddress.ip_address("127.0.0.1"), allow)


def test_hostname_entries_allow_by_url_host() -> None:
    allow = Allowlist.parse("Internal.Example, metrics.corp.")
    loopback = ipaddress.ip_address("127.0.0.1")
    assert refusal_reason(loopback, allow, "internal.example") is None
    assert refusal_reason(loopback, allow, "INTERNAL.example.") is None
    assert refusal_reason(loopback, allow, "metrics.corp") is None
    assert refusal_reason(loopback, allow, "other.example")
    assert refusal_reason(loopback, allow, "sub.internal.example")
    assert refusal_reason(loopback, allow)


def test_parse_collects_hosts_and_networks() -> None:
    allow = Allowlist.parse(" a.example ,, 10.0.0.0/8,::1 ,")
    assert allow.hosts == frozenset({"a.example"})
    assert allow.networks == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1"))
    assert Allowlist.parse("  ") == Allowlist()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("10.0.0.1/33", "10.0.0.1/33"),
        ("10.0.0.1/8", "host bits set"),
        ("fe80::1::2", "fe80::1::2"),
        ("http://a.example", "not an IP address"),
        ("*.example.com", "no wildcards"),
        ("exa mple.com", "not an IP address"),
        ("-bad.example", "not an IP address"),
        ("1.2.3.999", "not an IP address"),
        ("2130706433", "not an IP address"),
        ("a" * 64 + ".example", "not an IP address"),
    ],
)
def test_parse_rejects_bad_entries(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="FLOWFORGE_HTTP_ALLOW") as info:
        Allowlist.parse(f"ok.example, {text}")
    assert fragment in str(info.value)


def test_error_hierarchy() -> None:
    assert issubclass(RequestRefused, NotSent)
    assert issubclass(NotSent, FlowForgeError)
    assert issubclass(SentNoResponse, FlowForgeError)
    assert not issubclass(SentNoResponse, NotSent)


# Issue 5 lists "IPv4-mapped and NAT64 forms of those": every refused IPv4 class, wrapped.
EMBEDDED = {
    "private": "192.168.0.1",
    "private-172": "172.16.0.1",
    "cgnat": "100.64.0.1",
    "link-local": "169.254.169.254",
    "multicast": "224.0.0.1",
    "this-network": "0.0.0.0",
    "broadcast": "255.255.255.255",
}


@pytest.mark.parametrize("inner", EMBEDDED.values(), ids=EMBEDDED.keys())
@pytest.mark.parametrize("wrap", ["mapped", "nat64"])
def test_embedded_forms_inherit_the_ipv4_verdict(inner: str, wrap: str) -> None:
    packed = int(ipaddress.IPv4Address(inner))
    base = 0xFFFF << 32 if wrap == "mapped" else int(ipaddress.IPv6Address("64:ff9b::"))
    address = ipaddress.IPv6Address(base | packed)
    reason = refusal_reason(address, EMPTY)
    assert reason is not None and reason.endswith(f"(embedded IPv4 {inner})"), (address, reason)


def test_cloud_metadata_over_ipv6_is_refused() -> None:
    """AWS serves instance metadata on fd00:ec2::254, a unique-local address."""
    assert refusal_reason(ipaddress.ip_address("fd00:ec2::254"), EMPTY) == "unique local (fc00::/7)"


# Names getaddrinfo cannot IDNA-encode: it raised UnicodeError, which no caller expected,
# so the step stayed running. Each fails that encoding before any query or socket exists.
UNENCODABLE = {
    "empty label": "a..example.com",
    "leading dot": ".example.com",
    "two trailing dots": "example.com..",
    "64-character label": "a" * 64 + ".example.com",
    "64-character last label": "example." + "b" * 64,
}


@pytest.mark.parametrize("host", UNENCODABLE.values(), ids=UNENCODABLE.keys())
def test_hosts_dns_cannot_carry_are_invalid_requests(host: str) -> None:
    with pytest.raises(RequestInvalid, match="is not a valid DNS name") as invalid:
        netguard.send(
            "POST", f"http://{host}/hook", headers={}, body=b"{}", timeout_s=1, allow=EMPTY
        )
    assert repr(host) in str(invalid.value)


def test_a_name_too_long_for_dns_is_an_invalid_request() -> None:
    with pytest.raises(RequestInvalid, match="is not a valid DNS name"):
        netguard._parse_target("GET", "http://" + "a." * 127 + "com/")


def test_an_invalid_host_of_a_secret_holding_url_is_not_named() -> None:
    with pytest.raises(RequestInvalid) as invalid:
        netguard._parse_target("GET", "http://tok..example.com/", reveal=False)
    assert "tok" not in str(invalid.value) and "the URL's host" in str(invalid.value)


@pytest.mark.parametrize(
    "host", ["a" * 63 + ".example.com", "example.com.", "127.0.0.1", "[::1]", "xn--bcher-kva.de"]
)
def test_hosts_dns_can_carry_are_parsed(host: str) -> None:
    assert netguard._parse_target("GET", f"http://{host}/").host == host.strip("[]")


@pytest.mark.parametrize("host", UNENCODABLE.values(), ids=UNENCODABLE.keys())
def test_a_name_the_resolver_cannot_encode_is_not_sent(host: str) -> None:
    """Defence in depth behind _parse_target: the encoding error says nothing left."""
    target = netguard._Target("GET", "http", host, 80, "/")
    with pytest.raises(NotSent, match="DNS resolution failed") as failed:
        netguard._resolve(target)
    assert not isinstance(failed.value, RequestInvalid)
