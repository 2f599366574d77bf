"""A local certificate authority for the stack `make up` and compose run: Kafka identities, servers' TLS.

Each Kafka principal (shared.contract.topic_registry.PRINCIPALS, plus `broker`) gets a client
certificate whose subject is ``CN=<principal>``; the broker maps that CN to the
principal ``User:<principal>`` (scripts/services.sh) and its ACLs (shared/plumbing/topic_admin.py)
say what each may do. An anonymous client has no certificate and is refused at the
TLS handshake. PostgreSQL gets a server certificate too (``postgres``), which the
services verify (``sslmode=verify-full``). Everything lands in one folder outside the
checkout (``$GPUHEALTH_RUN/tls`` for `make up`, a volume in compose):

- ``ca.pem`` (the CA's certificate, what clients and the broker trust) and ``ca.key``;
- per principal ``<name>.pem`` (certificate) and ``<name>.key`` (PKCS#8 key, mode 0600), what
  librdkafka reads (``ssl.certificate.location``, ``ssl.key.location``);
- per principal ``<name>.p12`` with its password in ``<name>.p12.password``: the Java side's
  keystores (the broker's own, and the admin's for the bin/kafka-* tools), and ``<name>.properties``,
  a Java client's settings with that identity (``--command-config`` of Kafka's tools; mode 0600).

Idempotent: what exists and is still valid (CA-signed, names covered, more than 30 days
left) is kept, so a restart never changes an identity. Nothing here is logged but paths.
Command line: ``python -m shared.plumbing.local_pki DIR --hosts 127.0.0.1,localhost``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared.contract.topic_registry import PRINCIPALS

BROKER = "broker"
# The servers: Kafka's broker, and PostgreSQL (`make up`'s serves TLS with it; clients verify-full).
SERVERS = (BROKER, "postgres")
VALID_DAYS = 825
RENEW_BEFORE = dt.timedelta(days=30)


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    tmp.replace(path)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _still_good(cert: x509.Certificate) -> bool:
    return cert.not_valid_after_utc - _now() > RENEW_BEFORE


def ensure_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The folder's CA, made when missing or near its end (every identity is then reissued)."""
    cert_path, key_path = folder / "ca.pem", folder / "ca.key"
    if cert_path.is_file() and key_path.is_file():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if isinstance(key, ec.EllipticCurvePrivateKey) and _still_good(cert):
            return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("gpu-health local CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        0o600,
    )
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert, key  # an identity the old CA signed fails _current: it is reissued


def _sans(hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _current(folder: Path, name: str, ca: x509.Certificate, hosts: list[str]) -> bool:
    cert_path = folder / f"{name}.pem"
    needed = [folder / f"{name}.key", folder / f"{name}.p12", folder / f"{name}.p12.password"]
    if not cert_path.is_file() or not all(p.is_file() for p in needed):
        return False
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    if cert.issuer != ca.subject or not _still_good(cert):
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError):
        return False
    try:
        have = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        have = set()
    return set(_sans(hosts)) <= have


def ensure_identity(
    folder: Path, name: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], hosts: list[str]
) -> bool:
    """`name`'s certificate, key and keystore, issued when missing or stale; whether it was issued."""
    ca_cert, ca_key = ca
    if _current(folder, name, ca_cert, hosts):
        return False
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_sans(hosts)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    password = secrets.token_urlsafe(24)
    _write(
        folder / f"{name}.key",
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        0o600,
    )
    _write(folder / f"{name}.p12.password", password.encode(), 0o600)
    p12 = pkcs12.serialize_key_and_certificates(
        name.encode(), key, cert, [ca_cert], serialization.BestAvailableEncryption(password.encode())
    )
    _write(folder / f"{name}.p12", p12, 0o600)
    _write(folder / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM))
    return True


def java_client_properties(folder: Path, name: str) -> str:
    """A Java client's settings (Kafka's tools: --command-config) as `name`, over TLS with its keystore."""
    password = (folder / f"{name}.p12.password").read_text()
    return (
        "security.protocol=SSL\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={folder / 'ca.pem'}\n"
        "ssl.keystore.type=PKCS12\n"
        f"ssl.keystore.location={folder / f'{name}.p12'}\n"
        f"ssl.keystore.password={password}\n"
    )


def ensure_pki(
    folder: Path, hosts: list[str], principals: Iterable[str] = PRINCIPALS, servers: Iterable[str] = SERVERS
) -> list[str]:
    """The CA and every identity under `folder` (the servers' certificates name `hosts`); what was issued."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    ca = ensure_ca(folder)
    issued = []
    for name, names in (*((s, hosts) for s in servers), *((p, []) for p in principals)):
        if ensure_identity(folder, name, ca, names):
            issued.append(name)
        properties = java_client_properties(folder, name)
        path = folder / f"{name}.properties"
        if not path.is_file() or path.read_text() != properties:
            _write(path, properties.encode(), 0o600)
    return issued


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "folder", type=Path, help="where the CA and the identities live (outside the checkout)"
    )
    parser.add_argument("--hosts", default="127.0.0.1,localhost", help="the servers' names, comma-separated")
    args = parser.parse_args(argv)
    issued = ensure_pki(args.folder, [h for h in args.hosts.split(",") if h])
    print(f"{args.folder}: " + (f"issued {', '.join(issued)}" if issued else "every identity is current"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
