"""The image-URL policy (pure) and the fetcher against a local HTTP server: what is allowed,
and every refusal (scheme, host, redirect hop, resolved address, size, time)."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from app import errors
from app.budget import ByteBudget
from app.observability.metrics import Metrics
from app.service.decode.decoder import is_url
from app.service.decode.media import Fetched, MediaFetcher, system_resolver
from app.service.decode.media_policy import (
    MediaPolicy,
    Refused,
    address_kind,
    embedded_ipv4,
)
from app.settings import Settings
from tests.media_server import MediaServer

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 100
ip = ipaddress.ip_address


# ---------------------------------------------------------------------- the policy (pure)
def test_urls_are_told_from_images() -> None:
    assert is_url("https://a.example/x.png") and is_url(" http://a") and is_url("file:///etc")
    assert not is_url("data:image/png;base64,AAAA") and not is_url("iVBORw0KGgo=")
    assert not is_url(b"http://a")


def test_nothing_is_allowed_by_default() -> None:
    policy = MediaPolicy.of([], [])
    assert not policy.enabled
    with pytest.raises(Refused, match="LAD_MEDIA_ALLOWED_DOMAINS is empty"):
        policy.check_url("https", "cdn.example.com", "")


@pytest.mark.parametrize("scheme", ["file", "ftp", "gopher", "data", "javascript", "HTTP"])
def test_only_http_and_https_are_ever_fetched(scheme: str) -> None:
    policy = MediaPolicy.of(["*.example.com", "example.com"], ["0.0.0.0/0"])
    with pytest.raises(Refused, match="never fetched"):
        policy.check_url(scheme, "example.com", "")


def test_hosts_match_exactly_or_under_a_wildcard() -> None:
    policy = MediaPolicy.of(["cdn.example.com", "*.images.test", "127.0.0.1"], [])
    for host in ("cdn.example.com", "CDN.Example.COM.", "a.images.test", "a.b.images.test"):
        assert policy.host_allowed(host), host
    for host in (
        "example.com",
        "x.cdn.example.com",
        "images.test",  # the wildcard is for names under it, not the apex
        "evilimages.test",
        "cdn.example.com.evil.org",
        "127.0.0.2",
    ):
        assert not policy.host_allowed(host), host
    with pytest.raises(Refused, match="not in LAD_MEDIA_ALLOWED_DOMAINS"):
        policy.check_url("https", "example.com", "")
    with pytest.raises(Refused, match="user info"):
        policy.check_url("https", "cdn.example.com", "cdn.example.com")


@pytest.mark.parametrize(
    "entry", ["https://a.com", "a.com/x", "*", "*.", "a.com:443", "u@a.com", "*.*.a.com", "a..com"]
)
def test_allowed_domains_that_are_not_hosts_are_configuration_errors(entry: str) -> None:
    with pytest.raises(ValueError, match="expected a host name"):
        Settings(_env_file=None, media_allowed_domains=[entry])


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("172.16.0.1", "private"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),  # carrier-grade NAT
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("::ffff:127.0.0.1", "loopback (inside an IPv6 address)"),
        ("::ffff:169.254.169.254", "link-local (inside an IPv6 address)"),
        ("2002:7f00:1::", "loopback (inside an IPv6 address)"),  # 6to4 of 127.0.0.1
        ("64:ff9b::a00:1", "private (inside an IPv6 address)"),  # NAT64 of 10.0.0.1
    ],
)
def test_non_public_addresses_are_refused(address: str, kind: str) -> None:
    assert address_kind(ip(address)) == kind
    policy = MediaPolicy.of(["h.test"], [])
    with pytest.raises(Refused, match="not fetched unless it lies in LAD_MEDIA_ALLOWED_NETWORKS"):
        policy.check_addresses("h.test", [ip(address)])


def test_public_addresses_pass_and_one_bad_address_refuses_the_host() -> None:
    policy = MediaPolicy.of(["h.test"], [])
    for address in ("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c", "8.8.8.8"):
        assert address_kind(ip(address)) is None
        policy.check_addresses("h.test", [ip(address)])
    with pytest.raises(Refused, match="loopback"):  # a rebinding answer among good ones
        policy.check_addresses("h.test", [ip("8.8.8.8"), ip("127.0.0.1")])
    with pytest.raises(Refused, match="no address"):
        policy.check_addresses("h.test", [])


def test_allowed_networks_open_exactly_their_ranges() -> None:
    policy = MediaPolicy.of(["h.test"], ["127.0.0.1/32", "10.0.0.0/8"])
    for address in ("127.0.0.1", "10.9.8.7", "::ffff:127.0.0.1"):
        policy.check_addresses("h.test", [ip(address)])
    for address in ("127.0.0.2", "192.168.1.1", "169.254.169.254"):
        with pytest.raises(Refused):
            policy.check_addresses("h.test", [ip(address)])
    assert embedded_ipv4(ip("::ffff:10.0.0.1")) == ip("10.0.0.1")
    assert embedded_ipv4(ip("2606:2800::1")) is None


def test_settings_read_the_media_lists_from_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("LAD_MEDIA_ALLOWED_DOMAINS", "cdn.example.com, *.images.test")
    monkeypatch.setenv("LAD_MEDIA_ALLOWED_NETWORKS", '["10.0.0.0/8", "127.0.0.1"]')
    settings = Settings(_env_file=None)
    assert settings.media_allowed_domains == ["cdn.example.com", "*.images.test"]
    upper = Settings(
        _env_file=None, media_allowed_domains=["CDN.Example.com.", "[::1]", "10.0.0.1"]
    )
    assert upper.media_allowed_domains == ["cdn.example.com", "::1", "10.0.0.1"]
    assert settings.media_allowed_networks == ["10.0.0.0/8", "127.0.0.1/32"]
    defaults = Settings(_env_file=None, media_allowed_domains=[], media_allowed_networks=[])
    assert defaults.media_allowed_domains == [] and defaults.media_allowed_networks == []
    monkeypatch.setenv("LAD_MEDIA_ALLOWED_NETWORKS", "not-a-network")
    with pytest.raises(ValueError, match="CIDR"):
        Settings(_env_file=None)


# ---------------------------------------------------------------------- the fetcher
@pytest.fixture
def server() -> Iterator[MediaServer]:
    with MediaServer() as running:
        yield running


def fetcher(
    resolver: Any = system_resolver, trust: ssl.SSLContext | None = None, **overrides: Any
) -> MediaFetcher:
    values: dict[str, Any] = {
        "media_allowed_domains": ["127.0.0.1"],
        "media_allowed_networks": ["127.0.0.1/32"],
        "media_timeout_s": 2.0,
        **overrides,
    }
    settings = Settings(_env_file=None, **values)
    return MediaFetcher(settings, ByteBudget(64 << 20), Metrics(), resolver, trust)


def fetch(media: MediaFetcher, *urls: str, limit: int = 64 << 20) -> list[Any]:
    async def go() -> list[Any]:
        fetched = Fetched(media.budget, limit, "LAD_MAX_BODY_BYTES")
        try:
            [out] = await media.fetch_all([("images", list(urls))], fetched)
            assert media.budget.used == fetched.held >= sum(len(b) for b in out)
            return out
        finally:
            fetched.release()
            await media.aclose()

    return asyncio.run(go())


def outcome(media: MediaFetcher, name: str) -> float:
    value = media.metrics.media_fetches.labels(outcome=name)._value.get()
    return float(value)


def test_an_allowed_url_is_fetched_and_counted(server: MediaServer) -> None:
    media = fetcher()
    url = server.add("a.png", PNG)
    assert fetch(media, url, url, "data:image/png;base64,AAAA") == [
        PNG,
        PNG,
        "data:image/png;base64,AAAA",
    ]
    assert outcome(media, "ok") == 2 and media.budget.used == 0
    assert media.metrics.media_fetched_bytes._value.get() == 2 * len(PNG)


def test_a_name_is_connected_to_at_the_address_checked(server: MediaServer) -> None:
    """A resolver that names the address: the connection goes there, the Host header keeps
    the name (as TLS keeps it for SNI)."""
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[Any]:
        asked.append(host)
        return [ip("127.0.0.1")]

    media = fetcher(resolver, media_allowed_domains=["images.example.test"])
    server.add("b.png", PNG)
    assert fetch(media, server.url("/img/b.png", "images.example.test")) == [PNG]
    assert asked == ["images.example.test"]
    assert server.requests[-1] == ("/img/b.png", f"images.example.test:{server.port}")


def test_a_name_resolving_to_loopback_is_refused(server: MediaServer) -> None:
    server.add("c.png", PNG)
    media = fetcher(media_allowed_domains=["localhost"], media_allowed_networks=[])
    with pytest.raises(errors.MediaNotAllowed, match="resolves to a loopback address"):
        fetch(media, server.url("/img/c.png", "localhost"))

    async def rebinding(host: str, port: int) -> list[Any]:  # a public and a private answer
        return [ip("93.184.215.14"), ip("127.0.0.1")]

    media = fetcher(
        rebinding, media_allowed_domains=["cdn.example.test"], media_allowed_networks=[]
    )
    with pytest.raises(errors.MediaNotAllowed, match="loopback"):
        fetch(media, server.url("/img/c.png", "cdn.example.test"))
    assert not server.requests  # nothing ever reached the server
    assert outcome(media, "not_allowed") == 1


def test_loopback_needs_both_the_host_and_the_network(server: MediaServer) -> None:
    url = server.add("d.png", PNG)
    with pytest.raises(errors.MediaNotAllowed, match="not fetched unless"):
        fetch(fetcher(media_allowed_networks=[]), url)
    with pytest.raises(errors.MediaNotAllowed, match="not in LAD_MEDIA_ALLOWED_DOMAINS"):
        fetch(fetcher(media_allowed_domains=["localhost"]), url)
    with pytest.raises(errors.MediaNotAllowed, match="is empty"):
        fetch(fetcher(media_allowed_domains=[]), url)
    assert not server.requests


def test_every_redirect_hop_is_checked(server: MediaServer) -> None:
    good = server.add("e.png", PNG)
    media = fetcher()
    assert fetch(media, server.url(f"/redirect?to={good}")) == [PNG]
    # to a host the operator did not name (the metadata service), and to a private address
    # of an allowed name: refused before the hop is requested
    for target in (
        "http://169.254.169.254/latest/meta-data",
        "http://localhost:1/x",
        "file:///etc/passwd",
    ):
        with pytest.raises(errors.MediaNotAllowed, match="a redirect"):
            fetch(fetcher(), server.url(f"/redirect?to={target}"))

    async def resolver(host: str, port: int) -> list[Any]:
        return [ip("127.0.0.1")] if host == "127.0.0.1" else [ip("10.0.0.7")]

    private = fetcher(resolver, media_allowed_domains=["127.0.0.1", "internal.test"])
    with pytest.raises(errors.MediaNotAllowed, match="private address"):
        fetch(private, server.url("/redirect?to=http://internal.test/x.png"))
    loop = server.url("/redirect?to=" + server.url("/redirect?to=" + good))
    with pytest.raises(errors.MediaFetchFailed, match="LAD_MEDIA_MAX_REDIRECTS=1"):
        fetch(fetcher(media_max_redirects=1), server.url("/redirect?to=" + loop))


def test_oversized_bodies_are_refused_declared_or_not(server: MediaServer) -> None:
    server.set_big(100_000)
    media = fetcher(max_image_bytes=50_000)
    with pytest.raises(errors.ImageTooLarge, match="declares 100000 bytes"):
        fetch(media, server.url("/big"))
    with pytest.raises(errors.ImageTooLarge, match="sent over 50000 bytes"):
        fetch(media, server.url("/flood"))
    assert outcome(media, "too_large") == 2 and media.budget.used == 0
    url = server.add("f.png", PNG * 100)  # 10.8 kB each: three are over a 30 kB request total
    with pytest.raises(errors.PayloadTooLarge, match="LAD_MAX_BODY_BYTES"):
        fetch(fetcher(), url, url, url, limit=30_000)


def test_a_slow_body_is_cut_at_the_time_limit(server: MediaServer) -> None:
    media = fetcher(media_timeout_s=0.6)
    with pytest.raises(errors.MediaFetchTimeout, match=r"LAD_MEDIA_TIMEOUT_S=0\.6"):
        fetch(media, server.url("/slow"))
    assert outcome(media, "timeout") == 1


def test_upstream_errors_are_fetch_failures(server: MediaServer) -> None:
    with pytest.raises(errors.MediaFetchFailed, match="HTTP 404"):
        fetch(fetcher(), server.url("/status/404"))
    with pytest.raises(errors.MediaFetchFailed, match="connection"):
        fetch(fetcher(), "http://127.0.0.1:1/x.png")  # nothing listens on port 1


def test_fetches_run_concurrently_within_the_bound(server: MediaServer) -> None:
    server.add("p.png", PNG)
    urls = [server.url("/pause/p.png")] * 12
    assert fetch(fetcher(media_concurrency=3), *urls) == [PNG] * 12
    assert server.most_at_once == 3  # at once, never more than LAD_MEDIA_CONCURRENCY


def test_https_to_the_checked_address_still_verifies_the_name(tmp_path: Any) -> None:
    """The connection goes to the address checked, TLS to the name: a certificate for
    images.example.test is accepted for that name and refused for another name that
    resolves to the same address."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=images.example.test"),
            *("-addext", "subjectAltName=DNS:images.example.test"),
        ],
        check=True,
        capture_output=True,
    )
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)
    trust = ssl.create_default_context(cafile=str(cert))

    async def resolver(host: str, port: int) -> list[Any]:
        return [ip("127.0.0.1")]

    names = ["images.example.test", "other.example.test"]
    with MediaServer(tls=served) as server:
        server.add("t.png", PNG)
        media = fetcher(resolver, trust, media_allowed_domains=names)
        assert fetch(media, server.url("/img/t.png", names[0])) == [PNG]
        with pytest.raises(errors.MediaFetchFailed, match="connection"):
            fetch(
                fetcher(resolver, trust, media_allowed_domains=names),
                server.url("/img/t.png", names[1]),
            )
        with pytest.raises(errors.MediaFetchFailed, match="connection"):  # the system's CAs
            fetch(
                fetcher(resolver, media_allowed_domains=names), server.url("/img/t.png", names[0])
            )
        assert server.requests == [("/img/t.png", f"{names[0]}:{server.port}")]
