"""Downloads of the URLs a renter names (training's dataset_url, rendering's
scene_url), made from inside the job's container, that is from inside the
provider's network. The server refuses a URL whose host is private as written,
but what matters is where the connection goes, so every hop is checked here:

- only http and https, to a host that is not an internal name (localhost,
  *.localhost, *.local, *.internal, a single label) nor a non-public address;
- without a proxy, the host is resolved here and every address it resolves to
  must be public: not loopback, private (RFC 1918), link-local (169.254/16,
  fe80::/10, the cloud metadata address), CGNAT (100.64/10), unique-local
  (fc00::/7), multicast, unspecified, reserved or documentation ranges, nor an
  IPv6 form that leads to such an IPv4 address (mapped, NAT64, 6to4); the
  connection then goes to the address that was checked, never to a second
  lookup of the name (which a DNS server could answer differently);
- redirects are followed by hand (at most MAX_REDIRECTS), each Location
  checked as the first URL was;
- the body is read up to the caller's cap (the Content-Length too), then
  refused.

A proxy the container is given (http_proxy / https_proxy, as docker passes the
provider's proxy settings to containers) makes the connections itself: the
host is then checked as written, and by what it resolves to here when it
resolves here, and the request goes to the proxy, which resolves it again.

train.py and render.py import this file; both daemons ship every file of this
folder with them (mounted read-only at /svc-scripts)."""
import base64
import http.client
import ipaddress
import os
import re
import socket
import ssl
import urllib.parse
import urllib.request

# Redirects followed from one URL, each checked as the URL itself.
MAX_REDIRECTS = 5
# Seconds one connect or read may wait.
TIMEOUT_SECONDS = 60
CHUNK_BYTES = 1024 * 1024

_REDIRECTS = (301, 302, 303, 307, 308)
# A host name as DNS writes it (IDN names in their punycode form).
_NAME = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*$")

# Every IPv4 range that is not public unicast.
_V4_NOT_PUBLIC = [(ipaddress.ip_network(net), what) for net, what in (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
)]
_V6_GLOBAL = ipaddress.ip_network("2000::/3")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Inside 2000::/3 but not public: protocol assignments (Teredo among them), documentation.
_V6_NOT_PUBLIC = [(ipaddress.ip_network(net), what) for net, what in (
    ("2001::/23", "IETF protocol assignments"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
)]


class FetchError(Exception):
    """A download that was refused or failed; the message says why."""


def _v4_problem(a):
    for net, what in _V4_NOT_PUBLIC:
        if a in net:
            return what
    return None


def address_problem(text):
    """Why an IP address is not a public one to connect to (a word or two), or None when it is."""
    try:
        a = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if a.version == 4:
        return _v4_problem(a)
    inner, form = None, None
    if a.ipv4_mapped is not None:
        inner, form = a.ipv4_mapped, "IPv4-mapped"
    elif a in _NAT64:
        inner, form = ipaddress.IPv4Address(int(a) & 0xFFFFFFFF), "NAT64"
    elif a.sixtofour is not None:
        inner, form = a.sixtofour, "6to4"
    if inner is not None:
        why = _v4_problem(inner)
        return "%s %s (%s)" % (form, why, inner) if why else None
    if a not in _V6_GLOBAL:
        # ::1, ::, fe80::/10, fc00::/7, ff00::/8, the IPv4-compatible ::a.b.c.d and all else outside 2000::/3.
        if a.is_loopback:
            return "loopback"
        if a.is_unspecified:
            return "unspecified"
        if a.is_link_local:
            return "link-local"
        if a.is_multicast:
            return "multicast"
        if a in ipaddress.ip_network("fc00::/7"):
            return "unique-local"
        return "not global unicast"
    for net, what in _V6_NOT_PUBLIC:
        if a in net:
            return what
    return None


def _legacy_ipv4(host):
    """The IPv4 address a host written in inet_aton's older forms stands for (127.1, 0x7f000001, 2130706433...)."""
    if not re.match(r"^[0-9a-fx.]+$", host) or not re.match(r"^[0-9]", host):
        return None
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def host_problem(host):
    """Why a URL's host (urlsplit's hostname: lowercase, no brackets) is refused as written, or None."""
    host = host.rstrip(".")
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        literal = host
    except ValueError:
        literal = _legacy_ipv4(host)
    if literal is not None:
        why = address_problem(literal)
        return "its address %s is %s" % (literal, why) if why else None
    if not _NAME.match(host):
        return "it is not a valid host name"
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")) or "." not in host:
        return "it is an internal name"
    return None


def _resolve(host, port):
    return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP)


def _public_addresses(host, port):
    """Every address host resolves to, all of them public; else FetchError."""
    try:
        found = _resolve(host, port)
    except (OSError, UnicodeError) as err:
        raise FetchError("could not resolve %s: %s" % (host, err))
    if not found:
        raise FetchError("%s resolves to no address" % host)
    _check_resolved(host, found)
    return found


def _check_resolved(host, found):
    for _family, _type, _proto, _canon, sockaddr in found:
        why = address_problem(sockaddr[0])
        if why:
            raise FetchError("%s resolves to %s, which is %s: not fetched" % (host, sockaddr[0], why))


def _connect(addresses, timeout):
    """A TCP connection to the first of the (checked) addresses that answers."""
    last = None
    for family, socktype, proto, _canon, sockaddr in addresses:
        sock = socket.socket(family, socktype, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            return sock
        except OSError as err:
            last = err
            sock.close()
    raise last or OSError("no address to connect to")


class _PinnedHTTP(http.client.HTTPConnection):
    """HTTP to the addresses that were checked, whatever the name resolves to now."""

    def __init__(self, host, port, addresses):
        http.client.HTTPConnection.__init__(self, host, port, timeout=TIMEOUT_SECONDS)
        self._addresses = addresses

    def connect(self):
        self.sock = _connect(self._addresses, self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to the addresses that were checked; the certificate is verified for the URL's host."""

    def __init__(self, host, port, addresses, context):
        http.client.HTTPSConnection.__init__(self, host, port, timeout=TIMEOUT_SECONDS, context=context)
        self._addresses = addresses
        self._tls = context

    def connect(self):
        self.sock = self._tls.wrap_socket(_connect(self._addresses, self.timeout), server_hostname=self.host)


def _checked(url):
    """(scheme, host, port, the URL rebuilt from its checked parts, the request path) of a URL that may be fetched."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise FetchError("%r is not a valid URL: %s" % (url, err))
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchError("%r is not an http(s) URL" % url)
    host = parts.hostname or ""
    if not host:
        raise FetchError("%r names no host" % url)
    why = host_problem(host)
    if why:
        raise FetchError("%s is not fetched: %s" % (host, why))
    port = port or (443 if scheme == "https" else 80)
    shown = "[%s]" % host if ":" in host else host
    netloc = shown if parts.port is None else "%s:%d" % (shown, port)
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    # Rebuilt without user info or fragment: what goes out (to a proxy too) is what was checked.
    return scheme, host, port, "%s://%s%s" % (scheme, netloc, target), target


def _proxy(scheme, host):
    """(host, port, Proxy-Authorization or None) of the proxy the environment names for this URL, or None."""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    p = urllib.parse.urlsplit(proxy)
    if not p.hostname:
        return None
    auth = None
    if p.username is not None:
        creds = "%s:%s" % (urllib.parse.unquote(p.username), urllib.parse.unquote(p.password or ""))
        auth = "Basic " + base64.b64encode(creds.encode("utf-8")).decode("ascii")
    return p.hostname, p.port or (443 if p.scheme == "https" else 80), auth


def _request(url):
    """One GET of a checked URL, no redirect followed: (connection, response)."""
    scheme, host, port, full, target = _checked(url)
    context = ssl.create_default_context() if scheme == "https" else None
    proxy = _proxy(scheme, host)
    headers = {"User-Agent": "svc-job-fetch/1", "Accept-Encoding": "identity"}
    if proxy is not None:
        # The proxy connects and resolves; a name that resolves here must still resolve to public addresses.
        try:
            found = _resolve(host, port)
        except (OSError, UnicodeError):
            found = []
        _check_resolved(host, found)
        phost, pport, auth = proxy
        if scheme == "https":
            conn = http.client.HTTPSConnection(phost, pport, timeout=TIMEOUT_SECONDS, context=context)
            conn.set_tunnel(host, port, headers={"Proxy-Authorization": auth} if auth else None)
            path = target
        else:
            conn = http.client.HTTPConnection(phost, pport, timeout=TIMEOUT_SECONDS)
            if auth:
                headers["Proxy-Authorization"] = auth
            path = full
    else:
        addresses = _public_addresses(host, port)
        conn = _PinnedHTTPS(host, port, addresses, context) if scheme == "https" else _PinnedHTTP(host, port, addresses)
        path = target
    try:
        conn.request("GET", path, headers=headers)
        return conn, conn.getresponse()
    except Exception:
        conn.close()
        raise


def _open(url):
    """(connection, response) of the URL's final answer, each redirect checked before it is followed."""
    for _ in range(MAX_REDIRECTS + 1):
        try:
            conn, resp = _request(url)
        except (OSError, http.client.HTTPException) as err:
            raise FetchError("could not fetch %s: %s" % (url, err))
        if resp.status in _REDIRECTS:
            location = resp.getheader("Location")
            conn.close()
            if not location:
                raise FetchError("%s answered %d without a Location" % (url, resp.status))
            url = urllib.parse.urljoin(url, location.strip())
            continue
        if resp.status != 200:
            conn.close()
            raise FetchError("%s answered HTTP %d %s" % (url, resp.status, resp.reason))
        return conn, resp
    raise FetchError("more than %d redirects" % MAX_REDIRECTS)


def _chunks(url, max_bytes):
    conn, resp = _open(url)
    try:
        length = resp.getheader("Content-Length")
        if length and length.strip().isdigit() and int(length) > max_bytes:
            raise FetchError("%s is %s bytes, over the %d-byte limit" % (url, length.strip(), max_bytes))
        got = 0
        while True:
            try:
                chunk = resp.read(CHUNK_BYTES)
            except (OSError, http.client.HTTPException) as err:
                raise FetchError("could not read %s: %s" % (url, err))
            if not chunk:
                return
            got += len(chunk)
            if got > max_bytes:
                raise FetchError("%s is over the %d-byte limit" % (url, max_bytes))
            yield chunk
    finally:
        conn.close()


def fetch_bytes(url, max_bytes):
    """The body of url (at most max_bytes), fetched as the module's docstring says; FetchError else."""
    return b"".join(_chunks(url, max_bytes))


def fetch_to_file(url, path, max_bytes):
    """Writes the body of url (at most max_bytes) to path; FetchError else (a partial file is removed)."""
    try:
        with open(path, "wb") as f:
            for chunk in _chunks(url, max_bytes):
                f.write(chunk)
    except BaseException:
        try:
            os.remove(path)
        except OSError:
            pass
        raise
