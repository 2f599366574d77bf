"""The security headers every answer of the API carries, refusals included.

- `Content-Security-Policy`: scripts, styles, images and requests from the API's own origin only
  (inline styles allowed: the page's; Swagger UI's one inline script by its hash, set by that page);
  `frame-ancestors 'none'`: no other site frames the page (clickjacking);
- `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY` (older browsers), `Referrer-Policy`.

An answer that sets its own policy (Swagger UI's page) keeps it.
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'self'; script-src 'self'{scripts}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
FIXED = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
}


def policy(html: str = "") -> str:
    """The Content-Security-Policy; the inline scripts of `html` (if any) allowed by their hashes."""
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    ]
    return CSP.format(scripts="".join(" " + h for h in hashes))


class SecurityHeaders:
    """ASGI middleware: adds the security headers to each answer's head."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.csp = policy()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("content-security-policy", self.csp)
                for name, value in FIXED.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)
