"""Callers known by the real kube-apiserver (GPUHEALTH_AUTH__MODE=tokenreview): a service account's token,
reviewed by the API server with the API's own credential (a service account bound to
system:auth-delegator), gives the role its namespace's group maps to; a token the API server does not
know, or a group that maps to nothing, is refused; the actor recorded is the Kubernetes user name."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.auth import AuthSection
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import api_section
from tests.helpers.kube import KubeAdmin


def token_of(kube: KubeAdmin, namespace: str, account: str) -> str:
    kube.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
              {"metadata": {"name": account}}, ok=(409,))  # fmt: skip
    granted = kube.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                        {"spec": {"expirationSeconds": 600}})  # fmt: skip
    token: str = granted["status"]["token"]
    return token


@pytest.fixture
def cluster(kube_admin: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Three namespaces (the API's reviewer, operators, strangers) and the reviewer's rights."""
    kube = KubeAdmin(kube_admin)
    tag = uuid.uuid4().hex[:8]
    spaces = {role: f"gh-auth-{role}-{tag}" for role in ("reviewer", "operators", "strangers")}
    try:
        for name in spaces.values():
            kube.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        reviewer = token_of(kube, spaces["reviewer"], "gpu-health-api")
        kube.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "metadata": {"name": f"gh-auth-{tag}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:auth-delegator"},
            "subjects": [{"kind": "ServiceAccount", "name": "gpu-health-api",
                          "namespace": spaces["reviewer"]}],
        })  # fmt: skip
        (tmp_path / "reviewer.token").write_text(reviewer)
        config = yaml.safe_load(kube_admin.read_text())
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
        (tmp_path / "ca.crt").write_bytes(ca)
        yield {
            "server": config["clusters"][0]["cluster"]["server"], "spaces": spaces, "dir": tmp_path,
            "operator": token_of(kube, spaces["operators"], "oncall"),
            "stranger": token_of(kube, spaces["strangers"], "someone"),
        }  # fmt: skip
    finally:
        kube.call(
            "DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/gh-auth-{tag}", ok=(404,)
        )
        for name in spaces.values():
            kube.call("DELETE", f"/api/v1/namespaces/{name}", ok=(404,))
        kube.close()


def test_the_kubernetes_api_server_says_who_calls_and_the_group_gives_the_role(
    cluster: dict[str, Any], migrated: DatabaseSettings
) -> None:
    operators = cluster["spaces"]["operators"]
    auth = AuthSection(
        mode="tokenreview", tokenreview_url=cluster["server"], tokenreview_ca_file=cluster["dir"] / "ca.crt",
        tokenreview_token_file=cluster["dir"] / "reviewer.token",
        group_roles={f"system:serviceaccounts:{operators}": "operator"},
    )  # fmt: skip
    with TestClient(create_app(migrated, api_section(), auth=auth)) as client:
        operator = {"Authorization": f"Bearer {cluster['operator']}"}
        assert client.get("/api/v1/remediator", headers=operator).status_code == 200
        # an operator may acknowledge (no such alert: 404, past the role check) but not pause
        assert client.post("/api/v1/alerts/1/acknowledge", headers=operator).status_code == 404
        refused = client.post("/api/v1/remediator/pause", headers=operator)
        assert refused.status_code == 403, refused.text
        assert f"system:serviceaccount:{operators}:oncall" in refused.json()["detail"]  # the user's name
        stranger = client.get(
            "/api/v1/remediator", headers={"Authorization": f"Bearer {cluster['stranger']}"}
        )
        assert stranger.status_code == 403, stranger.text  # known to the cluster, no role here
        forged = client.get("/api/v1/remediator", headers={"Authorization": "Bearer not-a-kubernetes-token"})
        assert forged.status_code == 401, forged.text
        metrics = client.get("/metrics").text
        assert 'gpuhealth_api_auth_refusals_total{reason="no_role"} 1.0' in metrics
        assert 'gpuhealth_api_auth_refusals_total{reason="invalid"} 1.0' in metrics
