"""Signed verdicts at the verify boundary: what the scorer signs verifies, and nothing else does (hostile
headers, flipped bits, another topic or key, an unknown or dropped key); the keyring, rotation, keygen."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from shared.contract.signing import (
    KID_HEADER,
    SIG_HEADER,
    Keyring,
    Signer,
    UntrustedError,
    key_id,
    key_ids,
    keygen,
    main,
    signed_bytes,
)
from shared.plumbing.errors import ConfigError
from shared.plumbing.kafka import encode_json
from tests.helpers.hostile import ANY_JSON

PUBLIC_PEM = serialization.PublicFormat.SubjectPublicKeyInfo
KEY = Ed25519PrivateKey.generate()
SIGNER = Signer(KEY)
RING = Keyring.of(KEY.public_key())
TOPIC, GPU = "gpu-health", "GPU-00000001-0000-4000-8000-000000000000"
VERDICT: dict[str, Any] = {
    "schema_version": 1,
    "time": "2026-11-20T12:00:00.000Z",
    "gpu_uuid": GPU,
    "hostname": "gpu-node-00",
    "action": "reset_gpu",
    "evidence": {"xid": 79, "ratio": 0.1, "big": 1e16},
}


def produced(
    value: Any = VERDICT, *, topic: str = TOPIC, key: str = GPU
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The value's bytes and headers as the scorer's producer sends them."""
    return encode_json(value), list(SIGNER.headers(topic, key, value).items())


def verify(value: bytes | None, headers: Any, *, topic: str = TOPIC, key: bytes | None = GPU.encode()) -> Any:
    return RING.verify(topic=topic, key=key, value=value, headers=headers).value


def refused(value: bytes | None, headers: Any, **where: Any) -> str:
    with pytest.raises(UntrustedError) as e:
        verify(value, headers, **where)
    return e.value.reason


def test_what_the_scorer_signs_verifies_as_the_value_it_sent() -> None:
    value, headers = produced()
    assert verify(value, headers) == VERDICT
    assert RING.verify(topic=TOPIC, key=GPU.encode(), value=value, headers=headers).kid == SIGNER.kid


def test_the_signature_covers_content_not_spacing() -> None:
    """The canonical bytes are signed: the same object written with other spacing or key order verifies."""
    _, headers = produced()
    respaced = json.dumps(dict(reversed(list(VERDICT.items()))), indent=2).encode()
    assert verify(respaced, headers) == VERDICT


def test_the_key_id_is_the_public_keys_hash() -> None:
    raw = KEY.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert key_id(KEY.public_key()) == hashlib.sha256(raw).hexdigest()[:16] == SIGNER.kid


def test_signed_bytes_bind_topic_and_key() -> None:
    assert signed_bytes(TOPIC, b"k", {"a": 1}) == b'gpu-health-sig-v1\ngpu-health\nk\n{"a":1}'
    assert signed_bytes(TOPIC, None, {"a": 1}) == b'gpu-health-sig-v1\ngpu-health\n\n{"a":1}'


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (None, "unsigned"),
        ([], "unsigned"),
        ([("other", b"x")], "unsigned"),
        ([(KID_HEADER, b"0123456789abcdef")], "bad_signature"),  # one of the two
        ([(SIG_HEADER, base64.b64encode(bytes(64)))], "bad_signature"),
        ([(KID_HEADER, b"not-a-kid"), (SIG_HEADER, base64.b64encode(bytes(64)))], "bad_signature"),
        ([(KID_HEADER, b"0123456789abcdef"), (SIG_HEADER, base64.b64encode(bytes(64)))], "unknown_key"),
        ([(KID_HEADER, None), (SIG_HEADER, None)], "bad_signature"),
    ],
)
def test_missing_and_malformed_headers_are_refused(headers: Any, reason: str) -> None:
    assert refused(produced()[0], headers) == reason


def test_a_repeated_header_is_refused_even_when_one_copy_holds() -> None:
    value, headers = produced()
    forged = (KID_HEADER, SIGNER.kid.encode())
    assert refused(value, [*headers, forged]) == "bad_signature"


def test_a_signature_of_the_wrong_length_or_not_base64_is_refused() -> None:
    value, headers = produced()
    kid = dict(headers)[KID_HEADER]
    for sig in (b"%%%%", base64.b64encode(bytes(63)), base64.b64encode(bytes(65)), b"A" * 300, b""):
        assert refused(value, [(KID_HEADER, kid), (SIG_HEADER, sig)]) == "bad_signature"


def test_the_wrong_key_signing_is_refused_as_a_bad_signature() -> None:
    """A forger who knows the trusted key id but not its private key."""
    value = encode_json(VERDICT)
    forged = Ed25519PrivateKey.generate().sign(signed_bytes(TOPIC, GPU.encode(), VERDICT))
    headers = [(KID_HEADER, SIGNER.kid.encode()), (SIG_HEADER, base64.b64encode(forged))]
    assert refused(value, headers) == "bad_signature"


def test_replayed_onto_another_topic_or_key_is_refused() -> None:
    value, headers = produced()
    assert refused(value, headers, topic="gpu-alerts") == "bad_signature"
    assert refused(value, headers, key=b"GPU-00000002-0000-4000-8000-000000000000") == "bad_signature"
    assert refused(value, headers, key=None) == "bad_signature"


def test_a_value_that_is_not_a_json_object_is_invalid() -> None:
    _, headers = produced()
    for value in (None, b"", b"\xff\xfe", b"[1]", b'{"a":NaN}', b'{"a":1,"a":2}', b"[" * 100_000):
        assert refused(value, headers) in ("invalid",)


@given(st.data())
def test_any_flipped_bit_of_value_headers_topic_or_key_is_refused(data: st.DataObject) -> None:
    value, headers = produced()
    kid, sig = dict(headers)[KID_HEADER], dict(headers)[SIG_HEADER]
    target = data.draw(st.sampled_from(["value", "kid", "sig", "topic", "key"]))
    parts = {"value": value, "kid": kid, "sig": sig, "topic": TOPIC.encode(), "key": GPU.encode()}
    raw = bytearray(parts[target])
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    parts[target] = bytes(raw)
    try:
        got = RING.verify(
            topic=parts["topic"].decode("utf-8", "replace"),
            key=parts["key"],
            value=parts["value"],
            headers=[(KID_HEADER, parts["kid"]), (SIG_HEADER, parts["sig"])],
        )
    except UntrustedError:
        return
    # a flip that leaves the content the same (a space, base64's ignored bits) may verify: the same message
    assert got.value == VERDICT
    assert target in ("value", "sig")


@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from([KID_HEADER, SIG_HEADER, "gh-kid ", "GH-KID", "x"]),
            st.none() | st.binary(max_size=300) | st.text(max_size=100),
        ),
        max_size=6,
    )
)
def test_hostile_headers_never_verify_and_never_raise_anything_else(headers: list[tuple[str, Any]]) -> None:
    with pytest.raises(UntrustedError):
        verify(produced()[0], headers)


@given(value=st.dictionaries(st.text(max_size=8), ANY_JSON, max_size=5), key=st.binary(max_size=40))
def test_any_json_object_signed_verifies_and_only_under_its_topic_and_key(
    value: dict[str, Any], key: bytes
) -> None:
    try:
        payload = encode_json(value)
        sig = KEY.sign(signed_bytes(TOPIC, key, value))
    except Exception:
        return
    headers = [(KID_HEADER, SIGNER.kid.encode()), (SIG_HEADER, base64.b64encode(sig))]
    assert RING.verify(topic=TOPIC, key=key, value=payload, headers=headers).value == json.loads(payload)
    assert refused(payload, headers, topic="gpu-alerts", key=key) == "bad_signature"
    assert refused(payload, headers, key=key + b"x") == "bad_signature"


def test_rotation_old_and_new_both_trusted_then_the_old_dropped(tmp_path: Path) -> None:
    old_kid, old_private, old_public = keygen(tmp_path, "scorer-1")
    new_kid, new_private, _ = keygen(tmp_path, "scorer-2")
    trusted = tmp_path / "trusted"
    old, new = Signer.load(old_private), Signer.load(new_private)
    by_old, by_new = (
        (encode_json(VERDICT), list(s.headers(TOPIC, GPU, VERDICT).items())) for s in (old, new)
    )
    both = Keyring.load(trusted)
    assert set(both.keys) == {old_kid, new_kid}
    for value, headers in (by_old, by_new):
        assert both.verify(topic=TOPIC, key=GPU.encode(), value=value, headers=headers).value == VERDICT
    old_public.unlink()  # the old key dropped once nothing it signed can still be fresh
    only_new = Keyring.load(trusted)
    assert set(only_new.keys) == {new_kid}
    assert only_new.verify(topic=TOPIC, key=GPU.encode(), value=by_new[0], headers=by_new[1]).kid == new_kid
    with pytest.raises(UntrustedError) as e:
        only_new.verify(topic=TOPIC, key=GPU.encode(), value=by_old[0], headers=by_old[1])
    assert e.value.reason == "unknown_key"


def test_a_keyring_file_may_hold_several_keys(tmp_path: Path) -> None:
    a, b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    pem = b"".join(
        k.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for k in (a, b)
    )
    (tmp_path / "ring.pem").write_bytes(b"# the scorer's keys\n" + pem)
    assert set(Keyring.load(tmp_path / "ring.pem").keys) == {key_id(a.public_key()), key_id(b.public_key())}


@pytest.mark.parametrize(
    "content",
    [b"", b"not a key", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"],
)
def test_a_keyring_with_no_valid_key_is_a_config_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "ring.pem").write_bytes(content)
    with pytest.raises(ConfigError):
        Keyring.load(tmp_path / "ring.pem")


def test_a_keyring_holding_a_private_key_is_refused_and_does_not_quote_it(tmp_path: Path) -> None:
    _, private, _ = keygen(tmp_path)
    with pytest.raises(ConfigError) as e:
        Keyring.load(private)
    assert "PRIVATE KEY block" in str(e.value)
    assert private.read_text().splitlines()[1] not in str(e.value)


def test_an_empty_or_missing_keyring_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Keyring.load(tmp_path)  # a directory without *.pem
    with pytest.raises(ConfigError):
        Keyring.load(tmp_path / "missing.pem")


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path: Path) -> None:
    kid, private, public = keygen(tmp_path)
    assert (private, public) == (tmp_path / "private" / "scorer.key", tmp_path / "trusted" / "scorer.pem")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(private.parent.stat().st_mode) == 0o700
    assert Signer.load(private).kid == kid == key_ids(public)[0] == key_ids(private)[0]
    with pytest.raises(ConfigError, match="never overwritten"):
        keygen(tmp_path)
    assert keygen(tmp_path, if_missing=True) == (kid, private, public)  # make up's second start


def test_a_signing_key_others_can_read_is_refused(tmp_path: Path) -> None:
    _, private, _ = keygen(tmp_path)
    private.chmod(0o644)
    with pytest.raises(ConfigError, match="readable or writable by others"):
        Signer.load(private)


def test_a_signing_key_that_is_not_ed25519_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "ec.key"
    path.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="Ed25519"):
        Signer.load(path)


def test_the_command_prints_the_key_id_and_paths_never_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keygen", str(tmp_path), "--name", "scorer-2026"]) == 0
    out = capsys.readouterr().out
    private = tmp_path / "private" / "scorer-2026.key"
    assert out.startswith("key ")
    assert str(private) in out
    assert "BEGIN" not in out
    assert main(["kid", str(tmp_path / "trusted")]) == 0
    assert Signer.load(private).kid in capsys.readouterr().out
    assert main(["keygen", str(tmp_path), "--name", "scorer-2026"]) == 1  # exists: never overwritten
    assert main(["keygen", str(tmp_path), "--name", "../escape"]) == 1
