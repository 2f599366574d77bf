"""Who may call the API (services/api/auth.py, guard.py, deps.py), decided before any database is asked:
tokens verified against the local mode's JWKS, each role refused what it may not do, refusals counted
and throttled, methods, hosts and security headers. The app is never started: no connection is made."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from services.api.app import create_app
from services.api.auth import AuthSection, claim_at, highest_role
from services.api.local_tokens import AUDIENCE, ISSUER, signing_key
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import LocalIdentities, api_section, local_identities

# Each write and the least role that may do it; every role below it is refused (403).
WRITES = {
    "/api/v1/alerts/1/acknowledge": "operator",
    "/api/v1/gpus/GPU-11111111-2222-3333-4444-555555555555/repairs": "operator",
    "/api/v1/gpus/GPU-11111111-2222-3333-4444-555555555555/remedies": "operator",
    "/api/v1/remediations/1/approve": "admin",
    "/api/v1/remediator/pause": "admin",
    "/api/v1/remediator/resume": "admin",
    "/api/v1/remediator/reset-breaker": "admin",
}
ROLES = ["viewer", "operator", "admin"]


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> LocalIdentities:
    return local_identities(tmp_path_factory.mktemp("auth"))


def app_client(ids: LocalIdentities, registry: CollectorRegistry | None = None, **auth: object) -> TestClient:
    settings = ids.auth.model_copy(update=auth) if auth else ids.auth
    return TestClient(create_app(DatabaseSettings(), api_section(), registry, auth=settings))


@pytest.fixture
def client(ids: LocalIdentities) -> TestClient:
    return app_client(ids)


def refusals(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("gpuhealth_api_auth_refusals_total", {"reason": reason}) or 0.0


def test_every_write_of_the_api_is_in_the_role_table(client: TestClient) -> None:
    """A write added later without a role here fails this test, not silently."""
    schema = client.app.openapi()  # type: ignore[attr-defined]
    posts = {path for path, ops in schema["paths"].items() if "post" in ops}
    filled = {p.replace("{gpu_uuid}", "GPU-11111111-2222-3333-4444-555555555555").replace("{alert_id}", "1")
              .replace("{plan_id}", "1") for p in posts}  # fmt: skip
    assert filled == set(WRITES)


@pytest.mark.parametrize("path", sorted(WRITES))
@pytest.mark.parametrize("role", ROLES)
def test_each_role_is_refused_each_write_above_it(ids: LocalIdentities, path: str, role: str) -> None:
    registry = CollectorRegistry()
    client = app_client(ids, registry)
    answer = client.post(path, headers=ids.headers(role), json={"by": "someone-else"})
    if ROLES.index(role) < ROLES.index(WRITES[path]):
        assert answer.status_code == 403, answer.text
        assert role in answer.json()["detail"]
        assert refusals(registry, "forbidden") == 1
    else:  # allowed: it gets as far as the database, which this app never reaches (503)
        assert answer.status_code == 503, answer.text
        assert refusals(registry, "forbidden") == 0


@pytest.mark.parametrize("path", sorted(WRITES))
def test_a_write_without_a_token_is_refused_before_its_body_is_read(client: TestClient, path: str) -> None:
    answer = client.post(path, json={"note": "x"})
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert answer.headers["connection"] == "close"


def test_reads_need_a_viewer_and_health_metrics_and_the_shell_do_not(
    client: TestClient, ids: LocalIdentities
) -> None:
    for path in ("/api/v1/fleet/summary", "/api/v1/gpus", "/api/v1/alerts", "/api/v1/remediations"):
        assert client.get(path).status_code == 401, path
    for path in ("/healthz", "/metrics", "/openapi.json", "/docs", "/static/fleet.js", "/favicon.ico"):
        assert client.get(path).status_code == 200, path
    shell = client.get("/")
    assert shell.status_code == 200
    assert 'class="anonymous"' in shell.text
    assert "<!--GRID-->" in shell.text


def test_a_cookie_serves_reads_never_writes(client: TestClient, ids: LocalIdentities) -> None:
    done = client.post("/login", json={"token": ids.tokens["admin"]})
    assert done.status_code == 200
    assert done.json() == {"subject": "local-admin", "role": "admin"}
    cookie = done.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    # the cookie is in the client's jar now: a read gets past the guard (to the absent database: 503)
    assert client.get("/api/v1/remediator").status_code == 503
    assert client.post("/api/v1/remediator/pause").status_code == 401  # a write wants Authorization
    client.post("/logout")
    assert client.get("/api/v1/remediator").status_code == 401


def test_login_refuses_a_form_and_a_bad_token(client: TestClient) -> None:
    assert client.post("/login", data={"token": "x"}).status_code == 415  # no login CSRF by a plain form
    assert client.post("/login", json={"token": "not-a-jwt"}).status_code == 401
    assert "set-cookie" not in client.post("/login", json={"token": "x.y.z"}).headers


def forged(ids: LocalIdentities, kind: str) -> str:
    key = signing_key(ids.directory)
    now = time.time()
    if kind == "expired":
        return ids.issue("mallory", "admin", now=now - 3 * 86400, days=1)
    if kind == "another audience":
        return ids.issue("mallory", "admin", audience="someone-else")
    if kind == "another issuer":
        return ids.issue("mallory", "admin", issuer="https://evil.example")
    if kind == "not yet valid":
        return ids.issue("mallory", "admin", now=now + 3600)
    claims = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "mallory",
        "gpuhealth_role": "admin",
        "exp": int(now + 600),
    }
    if kind == "alg none":
        return jwt.encode(claims, None, algorithm="none")  # type: ignore[arg-type]  # the attack needs no key
    if kind == "HS256 keyed with the public JWKS":  # the classic algorithm confusion
        public = json.loads((ids.directory / "jwks.json").read_text())["keys"][0]["x"]
        return jwt.encode(claims, public, algorithm="HS256", headers={"kid": "local-1"})
    if kind == "another key":
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return jwt.encode(claims, Ed25519PrivateKey.generate(), algorithm="EdDSA", headers={"kid": "local-1"})
    if kind == "unknown kid":
        return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": "other"})
    if kind == "no subject":
        return jwt.encode({k: v for k, v in claims.items() if k != "sub"}, key, algorithm="EdDSA")
    if kind == "no expiry":
        return jwt.encode({k: v for k, v in claims.items() if k != "exp"}, key, algorithm="EdDSA")
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "expired",
        "another audience",
        "another issuer",
        "not yet valid",
        "alg none",
        "HS256 keyed with the public JWKS",
        "another key",
        "unknown kid",
        "no subject",
        "no expiry",
    ],
)
def test_forged_and_stale_tokens_are_refused(ids: LocalIdentities, kind: str) -> None:
    registry = CollectorRegistry()
    client = app_client(ids, registry)
    token = forged(ids, kind)
    for answer in (
        client.get("/api/v1/remediator", headers={"Authorization": f"Bearer {token}"}),
        client.post("/api/v1/remediator/pause", headers={"Authorization": f"Bearer {token}"}),
    ):
        assert answer.status_code == 401, (kind, answer.text)
    counted = sum(refusals(registry, r) for r in ("invalid", "expired"))
    assert counted == 2
    if kind == "expired":
        assert refusals(registry, "expired") == 2


def test_a_token_without_a_role_is_forbidden(ids: LocalIdentities) -> None:
    client = app_client(ids)
    token = ids.issue("nobody", "intern")
    assert client.get("/api/v1/remediator", headers={"Authorization": f"Bearer {token}"}).status_code == 403


def test_refusals_are_throttled_per_address_and_counted(ids: LocalIdentities) -> None:
    registry = CollectorRegistry()
    client = app_client(ids, registry, refusals_per_window=5, refusal_window_s=60)
    for _ in range(5):
        assert (
            client.post("/api/v1/remediator/pause", headers={"Authorization": "Bearer x"}).status_code == 401
        )
    throttled = client.get("/api/v1/remediator", headers=ids.headers("admin"))  # even a good token now
    assert throttled.status_code == 429
    assert int(throttled.headers["retry-after"]) >= 1
    assert client.post("/login", json={"token": ids.tokens["admin"]}).status_code == 429
    assert client.get("/healthz").status_code == 200  # health still answers
    assert refusals(registry, "invalid") == 5
    assert refusals(registry, "throttled") == 2
    metrics = client.get("/metrics").text
    assert 'gpuhealth_api_auth_refusals_total{reason="throttled"} 2.0' in metrics


def test_trace_is_405_and_options_lists_every_method(client: TestClient, ids: LocalIdentities) -> None:
    trace = client.request("TRACE", "/api/v1/gpus")
    assert trace.status_code == 405
    assert "GET" in trace.headers["allow"]
    options = client.options("/api/v1/gpus/GPU-11111111-2222-3333-4444-555555555555/repairs")
    assert options.status_code == 204
    assert {m.strip() for m in options.headers["allow"].split(",")} >= {"GET", "POST", "OPTIONS"}
    assert client.request("DELETE", "/api/v1/remediator/pause").status_code == 405


def test_an_untrusted_host_is_refused(client: TestClient) -> None:
    assert client.get("/healthz", headers={"Host": "attacker.example"}).status_code == 400


def test_every_answer_carries_the_security_headers(client: TestClient) -> None:
    for answer in (client.get("/healthz"), client.get("/api/v1/gpus"), client.get("/")):
        csp = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp
        assert "script-src 'self'" in csp
        assert "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
        assert answer.headers["x-content-type-options"] == "nosniff"
    docs = client.get("/docs").headers["content-security-policy"]
    assert "'sha256-" in docs  # Swagger UI's inline script, by its hash only


@pytest.fixture(scope="module")
def lenient(ids: LocalIdentities) -> TestClient:
    return app_client(ids, refusals_per_window=100_000)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(header=st.binary(max_size=300))
def test_a_hostile_authorization_header_is_a_401_never_a_500(lenient: TestClient, header: bytes) -> None:
    value = b"Bearer " + header.replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b"")
    answer = lenient.get("/api/v1/remediator", headers=[(b"Authorization", value.strip())])
    assert answer.status_code in (401, 403), answer.text


def test_role_claims_map_through_role_values_and_paths() -> None:
    claims = {"realm_access": {"roles": ["gpu-ops", "offline"]}, "r": "admin"}
    assert claim_at(claims, "realm_access.roles") == ["gpu-ops", "offline"]
    assert claim_at(claims, "missing.path") == []
    assert highest_role(["gpu-ops", "viewer"], {"gpu-ops": "operator"}) == "operator"
    assert highest_role(["nothing"], {}) is None


def test_shared_secret_algorithms_are_refused_in_settings() -> None:
    with pytest.raises(ValueError, match="algorithms"):
        AuthSection(algorithms=["HS256"])
    with pytest.raises(ValueError, match="https"):
        AuthSection(jwks_url="http://idp.example/jwks")


def test_local_mode_writes_private_files_and_no_token_in_its_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.api.local_tokens import main

    assert main([str(tmp_path / "auth")]) == 0
    said = capsys.readouterr()
    for role in ROLES:
        token = (tmp_path / "auth" / f"{role}.token").read_text().strip()
        assert token not in said.out + said.err
        assert (tmp_path / "auth" / f"{role}.token").stat().st_mode & 0o077 == 0
    assert (tmp_path / "auth").stat().st_mode & 0o077 == 0
    key = (tmp_path / "auth" / "signing-key.pem").read_bytes()
    main([str(tmp_path / "auth")])
    assert (tmp_path / "auth" / "signing-key.pem").read_bytes() == key  # kept: old tokens stay valid
