"""Who may talk to ``anychip serve``, checked before any handler runs: the Host a request names
(DNS rebinding), the Origin a browser sends (another site's page driving a local server), the
content type of a POST (a page may send text/plain cross-origin without asking), the API key,
and the size of a body. A refusal is OpenAI's error object with the status that says why."""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from .openai_api import APIError

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a full 8192-token context is ~50 KB of text or ids


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(netloc: str) -> str:
    """The host of a Host header or an origin's netloc, without port or IPv6 brackets."""
    return (urlsplit("//" + netloc).hostname or "").lower()


@dataclass
class AccessPolicy:
    bind_host: str = "127.0.0.1"
    allowed_origins: set[str] = field(default_factory=set)  # "*" allows any
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def refusal(self, method: str, path: str, headers: dict[str, str]) -> APIError | None:
        """Why this request may not go on, or None."""
        host = headers.get("host", "")
        # Bound to loopback, the server is this machine's alone: a Host naming another site is a
        # page on that site whose name was pointed at 127.0.0.1 (DNS rebinding).
        if _is_loopback(self.bind_host) and not _is_loopback(_hostname(host)) and \
                _hostname(host) not in {_hostname(urlsplit(o).netloc) for o in self.allowed_origins}:
            return APIError(403, f"the Host header {host[:100]!r} does not name this server", code="forbidden_host")
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            return APIError(403, f"requests from the origin {origin[:100]!r} are not allowed; start the server with "
                                 "--allowed-origins to allow it", code="forbidden_origin")
        if method == "POST":
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                return APIError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}",
                                code="unsupported_media_type")
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
                return APIError(413, f"the request body ({length[:20]} bytes) is larger than this server takes "
                                     f"({self.max_body_bytes} bytes, --max-body-bytes)", code="request_too_large")
        if self.api_key and path.startswith("/v1/"):
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                return APIError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY'",
                                code="invalid_api_key")
        return None

    def _origin_allowed(self, origin: str, host: str) -> bool:
        if "*" in self.allowed_origins or origin.rstrip("/") in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()  # same origin


class Guard:
    """ASGI middleware applying an :class:`AccessPolicy` to every HTTP request."""

    def __init__(self, app, policy: AccessPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            refused = self.policy.refusal(scope["method"], scope["path"], headers)
            if refused is not None:
                await JSONResponse(refused.body(), status_code=refused.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)
