"""Reading a kubeconfig: certificates inline or as files, tokens; what is unsafe or unsupported is refused."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest
import yaml

from services.remediator.drivers.kubeconfig import load_kubeconfig
from shared.plumbing.errors import ConfigError


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a client certificate signed by it (openssl, as the API server's set-up makes them)."""
    folder = tmp_path_factory.mktemp("pki")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=gpuhealth-remediator",
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.crt",
        "-days",
        "1",
    )
    return folder


def kubeconfig(folder: Path, cluster: dict[str, object], user: dict[str, object], **top: object) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    } | top
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_inline_certificates(pki: Path) -> None:
    path = kubeconfig(
        pki,
        {"server": "https://127.0.0.1:16443", "certificate-authority-data": b64(pki / "ca.crt")},
        {"client-certificate-data": b64(pki / "client.crt"), "client-key-data": b64(pki / "client.key")},
    )
    access = load_kubeconfig(path)
    assert access.server == "https://127.0.0.1:16443"
    assert access.headers == {}
    assert access.user == "u"
    assert not list(Path("/tmp").glob("gpuhealth-kube-*/client.key"))  # the key's temporary copy is gone


def test_files_relative_to_the_kubeconfig_and_a_token(pki: Path) -> None:
    path = kubeconfig(
        pki, {"server": "https://h:6443/", "certificate-authority": "ca.crt"}, {"token": "s3cret"}
    )
    access = load_kubeconfig(path)
    assert access.server == "https://h:6443"
    assert access.headers == {"Authorization": "Bearer s3cret"}


@pytest.mark.parametrize(
    ("cluster", "user", "message"),
    [
        ({"server": "http://h:8080"}, {}, "https://"),
        ({"server": "https://h", "insecure-skip-tls-verify": True}, {}, "insecure-skip-tls-verify"),
        ({"server": "https://h"}, {"exec": {"command": "aws"}}, "exec and auth-provider"),
        ({"server": "https://h", "certificate-authority-data": "!!!"}, {}, "not base64"),
        ({"server": "https://h", "certificate-authority-data": b64(Path(__file__))}, {}, "unusable"),
        ({"server": "https://h", "certificate-authority": "absent.crt"}, {}, "cannot read"),
        ({"server": "https://h"}, {"client-certificate-data": "AAAA"}, "needs its key"),
    ],
)
def test_what_is_unsafe_or_unusable_is_refused(
    pki: Path, cluster: dict[str, object], user: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_kubeconfig(kubeconfig(pki, cluster, user))


def test_a_missing_context_or_a_file_that_is_no_kubeconfig(pki: Path) -> None:
    path = kubeconfig(pki, {"server": "https://h"}, {}, **{"current-context": "elsewhere"})
    with pytest.raises(ConfigError, match="no context named 'elsewhere'"):
        load_kubeconfig(path)
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="not a kubeconfig"):
        load_kubeconfig(path)
    path.write_text("key: [unclosed")
    with pytest.raises(ConfigError, match="cannot read"):
        load_kubeconfig(path)
