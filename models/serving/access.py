"""Who may talk to ``anychip serve``, checked before any handler runs: the Host a request names
(DNS rebinding), the Origin a browser sends (another site's page driving a local server), the
content type of a POST (a page may send text/plain cross-origin without asking), the API key,
and the size a body announces. A refusal is OpenAI's error object with the status that says why."""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

from starlette.responses import Response

from .limits import MIN_MAX_BODY_BYTES
from .openai_api import APIError

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


# Paths outside /v1 that the API key guards too: vLLM's tokenizer endpoints
KEYED_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")

def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _host_port(netloc: str, scheme: str = "http") -> tuple[str, int | None]:
    """The host (lower case, no IPv6 brackets) and port of a Host header or an origin's netloc;
    ("", None) for one that does not parse (a bad port or IPv6 address), which names nothing."""
    try:
        parts = urlsplit("//" + netloc)
        return (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:
        return "", None


def origin_error(origin: str) -> str | None:
    """Why ``origin`` (an --allowed-origins entry) is not an origin, or None: ``*`` or
    scheme://host[:port], nothing after."""
    scheme, _, netloc = origin.partition("://")
    host, port = _host_port(netloc, scheme)
    if origin == "*" or (scheme in ("http", "https") and host and port is not None
                         and not any(c in netloc for c in "/?#")):
        return None
    return f"{origin!r} is not an origin: expected scheme://host[:port] (e.g. http://localhost:3000) or *"


@dataclass
class ServerConfig:
    """How the HTTP server guards itself (``anychip serve``'s flags of the same names)."""

    bind_host: str = "127.0.0.1"
    allowed_origins: set[str] = field(default_factory=set)  # "*" allows any
    api_key: str | None = None
    max_body_bytes: int = MIN_MAX_BODY_BYTES

    def __post_init__(self):
        self.allowed_origins = {o.strip().rstrip("/").lower() for o in self.allowed_origins if o.strip()}
        for origin in self.allowed_origins:
            if (why := origin_error(origin)) is not None:
                raise ValueError(f"allowed_origins (--allowed-origins): {why}")
        # the hosts the allowed origins name, which a Host header may name too
        self._origin_hosts = {_host_port(urlsplit(o).netloc)[0] for o in self.allowed_origins}
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes (--max-body-bytes) must be at least 1024, got {self.max_body_bytes}")

    def refusal(self, method: str, path: str, headers: dict[str, str]) -> APIError | None:
        """Why this request may not go on, or None."""
        host = headers.get("host", "")
        # Bound to loopback, the server is this machine's alone: a Host naming another site is a
        # page on that site whose name was pointed at 127.0.0.1 (DNS rebinding).
        if _is_loopback(self.bind_host) and not self._host_allowed(host):
            return APIError(403, f"the Host header {host[:100]!r} does not name this server", code="forbidden_host")
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            return APIError(403, f"requests from the origin {origin[:100]!r} are not allowed; start the server with "
                                 "--allowed-origins to allow it", code="forbidden_origin")
        if self.api_key and (path.startswith("/v1/") or path in KEYED_PATHS):
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                return APIError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY' "
                                     "with the key it was started with (--api-key)", code="invalid_api_key")
        if method == "POST":
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                return APIError(415, f"Content-Type must be application/json, got {ctype[:100] or 'none'!r}",
                                code="unsupported_media_type")
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
                return APIError(413, f"the request body ({length[:20]} bytes) is larger than this server takes "
                                     f"({self.max_body_bytes} bytes, --max-body-bytes)", code="request_too_large")
        return None

    def _host_allowed(self, host: str) -> bool:
        name = _host_port(host)[0]
        return "*" in self.allowed_origins or _is_loopback(name) or \
            name in self._origin_hosts

    def _origin_allowed(self, origin: str, host: str) -> bool:
        """``origin`` is allowed by name, or it is the server's own page: the origin the Host names,
        where that name cannot be another site's (an IP address, or loopback: 127.0.0.1 and
        localhost are the same server at the same port)."""
        if "*" in self.allowed_origins or origin.rstrip("/").lower() in self.allowed_origins:
            return True
        scheme, _, netloc = origin.partition("://")
        if scheme not in ("http", "https"):
            return False
        theirs, ours = _host_port(netloc, scheme), _host_port(host, scheme)
        if theirs[1] is None or theirs[1] != ours[1]:
            return False
        if _is_loopback(theirs[0]) and _is_loopback(ours[0]):
            return True
        # A name (not an IP) could be a site's own, pointed at this server (DNS rebinding).
        return theirs[0] == ours[0] and _is_ip(theirs[0])


class Guard:
    """ASGI middleware applying a :class:`ServerConfig`'s checks to every HTTP request;
    ``refuse`` renders (and counts) a refusal."""

    def __init__(self, app, config: ServerConfig, refuse: Callable[[APIError], Response]):
        self.app, self.config, self.refuse = app, config, refuse

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            refused = self.config.refusal(scope["method"], scope["path"], headers)
            if refused is not None:
                await self.refuse(refused)(scope, receive, send)
                return
        await self.app(scope, receive, send)
