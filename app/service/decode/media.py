"""The media fetch of the decode stage: a request's ``http(s)`` image URLs to their bytes,
only where the operator allows it (``app.service.decode.media_policy``), at bounded cost.

Off unless LAD_MEDIA_ALLOWED_DOMAINS names hosts: a URL is then refused (400
``media_not_allowed``) before anything leaves the service. When on, every URL and every
redirect hop (followed here, one at a time, at most LAD_MEDIA_MAX_REDIRECTS) is checked
against the policy before it is requested, and the host is resolved and every address
checked by the network backend at the moment it connects, to the checked address itself
(httpcore's connection pool over ``_CheckedBackend``): no second lookup that a DNS
rebinding could answer otherwise, and TLS still verifies the certificate against the name
(SNI, Host header unchanged). A body is read within LAD_MAX_IMAGE_BYTES (its
Content-Length first, then the bytes as they arrive) and the whole fetch, redirects
included, within LAD_MEDIA_TIMEOUT_S; a request's fetched images within its body limit (what
they would weigh sent inline). The bytes are charged to the replica's byte budget
(``app.budget``) as they arrive and stay charged until the request ends. At most
LAD_MEDIA_CONCURRENCY fetches run at once on the replica.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence

import httpcore
import httpx

from app import errors
from app.budget import ACCOUNT, Account, ByteBudget
from app.observability.metrics import Metrics
from app.service.decode.decoder import ImageInput, is_url
from app.service.decode.media_policy import IPAddress, MediaPolicy, Refused
from app.settings import Settings

log = logging.getLogger(__name__)

REDIRECTS = frozenset({301, 302, 303, 307, 308})
RESERVE_STEP = 256 * 1024
"""Bytes reserved in the budget at a time while a body of unknown length arrives."""
_USER_AGENT = b"lad-serve-media/1"

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
"""Host name and port -> every address it resolves to (injectable for tests)."""


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The system's resolver (getaddrinfo, off the event loop), every address it gives."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise errors.MediaFetchFailed(f"the host {host[:100]!r} could not be resolved") from exc
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to addresses the policy allows: resolves the host once, checks every
    address, connects to a checked one (the TLS layer above still uses the host name)."""

    def __init__(self, policy: MediaPolicy, resolver: Resolver) -> None:
        self.policy, self.resolver = policy, resolver
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self.resolver(host, port)
        try:
            self.policy.check_addresses(host, addresses)
        except Refused as exc:
            log.info("media fetch refused: %s resolves to %s", host, [str(a) for a in addresses])
            raise errors.MediaNotAllowed(str(exc)) from None
        failure: Exception | None = None
        for address in addresses:  # every one checked above; the first that answers
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise errors.MediaNotAllowed("unix sockets are never fetched")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class Fetched:
    """What one request's fetches hold: the bytes charged to the budget (released when the
    request ends) and the request's running total, within its limit."""

    def __init__(self, budget: ByteBudget, limit: int, limit_name: str) -> None:
        self.limit, self.limit_name = limit, limit_name
        # the request's own account (one per request); an account of its own outside one
        self.account = ACCOUNT.get() or Account(budget)
        self.held = 0  # charged to the account
        self.total = 0  # bytes received

    async def charge(self, n: int, what: str) -> None:
        """``n`` more bytes received (or announced): within the request's limit, reserved
        in the budget in steps."""
        self.total += n
        if self.total > self.limit:
            raise errors.PayloadTooLarge(
                f"the images fetched for this request are over {self.limit} bytes in all "
                f"({self.limit_name}, what they could weigh sent in the body)"
            )
        if self.total > self.held:
            step = max(self.total - self.held, RESERVE_STEP)
            # an entry, like the body it stands in for: within capacity - headroom, so the
            # request's pixels still fit once its images arrive
            self.held += await self.account.admit(step, what)

    def release(self) -> None:
        self.account.give_back(self.held)
        self.held = 0


class MediaFetcher:
    """The replica's fetcher: its policy, its connection pool and its bound on fetches."""

    def __init__(
        self,
        settings: Settings,
        budget: ByteBudget,
        metrics: Metrics,
        resolver: Resolver = system_resolver,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``resolver`` and ``ssl_context`` (the trusted certificates: the system's by
        default) are for tests."""
        self.settings, self.budget, self.metrics = settings, budget, metrics
        self.policy = MediaPolicy.of(
            settings.media_allowed_domains, settings.media_allowed_networks
        )
        self.resolver = resolver
        self._ssl = ssl_context
        self._pool: httpcore.AsyncConnectionPool | None = None
        self._slots: asyncio.Semaphore | None = None

    def _connections(self) -> httpcore.AsyncConnectionPool:
        if self._pool is None:  # built on the event loop that uses it
            self._pool = httpcore.AsyncConnectionPool(
                ssl_context=self._ssl or ssl.create_default_context(),
                max_connections=self.settings.media_concurrency,
                keepalive_expiry=5.0,
                network_backend=_CheckedBackend(self.policy, self.resolver),
            )
            self._slots = asyncio.Semaphore(self.settings.media_concurrency)
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None

    # ------------------------------------------------------------------ a request
    async def fetch_all(
        self, groups: Sequence[tuple[str, Sequence[ImageInput]]], fetched: Fetched
    ) -> list[list[ImageInput]]:
        """Each group's inputs (``where`` names the field, for messages) with every URL
        replaced by the bytes fetched from it. Every URL is checked first (a refused one
        refuses the request before anything is fetched), then all are fetched concurrently
        within the replica's bound; the first failure cancels the others and is raised."""
        out = [list(inputs) for _, inputs in groups]
        urls = {
            (g, i): self.checked(str(value), f"{where}[{i}]")
            for g, (where, inputs) in enumerate(groups)
            for i, value in enumerate(inputs)
            if is_url(value)
        }
        tasks = {
            asyncio.ensure_future(self.fetch(url, f"{groups[g][0]}[{i}]", fetched)): (g, i)
            for (g, i), url in urls.items()
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in tasks if t in done and t.exception() is not None]
            if failed:  # the first in input order among those that failed
                raise min(failed, key=tasks.__getitem__).exception()  # type: ignore[misc]
            for task, (g, i) in tasks.items():
                out[g][i] = task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return out

    def checked(self, text: str, where: str) -> httpx.URL:
        """A URL the policy allows, before any lookup or connection; a refusal is counted."""
        try:
            try:
                url = httpx.URL(text.strip())
            except (httpx.InvalidURL, ValueError):
                raise errors.MediaNotAllowed(f"{where} is not a valid URL") from None
            return self._allowed(url, where)
        except errors.MediaNotAllowed:
            self.metrics.media_fetches.labels(outcome="not_allowed").inc()
            raise

    def _allowed(self, url: httpx.URL, where: str) -> httpx.URL:
        """``url`` if the policy allows its scheme, user info and host (the URL sent, and
        every redirect hop)."""
        try:
            host = url.raw_host.decode("ascii")  # IDNA-encoded, as the settings hold names
            self.policy.check_url(url.scheme, host, url.userinfo.decode("ascii", "replace"))
        except Refused as exc:
            raise errors.MediaNotAllowed(f"{where}: {exc}") from None
        return url

    async def fetch(self, url: httpx.URL, where: str, fetched: Fetched) -> bytes:
        """One checked URL to its bytes, redirects followed and checked hop by hop; counted
        under its outcome (a fetch cancelled because another failed is not counted)."""
        outcome: str | None = "failed"
        try:
            data = await self._fetch(url, where, fetched)
            outcome = "ok"
            self.metrics.media_fetched_bytes.inc(len(data))
            return data
        except asyncio.CancelledError:
            outcome = None
            raise
        except errors.MediaNotAllowed:
            outcome = "not_allowed"
            raise
        except errors.MediaFetchTimeout:
            outcome = "timeout"
            raise
        except (errors.ImageTooLarge, errors.PayloadTooLarge):
            outcome = "too_large"
            raise
        finally:
            if outcome is not None:
                self.metrics.media_fetches.labels(outcome=outcome).inc()

    async def _fetch(self, url: httpx.URL, where: str, fetched: Fetched) -> bytes:
        pool = self._connections()
        assert self._slots is not None
        limit_s = self.settings.media_timeout_s
        async with self._slots:
            try:
                async with asyncio.timeout(limit_s):
                    for _ in range(self.settings.media_max_redirects + 1):
                        data, location = await self._get(pool, url, where, fetched)
                        if location is None:
                            return data
                        url = self._allowed(location, f"{where} (a redirect)")
            except TimeoutError:
                raise errors.MediaFetchTimeout(
                    f"{where}: the image did not arrive within LAD_MEDIA_TIMEOUT_S={limit_s:g} s"
                ) from None
            except httpcore.TimeoutException:
                raise errors.MediaFetchTimeout(
                    f"{where}: the host did not answer within LAD_MEDIA_TIMEOUT_S={limit_s:g} s"
                ) from None
            except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
                log.info("media fetch of %s failed: %r", where, exc)
                raise errors.MediaFetchFailed(
                    f"{where}: the connection to {url.host[:100]!r} failed"
                ) from None
            except httpcore.UnsupportedProtocol:
                raise errors.MediaNotAllowed(f"{where}: unsupported URL") from None
        raise errors.MediaFetchFailed(
            f"{where}: more than LAD_MEDIA_MAX_REDIRECTS={self.settings.media_max_redirects} "
            "redirects"
        )

    async def _get(
        self, pool: httpcore.AsyncConnectionPool, url: httpx.URL, where: str, fetched: Fetched
    ) -> tuple[bytes, httpx.URL | None]:
        """One GET: (the body, None), or (b"", where it redirects to)."""
        limit = self.settings.max_image_bytes
        timeout = self.settings.media_timeout_s
        async with pool.stream(
            "GET",
            httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=[(b"User-Agent", _USER_AGENT), (b"Accept", b"image/*")],
            extensions={"timeout": dict.fromkeys(("connect", "read", "write", "pool"), timeout)},
        ) as response:
            headers = httpx.Headers(response.headers)
            if response.status in REDIRECTS and "location" in headers:
                try:
                    return b"", url.join(headers["location"])
                except (httpx.InvalidURL, ValueError):
                    raise errors.MediaFetchFailed(f"{where} redirects to an invalid URL") from None
            if response.status != 200:
                raise errors.MediaFetchFailed(
                    f"{where}: {url.host[:100]!r} answered HTTP {response.status}"
                )
            declared = headers.get("content-length", "")
            if declared.isdigit():
                if int(declared) > limit:
                    raise self._too_large(where, f"declares {declared} bytes")
                await fetched.charge(int(declared), f"fetching {where}")
            body = bytearray()
            async for chunk in response.aiter_stream():
                body += chunk
                if len(body) > limit:
                    raise self._too_large(where, f"sent over {limit} bytes")
                if not declared.isdigit():
                    await fetched.charge(len(chunk), f"fetching {where}")
            if declared.isdigit() and len(body) != int(declared):
                raise errors.MediaFetchFailed(f"{where}: the body ended before its length")
            return bytes(body), None

    @staticmethod
    def _too_large(where: str, what: str) -> errors.ImageTooLarge:
        return errors.ImageTooLarge(f"{where} {what}; the limit is LAD_MAX_IMAGE_BYTES")
