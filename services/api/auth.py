"""Who calls the API, and what their role lets them do: bearer tokens, verified, each refusal counted.

A caller presents `Authorization: Bearer TOKEN` (the fleet page's reads may carry the same token
in its `gpuhealth_token` cookie instead, set by `POST /login`; a write never takes the cookie).
The token is checked one of two ways (`GPUHEALTH_AUTH__MODE`):

- `jwt`: an OIDC/JWT token, verified against the issuer's keys (a JWKS, from a URL or a file), its
  issuer, audience, expiry and not-before checked, its algorithm one of those pinned in `algorithms`
  (never `none`, never a shared-secret HS* algorithm). The role is the claim `role_claim` (a dotted
  path; a string or a list of strings), mapped through `role_values`. `make up` runs this mode
  against a key and tokens of its own (services.api.local_tokens).
- `tokenreview`: the token is a Kubernetes one, and the cluster's API server says whose it is
  (a TokenReview). The role is that of the user's groups, mapped through `group_roles`.

Roles are ordered: viewer < operator < admin. Reading needs a viewer; acknowledging an alert and
marking a GPU repaired, an operator; approving a plan and pausing, resuming or resetting the
remediator's breaker, an admin. The audit trail names the token's subject, never what a body says.

A client address whose requests were refused `refusals_per_window` times within `refusal_window_s`
is answered 429 until the window passes, before any token of it is verified.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import jwt
from pydantic import Field, field_validator, model_validator

from shared.settings.common import Section

Role = Literal["viewer", "operator", "admin"]
RANK: dict[str, int] = {"viewer": 1, "operator": 2, "admin": 3}
ROLE_NAMES: dict[str, Role] = {"viewer": "viewer", "operator": "operator", "admin": "admin"}
# Asymmetric only: a key that verifies cannot sign. HS* would let whoever can check a token forge one.
ALLOWED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
COOKIE = "gpuhealth_token"
MAX_TOKEN_BYTES = 8192
SUBJECT = re.compile(r"^[^\x00-\x1f\x7f]{1,253}$")


class AuthSection(Section):
    """GPUHEALTH_AUTH__*: how the API knows who calls it (bearer tokens) and which role each caller has."""

    mode: Literal["jwt", "tokenreview"] = "jwt"
    """`jwt`: OIDC/JWT tokens verified against a JWKS; `tokenreview`: Kubernetes tokens, checked by the
    cluster's API server."""
    jwks_url: str | None = None
    """(jwt) Where the issuer publishes its keys (https; http only to a loopback address), fetched when a
    token names a key not yet known and at most every `jwks_refresh_s`."""
    jwks_file: Path | None = None
    """(jwt) A JWKS file to verify tokens against instead of `jwks_url` (read again when it changes);
    `make up` writes one under `$GPUHEALTH_RUN/auth/`."""
    issuer: str = "gpu-health-local"
    """(jwt) The `iss` every token must carry."""
    audience: str = "gpu-health"
    """(jwt) The `aud` every token must carry."""
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256", "EdDSA"])
    """(jwt) The signature algorithms accepted; asymmetric ones only (RS*, PS*, ES*, EdDSA)."""
    role_claim: str = "gpuhealth_role"
    """(jwt) The claim holding the caller's role: a dotted path (`realm_access.roles`), a string or a
    list of strings; the highest role it maps to counts."""
    role_values: dict[str, Role] = Field(default_factory=dict)
    """(jwt) Claim values that mean a role, beside the role names themselves, as JSON:
    `{"gpu-admins": "admin"}`."""
    leeway_s: float = Field(default=30.0, ge=0, le=600)
    """(jwt) Clock skew allowed on `exp`, `nbf` and `iat`."""
    jwks_refresh_s: float = Field(default=60.0, ge=1, le=86_400)
    """(jwt) The keys are fetched again at most this often (a token naming an unknown key asks for it)."""
    tokenreview_url: str | None = None
    """(tokenreview) The Kubernetes API server, https://HOST:PORT."""
    tokenreview_ca_file: Path | None = None
    """(tokenreview) The CA that signed the API server's certificate."""
    tokenreview_token_file: Path | None = None
    """(tokenreview) The API's own bearer token for the review (a service account's, bound to
    `system:auth-delegator`); or use a client certificate."""
    tokenreview_cert_file: Path | None = None
    """(tokenreview) The API's client certificate for the review (with `tokenreview_key_file`)."""
    tokenreview_key_file: Path | None = None
    """(tokenreview) The client certificate's key."""
    tokenreview_audiences: list[str] = Field(default_factory=list)
    """(tokenreview) Audiences the token must be meant for (empty: the API server's own)."""
    group_roles: dict[str, Role] = Field(
        default_factory=lambda: dict[str, Role](
            {"gpu-health:viewers": "viewer", "gpu-health:operators": "operator", "gpu-health:admins": "admin"}
        )
    )
    """(tokenreview) Which Kubernetes group gives which role, as JSON; the highest counts."""
    tokenreview_cache_s: float = Field(default=10.0, ge=0, le=300)
    """(tokenreview) An accepted token is believed this long without asking again."""
    refusals_per_window: int = Field(default=20, ge=1, le=100_000)
    """A client address refused this many times within `refusal_window_s` is answered 429 until the
    window passes."""
    refusal_window_s: float = Field(default=60.0, ge=1, le=86_400)
    """The window over which a client address's refusals are counted."""

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, value: list[str]) -> list[str]:
        bad = [a for a in value if a not in ALLOWED_ALGORITHMS]
        if bad or not value:
            raise ValueError(f"algorithms must be some of {sorted(ALLOWED_ALGORITHMS)}, not {bad or value}")
        return value

    @field_validator("jwks_url", "tokenreview_url")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parsed = httpx.URL(value)
        loopback = parsed.host in ("127.0.0.1", "::1", "localhost")
        if parsed.scheme != "https" and not (parsed.scheme == "http" and loopback):
            raise ValueError("must be an https:// URL (http only to a loopback address)")
        if parsed.userinfo:
            raise ValueError("must not carry credentials in the URL")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> AuthSection:
        if self.mode == "tokenreview" and self.tokenreview_url is None:
            raise ValueError("mode tokenreview needs tokenreview_url")
        if self.mode == "jwt" and self.jwks_url is not None and self.jwks_file is not None:
            raise ValueError("set jwks_url or jwks_file, not both")
        return self


@dataclass(frozen=True, slots=True)
class Identity:
    """A caller whose token was verified: who (the audit trail's actor) and their role."""

    subject: str
    role: Role

    def may(self, role: Role) -> bool:
        return RANK[self.role] >= RANK[role]


class AuthError(Exception):
    """A token refused: `reason` is the metric's label, `status` 401 (who?) or 403 (not allowed)."""

    def __init__(self, reason: str, detail: str, status: int = 401) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.status = reason, detail, status


def highest_role(values: list[str], mapping: dict[str, Role]) -> Role | None:
    """The highest role any of `values` means: a role's own name, or one `mapping` gives."""
    ranked: list[Role] = [
        ROLE_NAMES[v] if v in ROLE_NAMES else mapping[v] for v in values if v in ROLE_NAMES or v in mapping
    ]
    if not ranked:
        return None
    best: Role = max(ranked, key=lambda r: RANK[r])
    return best


def claim_at(claims: dict[str, Any], path: str) -> list[str]:
    """The strings at a dotted `path` of the claims: one string, or a list's strings; [] when absent."""
    value: Any = claims
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def checked_subject(subject: Any) -> str:
    if not isinstance(subject, str) or not SUBJECT.match(subject):
        raise AuthError("invalid", "the token's subject is missing or not printable text of at most 253")
    return subject


class JwksKeys:
    """The issuer's verification keys by key id, from a file (read again when it changes) or a URL
    (fetched again when a token names an unknown key, at most every `refresh_s`)."""

    def __init__(self, settings: AuthSection) -> None:
        self.url, self.file, self.refresh_s = settings.jwks_url, settings.jwks_file, settings.jwks_refresh_s
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._stamp: object = None
        self._fetched = -float("inf")
        self._lock = asyncio.Lock()

    @staticmethod
    def parse(document: Any) -> dict[str | None, jwt.PyJWK]:
        keys: dict[str | None, jwt.PyJWK] = {}
        for raw in document.get("keys", []) if isinstance(document, dict) else []:
            try:
                key = jwt.PyJWK.from_dict(raw)
            except (jwt.PyJWKError, jwt.InvalidKeyError, TypeError, ValueError):
                continue  # a key of a type this library cannot use is not one that verifies
            if raw.get("use", "sig") == "sig":
                keys[key.key_id] = key
        return keys

    async def key(self, kid: str | None) -> jwt.PyJWK:
        async with self._lock:
            await self._refresh(force=kid not in self._keys)
        if kid in self._keys:
            return self._keys[kid]
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        raise AuthError("invalid", "the token names a key the issuer does not publish")

    async def _refresh(self, *, force: bool) -> None:
        if self.file is not None:
            try:
                stat = self.file.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != self._stamp:
                    self._keys = self.parse(json.loads(self.file.read_bytes()))
                    self._stamp = stamp
            except (OSError, ValueError) as e:
                raise AuthError(
                    "unavailable", f"the JWKS file cannot be read: {type(e).__name__}", 503
                ) from e
            return
        if self.url is None:
            raise AuthError("unavailable", "no JWKS is configured (GPUHEALTH_AUTH__JWKS_URL or _FILE)", 503)
        now = time.monotonic()
        if not self._keys or (force and now - self._fetched >= self.refresh_s):
            self._fetched = now
            try:
                async with httpx.AsyncClient(timeout=5, follow_redirects=False) as client:
                    response = await client.get(self.url)
                    response.raise_for_status()
                    self._keys = self.parse(response.json())
            except (httpx.HTTPError, ValueError) as e:
                if not self._keys:
                    raise AuthError("unavailable", f"the issuer's keys cannot be fetched: {e}", 503) from e


class JwtVerifier:
    def __init__(self, settings: AuthSection) -> None:
        self.settings = settings
        self.keys = JwksKeys(settings)

    async def identity(self, token: str) -> Identity:
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise AuthError("invalid", "the bearer token is not a JWT") from e
        algorithm = header.get("alg")
        if algorithm not in s.algorithms:
            raise AuthError(
                "invalid", f"the token's algorithm is not one accepted ({', '.join(s.algorithms)})"
            )
        kid = header.get("kid")
        key = await self.keys.key(kid if isinstance(kid, str) else None)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError as e:
            raise AuthError("expired", "the token has expired") from e
        except jwt.PyJWTError as e:
            raise AuthError("invalid", f"the token is refused: {e}") from e
        role = highest_role(claim_at(claims, s.role_claim), s.role_values)
        if role is None:
            raise AuthError("no_role", f"the token's {s.role_claim} gives no role", 403)
        return Identity(checked_subject(claims["sub"]), role)


class TokenReviewer:
    """Asks the Kubernetes API server whose a token is (TokenReview); believes a yes for `cache_s`."""

    def __init__(self, settings: AuthSection) -> None:
        self.settings = settings
        self._known: OrderedDict[bytes, tuple[float, Identity]] = OrderedDict()
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        s = self.settings
        if self._client is None:
            verify: Any = (
                ssl.create_default_context(cafile=s.tokenreview_ca_file) if s.tokenreview_ca_file else True
            )
            cert = (
                (str(s.tokenreview_cert_file), str(s.tokenreview_key_file))
                if s.tokenreview_cert_file and s.tokenreview_key_file
                else None
            )
            self._client = httpx.AsyncClient(
                base_url=str(s.tokenreview_url), verify=verify, cert=cert, timeout=5
            )
        return self._client

    async def identity(self, token: str) -> Identity:
        s = self.settings
        digest = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        if (known := self._known.get(digest)) and known[0] > now:
            return known[1]
        headers = {}
        if s.tokenreview_token_file is not None:
            try:
                own = s.tokenreview_token_file.read_text().strip()
            except OSError as e:
                raise AuthError(
                    "unavailable", f"the API's own Kubernetes token cannot be read: {e}", 503
                ) from e
            headers["Authorization"] = f"Bearer {own}"
        spec: dict[str, Any] = {"token": token}
        if s.tokenreview_audiences:
            spec["audiences"] = s.tokenreview_audiences
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        try:
            response = await self.client().post(
                "/apis/authentication.k8s.io/v1/tokenreviews", json=review, headers=headers
            )
            response.raise_for_status()
            status = response.json().get("status", {})
        except (httpx.HTTPError, ValueError) as e:
            raise AuthError(
                "unavailable", f"the Kubernetes API server did not review the token: {e}", 503
            ) from e
        if not status.get("authenticated"):
            raise AuthError("invalid", "the Kubernetes API server does not know the token")
        user = status.get("user") or {}
        role = highest_role([g for g in user.get("groups") or [] if isinstance(g, str)], s.group_roles)
        if role is None:
            raise AuthError("no_role", "none of the user's Kubernetes groups gives a role", 403)
        identity = Identity(checked_subject(user.get("username")), role)
        if s.tokenreview_cache_s > 0:
            self._known[digest] = (now + s.tokenreview_cache_s, identity)
            while len(self._known) > 10_000:
                self._known.popitem(last=False)
        return identity

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class RefusalThrottle:
    """Counts each client address's refusals over a sliding window; over the limit, it is throttled."""

    def __init__(self, limit: int, window_s: float, max_clients: int = 100_000) -> None:
        self.limit, self.window_s, self.max_clients = limit, window_s, max_clients
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._seen.get(client)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._seen[client]
        return times

    def throttled_for(self, client: str) -> float:
        """Seconds until `client` may try again; 0 when it may now."""
        now = time.monotonic()
        times = self._recent(client, now)
        if len(times) < self.limit:
            return 0.0
        return max(times[-self.limit] + self.window_s - now, 0.001)

    def refused(self, client: str) -> None:
        now = time.monotonic()
        times = self._seen.setdefault(client, deque(maxlen=self.limit))
        times.append(now)
        self._seen.move_to_end(client)
        while len(self._seen) > self.max_clients:
            self._seen.popitem(last=False)


class Authenticator:
    """Turns a bearer token into an Identity by the configured mode."""

    def __init__(
        self, settings: AuthSection, on_refusal: Callable[[str], None] = lambda _reason: None
    ) -> None:
        self.settings = settings
        self.verifier: JwtVerifier | TokenReviewer = (
            TokenReviewer(settings) if settings.mode == "tokenreview" else JwtVerifier(settings)
        )
        self.throttle = RefusalThrottle(settings.refusals_per_window, settings.refusal_window_s)
        self.on_refusal = on_refusal

    def refused(self, client: str, reason: str) -> None:
        """Count a refusal (its reason, the metric's label) against `client`'s allowance; a 503 (the
        issuer unreachable) is not the client's doing and does not count against it."""
        if reason not in ("unavailable", "throttled"):
            self.throttle.refused(client)
        self.on_refusal(reason)

    async def identity(self, token: str) -> Identity:
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthError("invalid", f"the bearer token is longer than {MAX_TOKEN_BYTES} bytes")
        return await self.verifier.identity(token)

    async def close(self) -> None:
        if isinstance(self.verifier, TokenReviewer):
            await self.verifier.close()
