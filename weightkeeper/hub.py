"""The Hugging Face Hub side of a download: `huggingface_hub` resolves, pooled ranged GETs fetch.

The revision's listing (`model_info`) is one GET asked here as `huggingface_hub` would, its answer read
bounded; each file's location is a HEAD sent through `huggingface_hub`'s session; `hf_raise_for_status`
makes their errors its typed errors. The bytes then come as
ranged GETs over urllib3's pooled connections, several per large file: `hf download` streams a
file through one connection in Python-sized chunks, which is what limits it. The token goes to
the endpoint's own origin only, never to a CDN the Hub redirects a file to. Proxies come from
the environment (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`), as for `huggingface_hub`; the read
timeout is `HF_HUB_DOWNLOAD_TIMEOUT` (10 s by default), and the fetch's watchdog
(`weightkeeper.watchdog`) cuts a body that stalls.

Whatever the Hub answers is checked before it is used: the commit, every file's size and digest
(`weightkeeper.download.check_snapshot`), and every place it sends a file to. A download follows a
redirect only to the endpoint's own origin, to an https host whose addresses are not loopback,
link-local or private (unless the endpoint's are of the same kind), or to a host the setting
`hub_redirect_hosts` allows; at most MAX_REDIRECTS of them. A host checked by its addresses is then
reached only at the addresses checked, never resolved again (`route`).

Every request to the endpoint's origin is taken from the Hub request budget first, and a 429 is absorbed
(`weightkeeper.hubbudget`, which says what counts).
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator
from typing import NamedTuple, TypeVar
from urllib.parse import quote, urljoin, urlsplit

import httpx2
import urllib3
from huggingface_hub import ModelInfo, constants, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status
from urllib3.util.connection import allowed_gai_family

from weightkeeper.anchored import Dir
from weightkeeper.download import (
    CONNECTIONS,
    Limits,
    RemoteFile,
    RoomCheck,
    Snapshot,
    Transfer,
    TransferInterrupted,
    check_count,
    check_snapshot,
    fetch_files,
    safe_repo_path,
    shown,
)
from weightkeeper.errors import DownloadError, said
from weightkeeper.hubbudget import UNMETERED, HubBudget, Throttled, budget_key
from weightkeeper.layout import HfSource, copy_name
from weightkeeper.planning import select_files
from weightkeeper.watchdog import BodyRefused, Pace, current, read_body, read_whole

API_TIMEOUT_SECONDS = 30.0
LISTING_BYTES, LISTING_BYTES_PER_FILE = 1 << 20, 1024  # what a revision's listing may hold
LISTING_VALUES, LISTING_VALUES_PER_FILE = 100_000, 16  # and how many JSON values: parsed, each is an object
FRAMING = ("content-encoding", "content-length", "transfer-encoding")  # of the bytes as read, not of the body kept
MAX_REDIRECTS = 5
MAX_ADDRESSES = 4  # of a redirect's host tried in turn, each with its own connect timeout
# urllib3 retries connecting; redirects are followed here, each checked (`route`); a body
# cut short is resumed by weightkeeper.download from the bytes written.
RETRIES = urllib3.Retry(total=None, connect=2, read=0, status=0, other=0, redirect=False)
NEXT_ADDRESS = urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=False)  # before the last
DEFAULT_PORTS = {"http": 80, "https": 443}
R = TypeVar("R")

HEADERS_SECONDS = 30.0  # an answer's status line and headers, from the request sent
_pools: dict[str | None, urllib3.PoolManager] = {}
_pools_lock = threading.Lock()


class HeadersInTime:
    """A connection whose answer's status line and headers must all arrive within `headers_seconds()` of asking. The
    read timeout bounds one read; a server that drips its headers a byte per read would hold the request as long
    as it likes, so a timer shuts the socket down at the deadline (the body has its pace and deadline: `watchdog`)."""

    def headers_seconds(self) -> float:
        return HEADERS_SECONDS

    def getresponse(self):
        late = threading.Event()

        def cut() -> None:
            late.set()
            with contextlib.suppress(OSError, AttributeError):  # closed meanwhile; TLS to a proxy wraps a socket
                getattr(self.sock, "socket", self.sock).shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(bound := self.headers_seconds(), cut)
        timer.daemon = True
        timer.start()
        try:
            response = super().getresponse()
        except Exception:
            if late.is_set():
                raise HeadersTooSlow(bound) from None
            raise
        finally:
            timer.cancel()
            timer.join()  # a cut under way has ended: `late` says whether there was one
        if late.is_set():  # cut: the headers read until then, as if they had ended
            response.close()
            raise HeadersTooSlow(bound)
        return response


class HeadersTooSlow(http.client.HTTPException):
    """An answer's headers were not all in within their bound (urllib3 gives it as a read error)."""

    def __init__(self, seconds: float):
        super().__init__(f"the answer's headers took over {seconds:.0f} s")


class _HTTPConnection(HeadersInTime, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(HeadersInTime, urllib3.connection.HTTPSConnection):
    pass


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


def _pool(url: str) -> urllib3.PoolManager:
    """The connection pool for `url`: through the environment's proxy for its scheme unless NO_PROXY says not."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and urllib.request.proxy_bypass(parts.hostname or ""):
        proxy = None
    with _pools_lock:
        if proxy not in _pools:
            # a staging run fetches up to CONNECTIONS files at once, each as up to CONNECTIONS ranges
            options = {"num_pools": 32, "maxsize": CONNECTIONS * CONNECTIONS}
            _pools[proxy] = urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
            _pools[proxy].pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
        return _pools[proxy]


def _read_alike(url: str) -> bool:
    """urllib3, which sends a request (when `route` gives no addresses), reads the scheme, host and port of `url` as
    `urlsplit`, by which it is checked, does: `http://a\\@b/` is b to urlsplit and a to urllib3 (so are a `%` and
    non-ASCII letters in a host read otherwise)."""
    try:
        parts, theirs = urlsplit(url), urllib3.util.parse_url(url)
        return ((theirs.scheme or "").lower(), (theirs.host or "").strip("[]").lower() or None, theirs.port) == (
            parts.scheme, parts.hostname, parts.port)
    except ValueError:  # urllib3's LocationParseError is one
        return False


def _origin(url: str) -> tuple[str, str | None, int | None]:
    """The scheme, host and port of `url`; for one that is not a URL, or that urllib3 would send elsewhere
    (`_read_alike`), one no other URL has: never the endpoint's, and `route` refuses it."""
    if not _read_alike(url):
        return "?", url, None
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or DEFAULT_PORTS.get(parts.scheme)


def _joined(url: str, location: str) -> str:
    """Where a redirect from `url` to `location` (its `Location`, as the server said it) goes; one that is not a URL
    as it is, for `route` to refuse (urljoin raises ValueError for a host such as `[::1`)."""
    try:
        return urljoin(url, location)
    except ValueError:
        return location


def without_query(url: str) -> str:
    """`url` as it may be shown: no credentials, query or fragment (a signed URL's signature is in its query)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(not a URL)"
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    text = repr(f"{parts.scheme}://{host}{port}{parts.path}")[1:-1]
    return text if len(text) <= 200 else f"{text[:200]}..."


# IPv6 ranges that carry an IPv4 address in their last 32 bits: NAT64's well-known prefix, IPv4-translated and
# IPv4-compatible addresses; the IPv4 address decides their kind (6to4 and Teredo are read by `ipaddress`)
EMBEDDING = tuple(ipaddress.ip_network(n) for n in ("64:ff9b::/96", "::ffff:0:0:0/96", "::/96"))
LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")  # a network's own translator: any IPv4 behind it (RFC 8215)


def kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """"loopback", "link-local", "private" (any other address that is not global) or "public"; an IPv6 address
    that embeds an IPv4 one is of that one's kind."""
    if isinstance(ip, ipaddress.IPv6Address) and not (ip.is_loopback or ip.is_unspecified):
        if ip.is_site_local or ip in LOCAL_NAT64:
            return "private"
        teredo = ip.teredo[1] if ip.teredo else None
        embedded = ip.ipv4_mapped or ip.sixtofour or teredo or next(
            (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) for n in EMBEDDING if ip in n), None)
        ip = embedded or ip
    return ("loopback" if ip.is_loopback or ip.is_unspecified else "link-local" if ip.is_link_local
            else "private" if not ip.is_global or ip.is_multicast else "public")


def _addresses(host: str) -> dict[str, str]:
    """The addresses `host` resolves to, in the resolver's order, each with its `kind`. OSError when it does not
    resolve."""
    return {address[0]: kind(ipaddress.ip_address(address[0].split("%")[0]))
            for *_, address in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}


class Route(NamedTuple):
    """Where a request may go, and how: `problem` says why it may not; `addresses` are those its host was checked
    at, the only ones the request connects to, in order (empty: the endpoint's origin or an allowed host, resolved
    as usual)."""
    url: str
    problem: str | None = None
    addresses: tuple[str, ...] = ()


def route(location: str, endpoint: str, allowed: Collection[str]) -> Route:
    """How a file or a listing may be fetched from `location`. Allowed are the endpoint's origin, the hosts (`host`
    or `host:port`) in `allowed`, and https hosts none of whose addresses is loopback, link-local or private unless
    the endpoint has an address of the same kind; such a host is then reached only at the addresses that were
    checked, so a DNS answer that changes after the check (rebinding) is never asked."""
    try:
        parts = urlsplit(location)
    except ValueError:
        return Route(location, "it is not a URL")
    try:
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return Route(location, "its port is not a number")
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return Route(location, "it is not an http(s) URL")
    if not _read_alike(location):
        return Route(location, "its host is read one way by the check and another by the HTTP client (a `\\`, a `%` "
                               "or a non-ASCII letter before its path?)")
    if _origin(location) == _origin(endpoint):
        return Route(location)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if host in allowed or f"{host}:{port}" in allowed:
        return Route(location)
    if parts.scheme != "https":
        return Route(location, "it is not https and not the endpoint's origin (allow its host in "
                               "hub_redirect_hosts if it is trusted)")
    try:
        addresses, home = _addresses(parts.hostname), set(_addresses(urlsplit(endpoint).hostname or "").values())
    except ValueError:  # UnicodeError: a label empty or over 63 characters, which no name resolves to
        return Route(location, f"its host {shown(host)} is not a valid name")
    except OSError as e:
        raise DownloadError(f"cannot resolve {shown(host)} to check a redirect to it ({e}; a host only a proxy can "
                            "resolve must be allowed in hub_redirect_hosts); will retry") from None
    if bad := sorted(set(addresses.values()) - home - {"public"}):
        return Route(location, f"{host} has a {' and a '.join(bad)} address (allow it in hub_redirect_hosts if it "
                               "is trusted)")
    ipv4_only = allowed_gai_family() == socket.AF_INET
    if not (usable := tuple(a for a in addresses if not ipv4_only or ":" not in a)):
        raise DownloadError(f"{host} has no IPv4 address and this host has no IPv6; will retry")
    return Route(location, addresses=_capped(usable))


def _capped(addresses: tuple[str, ...]) -> tuple[str, ...]:
    """The first MAX_ADDRESSES in the resolver's order, one of them of the other family when there is one (a host
    whose IPv6 route is blackholed still has an IPv4 address tried, as it had when every address was)."""
    picked = addresses[:MAX_ADDRESSES]
    other = next((a for a in addresses if (":" in a) != (":" in addresses[0])), None)
    return picked if other is None or other in picked else picked[:-1] + (other,)


def _get(to: Route, headers: dict[str, str], timeout: urllib3.Timeout,
         method: str = "GET") -> urllib3.BaseHTTPResponse:
    """A GET (or `method`) of `to.url` (no redirect followed), its headers in time (`HeadersInTime`). When its host
    was checked by its addresses, at those addresses only, the next one tried when one cannot be connected to (as
    urllib3 tries a name's), with the host's name for TLS and `Host`; unless a proxy resolves the name."""
    pool = _pool(to.url)
    options = dict(preload_content=False, decode_content=False, redirect=False, timeout=timeout,
                   assert_same_host=False)
    if not to.addresses or isinstance(pool, urllib3.ProxyManager):
        return pool.request(method, to.url, headers=headers, retries=RETRIES, **options)
    parts = urlsplit(to.url)
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    headers = {**headers, "Host": name + (f":{parts.port}" if parts.port else "")}
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    tls_name = parts.hostname.rstrip(".")  # as urllib3 gives it to TLS; a certificate names no trailing dot

    def at(address: str) -> urllib3.HTTPConnectionPool:
        return pool.connection_from_host(f"[{address}]" if ":" in address else address,
                                         parts.port or DEFAULT_PORTS["https"], "https",
                                         pool_kwargs={"server_hostname": tls_name, "assert_hostname": tls_name})

    for address in to.addresses[:-1]:
        try:
            return at(address).urlopen(method, target, headers=headers, retries=NEXT_ADDRESS, **options)
        except urllib3.exceptions.MaxRetryError as e:
            if not isinstance(e.reason, urllib3.exceptions.ConnectTimeoutError):  # refused or timed out connecting
                raise
    return at(to.addresses[-1]).urlopen(method, target, headers=headers, retries=RETRIES, **options)


def status_error(status: int | None, source: HfSource, endpoint: str | None) -> DownloadError:
    permanent = status in (400, 401, 403)
    return DownloadError(f"{endpoint or 'the Hugging Face Hub'} answered HTTP {status} for {source.repo_id}; "
                         f"{'fix access and retry' if permanent else 'will retry'}", permanent=permanent)


def hub_error(error: Exception, source: HfSource, endpoint: str | None, token: str | None) -> DownloadError:
    """Translate a client error into one line that says what to do, quoting at most SAID_CHARS of what the server
    (or the client, of its answer) said, never `token`."""
    where = endpoint or "the Hugging Face Hub"
    heard = said(getattr(error, "reason", None) or error, [token])  # urllib3's MaxRetryError: its cause
    if isinstance(error, GatedRepoError):
        return DownloadError(f"{source.repo_id} is gated on {where}: accept its terms on the Hub and give the model "
                             "a token block (--token-block) of an account that has access", permanent=True)
    if isinstance(error, RepositoryNotFoundError):
        return DownloadError(f"repository {source.repo_id} was not found on {where} (if it is private, give the "
                             "model a token block with access)", permanent=True)
    if isinstance(error, RevisionNotFoundError):
        return DownloadError(f"revision {source.revision!r} does not exist in {source.repo_id} on {where}",
                             permanent=True)
    if isinstance(error, RemoteEntryNotFoundError):
        return DownloadError(f"a file of {source.repo_id} disappeared from {where}: {heard}", permanent=True)
    if isinstance(error, HfHubHTTPError):
        return status_error(error.response.status_code if error.response is not None else None, source, endpoint)
    if isinstance(error, (httpx2.HTTPError, urllib3.exceptions.HTTPError)):
        return DownloadError(f"cannot reach {where} for {source.repo_id}: {heard}; will retry")
    if isinstance(error, OSError):
        return DownloadError(f"download of {source.repo_id} from {where} was cut short: {heard}; will retry")
    return DownloadError(f"downloading {source.repo_id} failed: {heard}")


def _hub_call(call: Callable[[], R], source: HfSource, endpoint: str | None, token: str | None) -> R:
    """`call()` through `huggingface_hub`: its 429 answer raised as Throttled, any other error as `hub_error`."""
    try:
        return call()
    except HfHubHTTPError as e:
        if e.response is not None and e.response.status_code == 429:
            raise Throttled(e.response.headers) from None
        raise hub_error(e, source, endpoint, token) from None
    except DownloadError:  # ours, as it is
        raise
    except Exception as e:  # noqa: BLE001 - every client error becomes a DownloadError
        raise hub_error(e, source, endpoint, token) from None


@contextlib.contextmanager
def _token_kept_out(token: str | None) -> Iterator[None]:
    """A server may repeat what it was sent (a proxy echoing a request's headers into its error page): an error
    raised within never carries the token, whatever part of the answer it quotes."""
    try:
        yield
    except (DownloadError, TransferInterrupted) as e:
        if token and token in str(e):
            e.args = (str(e).replace(token, "…"),)
        raise


def _bucket(url: str) -> str:
    return "api" if urlsplit(url).path.startswith("/api/") else "resolve"


def resolve_snapshot(source: HfSource, endpoint: str | None, token: str | None, limits: Limits = Limits(),
                     budget: HubBudget = UNMETERED, include: list[str] | None = None,
                     exclude: list[str] | None = None, redirect_hosts: Collection[str] = ()) -> Snapshot:
    """One request: the commit of the revision (a 40-hex revision as is) and the files to fetch (`select_files`
    with the model's patterns), checked."""
    with _token_kept_out(token):
        return _resolve(source, endpoint, token, limits, budget, include, exclude, redirect_hosts)


def _resolve(source: HfSource, endpoint: str | None, token: str | None, limits: Limits, budget: HubBudget,
             include: list[str] | None, exclude: list[str] | None, redirect_hosts: Collection[str]) -> Snapshot:
    home = endpoint or constants.ENDPOINT
    info = budget.call(budget_key(home, token), "api", lambda: _hub_call(
        lambda: model_info(source, home, token, limits, redirect_hosts), source, endpoint, token),
        f"{source.repo_id} on {home}")
    where = f"{source.repo_id} from {endpoint or 'the Hugging Face Hub'}"
    if source.pinned_commit and info.sha != source.pinned_commit:
        raise DownloadError(f"refusing {where}: it answered commit {shown(info.sha)} for {source.uri}",
                            permanent=True)
    listed = info.siblings or []
    check_count(where, len(listed), limits)
    if bad := [s.rfilename for s in listed if not isinstance(s.rfilename, str)]:  # a null, 0 or [] name as well
        raise DownloadError(f"refusing {where}: it lists a file name {shown(bad[0])} that is not a string",
                            permanent=True)
    siblings = {s.rfilename: s for s in listed}
    files = []
    for name in _selected(siblings, include, exclude, where):
        s = siblings[safe_repo_path(name, source.repo_id)]
        files.append(RemoteFile(name, s.size, s.blob_id or "", s.lfs.sha256 if s.lfs else None))
    return check_snapshot(Snapshot(source.repo_id, info.sha, tuple(files), copy_name(info.sha, include, exclude)),
                          where, limits)


def model_info(source: HfSource, home: str, token: str | None, limits: Limits,
               redirect_hosts: Collection[str] = ()) -> ModelInfo:
    """The revision's commit and files (`/api/models/<repo>/revision/<rev>?blobs=true` on the endpoint `home`), as
    `HfApi.model_info` asks, but bounded: a redirect is followed only by `route`, and with the token only within
    `home`'s origin (a renamed repository); the answer may take API_TIMEOUT_SECONDS in all and hold LISTING_BYTES
    plus LISTING_BYTES_PER_FILE per `max_manifest_files`, and as many JSON values, LISTING_VALUES plus
    LISTING_VALUES_PER_FILE per `max_manifest_files` (an error's body too)."""
    url = f"{home}/api/models/{source.repo_id}/revision/{quote(source.revision, safe='')}?blobs=true"
    headers = {**build_hf_headers(token=token or False, library_name="weightkeeper"), "Accept-Encoding": "identity"}
    anonymous = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    cap = LISTING_BYTES + LISTING_BYTES_PER_FILE * limits.max_manifest_files
    deadline = time.monotonic() + API_TIMEOUT_SECONDS
    where = f"the files of {source.repo_id} on {home}"
    to = Route(url)

    def late() -> DownloadError:
        return DownloadError(f"{home} took over {API_TIMEOUT_SECONDS:.0f} s to list {where}; will retry")

    for _ in range(MAX_REDIRECTS + 1):
        if (left := deadline - time.monotonic()) <= 0:
            raise late()
        own = _origin(to.url) == _origin(home)
        response = _get(to, headers if own else anonymous, urllib3.Timeout(left))
        try:
            if hop := response.get_redirect_location():
                if (to := route(_joined(to.url, hop), home, redirect_hosts)).problem:
                    raise DownloadError(f"{home} redirected the listing of {where} to {without_query(to.url)}; "
                                        f"refused: {to.problem}", permanent=True)
                continue
            if (encoding := response.headers.get("Content-Encoding", "identity").strip().lower()) != "identity":
                raise DownloadError(f"refusing {where}: the listing came encoded ({shown(encoding)}), not as asked",
                                    permanent=True)  # never inflated: a small answer can hold terabytes
            body = _read_listing(response, cap, deadline, late, f"refusing {where}: the listing is over {cap} bytes "
                                                                 f"(max_manifest_files {limits.max_manifest_files})")
        finally:
            response.close()
        values = LISTING_VALUES + LISTING_VALUES_PER_FILE * limits.max_manifest_files
        if body.count(b",") + body.count(b"[") + body.count(b"{") > values:  # parsed (an error's too), a small answer
            raise DownloadError(f"refusing {where}: the listing holds over {values} values (max_manifest_files "  # can
                                f"{limits.max_manifest_files})", permanent=True)                             # take GiBs
        kept = {k: v for k, v in response.headers.items() if k.lower() not in FRAMING}
        hf_raise_for_status(httpx2.Response(response.status, headers=kept, content=body,
                                            request=httpx2.Request("GET", to.url)))  # an error's body is its message
        try:
            return ModelInfo(**json.loads(body))
        except Exception as e:  # noqa: BLE001 - any value of any type (`"lastModified": 1` raises AttributeError)
            raise DownloadError(f"refusing {where}: the listing is not a model's ({shown(str(e))})",
                                permanent=True) from None
    raise DownloadError(f"{home} redirected the listing of {where} more than {MAX_REDIRECTS} times; will retry")


def _read_listing(response: urllib3.BaseHTTPResponse, cap: int, deadline: float, late: Callable[[], DownloadError],
                  too_big: str) -> bytes:
    """The body as it arrives, at most `cap` bytes, by `deadline` (time.monotonic()): `watchdog.read_whole`."""
    try:
        return read_whole(response, cap, max(0.0, deadline - time.monotonic()))
    except BodyRefused as e:
        raise late() if e.late else DownloadError(too_big, permanent=True) from None


def _selected(names: Collection[str], include: list[str] | None, exclude: list[str] | None, where: str) -> list[str]:
    try:
        return select_files(names, include, exclude)
    except DownloadError as e:
        raise DownloadError(f"{where}: {e}", permanent=True) from None


def locate_file(url: str, token: str | None, home: str) -> str:
    """Where the bytes of the file at `url` (its `/resolve/` URL on the endpoint `home`) are served: one HEAD, and
    one more per redirect within `home`'s origin. A redirect elsewhere (a CDN) is answered, not followed: the token
    never leaves that origin (`huggingface_hub`'s own HEAD also sends it to huggingface.co and hf.co, whatever the
    endpoint). Errors are `huggingface_hub`'s typed ones; the answer is checked by the caller."""
    headers = {**build_hf_headers(token=token or False, library_name="weightkeeper"), "Accept-Encoding": "identity"}
    for _ in range(MAX_REDIRECTS + 1):
        response = _get(Route(url), headers, urllib3.Timeout(API_TIMEOUT_SECONDS), method="HEAD")
        response.drain_conn()  # a HEAD's answer has no body: its connection can take the next request
        response.release_conn()
        kept = {k: v for k, v in response.headers.items() if k.lower() not in FRAMING}
        hf_raise_for_status(httpx2.Response(response.status, headers=kept, request=httpx2.Request("HEAD", url)))
        if not (hop := response.get_redirect_location()):
            return url
        target = _joined(url, hop)
        if _origin(target) != _origin(home):
            return target
        url = target
    raise DownloadError(f"{home} redirected {url} more than {MAX_REDIRECTS} times; will retry")


def check_access(source: HfSource, path: str, endpoint: str | None, token: str | None,
                 budget: HubBudget = UNMETERED) -> None:
    """One request (a HEAD of `path` at the source's revision, from the resolve budget) that proves `token` may read
    the repository's files: a DownloadError as a download would raise otherwise (gated, private, gone)."""
    url = hf_hub_url(source.repo_id, path, revision=source.revision, endpoint=endpoint)
    home = endpoint or constants.ENDPOINT
    with _token_kept_out(token):
        budget.call(budget_key(home, token), "resolve",
                    lambda: _hub_call(lambda: locate_file(url, token, home), source, endpoint, token),
                    f"{path} of {source.repo_id}")


def hub_transfer(source: HfSource, commit: str, endpoint: str | None, token: str | None,
                 redirect_hosts: Collection[str] = (), budget: HubBudget = UNMETERED) -> Transfer:
    """Ranges of a commit's files: one HEAD per file (through `huggingface_hub`) finds where it is served;
    a redirect there or on the way is followed only by `route`."""
    headers = build_hf_headers(token=token or False, library_name="weightkeeper")
    anonymous = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    timeout = urllib3.Timeout(connect=API_TIMEOUT_SECONDS, read=float(constants.HF_HUB_DOWNLOAD_TIMEOUT))
    home = endpoint or constants.ENDPOINT
    key = budget_key(home, token)
    located: dict[str, Route] = {}
    locks: dict[str, threading.Lock] = {}
    guard = threading.Lock()

    def check(remote: RemoteFile, location: str) -> Route:
        if (to := route(location, home, redirect_hosts)).problem:
            raise DownloadError(f"{home} redirected {remote.path} of {source.repo_id} to {without_query(location)}; "
                                f"refused: {to.problem}", permanent=True)
        return to

    def locate(remote: RemoteFile) -> Route:
        """Where the file's bytes are served."""
        with guard:
            lock = locks.setdefault(remote.path, threading.Lock())
        with current().idle():  # another range of the file may be waiting for the budget
            lock.acquire()
        try:
            if remote.path not in located:
                url = hf_hub_url(source.repo_id, remote.path, revision=commit, endpoint=endpoint)
                located[remote.path] = check(remote, budget.call(key, "resolve", lambda: _hub_call(
                    lambda: locate_file(url, token, home), source, endpoint, token),
                    f"{remote.path} of {source.repo_id}"))
            return located[remote.path]
        finally:
            lock.release()

    def get(remote: RemoteFile, to: Route, wanted: dict[str, str]) -> urllib3.BaseHTTPResponse:
        """The GET of `to`, through checked redirects; the token only to the endpoint's origin, and only
        requests there taken from the budget."""
        def send(to: Route, own: bool) -> urllib3.BaseHTTPResponse:
            try:
                response = _get(to, {**(headers if own else anonymous), **wanted}, timeout)
            except urllib3.exceptions.HTTPError as e:
                if own:
                    raise hub_error(e, source, endpoint, token) from None
                at = f" at {' or '.join(to.addresses)}" if to.addresses else ""
                raise DownloadError(f"cannot reach {without_query(to.url)}{at}, where {home} sent {remote.path} of "
                                    f"{source.repo_id}: {said(getattr(e, 'reason', None) or e)}; will retry") from None
            if own and response.status == 429:
                throttled = Throttled(response.headers)
                response.close()
                raise throttled
            return response

        for _ in range(MAX_REDIRECTS + 1):
            if _origin(to.url) == _origin(home):
                response = budget.call(key, _bucket(to.url), lambda at=to: send(at, True),
                                       f"{remote.path} of {source.repo_id} ({wanted.get('Range', 'whole')})")
            else:
                response = send(to, False)
            if not (hop := response.get_redirect_location()):
                return response
            response.close()
            to = check(remote, _joined(to.url, hop))
        raise DownloadError(f"{home} redirected {remote.path} of {source.repo_id} more than {MAX_REDIRECTS} times; "
                            "will retry")

    def transfer(remote: RemoteFile, start: int, end: int, write: Callable[[memoryview], None]) -> None:
        wanted = {"Range": f"bytes={start}-" if end >= remote.size else f"bytes={start}-{end - 1}",
                  "Accept-Encoding": "identity"}
        response = get(remote, locate(remote), wanted)
        left = end - start
        try:
            if response.status == 200 and start == 0 or response.status == 206 and (
                    response.headers.get("Content-Range", "").startswith(f"bytes {start}-")):
                with current().abortable(response.shutdown):
                    left -= read_body(response, left, write)
            elif response.status in (200, 206):
                raise DownloadError(f"{endpoint or 'the Hub'} did not honour a Range request for {remote.path} of "
                                    f"{source.repo_id}; will retry")
            else:
                raise status_error(response.status, source, endpoint)
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as e:  # cut mid-body, or no data
            raise TransferInterrupted(f"{type(e).__name__}: {said(e, [token])}") from None  # within the read timeout
        finally:
            if left == 0 and response._fp.isclosed():  # the whole body was read: the connection can be reused
                response.release_conn()
            else:
                response.close()

    def kept_out(remote: RemoteFile, start: int, end: int, write: Callable[[memoryview], None]) -> None:
        with _token_kept_out(token):
            transfer(remote, start, end, write)

    return kept_out


def fetch_snapshot(source: HfSource, snapshot: Snapshot, target: Dir, endpoint: str | None, token: str | None,
                   on_progress: Callable[[int], None], deadline: float, pace: Pace = Pace(),
                   redirect_hosts: Collection[str] = (), budget: HubBudget = UNMETERED,
                   room: RoomCheck | None = None) -> int:
    """`fetch_files` from the Hub."""
    return fetch_files(snapshot, target, hub_transfer(source, snapshot.commit, endpoint, token, redirect_hosts, budget),
                       on_progress, deadline, f"{source.repo_id}@{snapshot.commit[:12]}", pace, room)
