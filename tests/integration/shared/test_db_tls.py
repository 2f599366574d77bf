"""The local PostgreSQL over TLS, verified: `make services` serves it with the local CA's certificate and the
services connect with sslmode=verify-full (scripts/env.sh); a server the CA did not sign is refused."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from shared.plumbing.db import connect
from shared.plumbing.errors import GpuHealthError
from shared.plumbing.local_pki import ensure_ca
from shared.settings.common import DatabaseSettings
from tests.helpers.kafka import local_tls_dir


@pytest.fixture
def verified(db_settings: DatabaseSettings) -> DatabaseSettings:
    ca = local_tls_dir() / "ca.pem"
    if not (local_tls_dir() / "postgres.pem").is_file():
        pytest.fail(
            f"no {local_tls_dir()}/postgres.pem: start PostgreSQL with `make services`", pytrace=False
        )
    return db_settings.model_copy(update={"sslmode": "verify-full", "sslrootcert": str(ca)})


def test_the_services_connect_over_verified_tls(verified: DatabaseSettings) -> None:
    with connect(verified) as conn:
        row = conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row is not None
    assert row[0] is True
    assert str(row[1]) in ("TLSv1.2", "TLSv1.3")


def test_a_server_another_ca_did_not_sign_is_refused(verified: DatabaseSettings, tmp_path: Path) -> None:
    ensure_ca(tmp_path)  # a CA of its own, which never signed the server's certificate
    stranger = verified.model_copy(update={"sslrootcert": str(tmp_path / "ca.pem")})
    with pytest.raises((GpuHealthError, psycopg.OperationalError), match="certificate verify failed"):
        connect(stranger).close()


def test_a_name_the_certificate_does_not_carry_is_refused(verified: DatabaseSettings) -> None:
    if verified.host not in ("127.0.0.1", "localhost"):
        pytest.fail(f"the local stack's database is on loopback, not {verified.host}", pytrace=False)
    by_other_name = verified.model_copy(
        update={"host": "127.0.0.2"}
    )  # loopback still, not in the certificate
    with pytest.raises((GpuHealthError, psycopg.OperationalError)):
        connect(by_other_name).close()
