"""Which image URLs the service may fetch: a pure allow/deny policy, no I/O.

Two checks, both refusing by default (what vLLM learned the hard way: its #24981, #26035,
#57157 and CVE-2025-6242 were a fetcher that followed redirects into the private network,
or checked a name and then connected to what it resolved to next):

- ``check_url``, on every URL and on every redirect hop before it is requested: http or
  https only (``file://`` and every other scheme never), no user info (``a@b`` reads as
  host ``b``), and a host the operator named in LAD_MEDIA_ALLOWED_DOMAINS (empty by
  default: nothing is fetched). An entry ``cdn.example.com`` allows that host only;
  ``*.example.com`` allows every name under ``example.com`` (not ``example.com`` itself).
- ``check_address``, on every address a host resolves to, at the moment the connection is
  made to it (app/service/decode/media.py): an address that is not globally routable
  (private, loopback, link-local, multicast, reserved, unspecified, shared, documentation,
  and the IPv4 address inside an IPv4-mapped, 6to4, Teredo or NAT64 IPv6 address) is
  refused unless it lies in one of LAD_MEDIA_ALLOWED_NETWORKS.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")
"""The only URL schemes ever fetched."""
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class Refused(ValueError):
    """A URL or an address the policy does not allow; the message is for the client (it
    names the setting that would allow it, never a resolved address)."""


def normalise_host(host: str) -> str:
    """A host as compared: lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().strip("[]").rstrip(".").lower()


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (IPv4-mapped, 6to4, Teredo's client,
    NAT64's well-known prefix), which is where a packet to it ends up."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_kind(address: IPAddress) -> str | None:
    """Why an address is not public (None: it is globally routable), for the message."""
    inner = embedded_ipv4(address)
    if inner is not None:
        kind = address_kind(inner)
        return None if kind is None else f"{kind} (inside an IPv6 address)"
    for kind, flag in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
    ):
        if flag:
            return kind
    return None if address.is_global else "non-public"


@dataclass(frozen=True)
class MediaPolicy:
    """The operator's allow-lists (LAD_MEDIA_ALLOWED_DOMAINS, LAD_MEDIA_ALLOWED_NETWORKS,
    whose entries the settings checked)."""

    domains: tuple[str, ...] = ()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def of(cls, domains: Iterable[str], networks: Iterable[str]) -> MediaPolicy:
        return cls(
            tuple(dict.fromkeys(normalise_host(d) for d in domains if d.strip())),
            tuple(ipaddress.ip_network(n.strip(), strict=False) for n in networks if n.strip()),
        )

    @property
    def enabled(self) -> bool:
        """Whether any URL may be fetched at all."""
        return bool(self.domains)

    def host_allowed(self, host: str) -> bool:
        host = normalise_host(host)
        for entry in self.domains:
            if entry.startswith("*."):
                if host.endswith(entry[1:]) and len(host) > len(entry) - 1:
                    return True
            elif host == entry:
                return True
        return False

    def check_url(self, scheme: str, host: str, userinfo: str) -> None:
        """One URL (or redirect hop) before it is requested: scheme, user info, host."""
        if scheme not in SCHEMES:
            raise Refused(f"the scheme {scheme[:16]!r} is never fetched (http and https only)")
        if not self.enabled:
            raise Refused(
                "the service fetches no image URL: LAD_MEDIA_ALLOWED_DOMAINS is empty (send the "
                "image itself, as data:image/<type>;base64,<data> or bare base64, or ask the "
                "operator to allow the host)"
            )
        if userinfo:
            raise Refused("a URL with user info (user@host) is never fetched")
        if not host or not self.host_allowed(host):
            raise Refused(
                f"the host {normalise_host(host)[:100]!r} is not in LAD_MEDIA_ALLOWED_DOMAINS"
            )

    def address_allowed(self, address: IPAddress) -> bool:
        if any(address in net for net in self.networks):
            return True
        inner = embedded_ipv4(address)
        if inner is not None and any(inner in net for net in self.networks):
            return True
        return address_kind(address) is None

    def check_addresses(self, host: str, addresses: Sequence[IPAddress]) -> None:
        """Every address ``host`` resolved to: one that is not allowed refuses the host
        (a name that resolves to a public and a private address is refused too)."""
        if not addresses:
            raise Refused(f"the host {normalise_host(host)[:100]!r} resolves to no address")
        for address in addresses:
            if not self.address_allowed(address):
                raise Refused(
                    f"the host {normalise_host(host)[:100]!r} resolves to a "
                    f"{address_kind(address)} address, which is not fetched unless it lies in "
                    "LAD_MEDIA_ALLOWED_NETWORKS"
                )
