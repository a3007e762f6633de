"""Secrets at rest (bridge.sealing): envelope encryption under a key file, bound to a context.

Pure: AES-256-GCM from ``cryptography``, key files in a temporary directory.
"""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

from bridge.cli import main
from bridge.sealing import KeyFileError, KeyRing, Sealer, SealError

SECRET = b'["whsec_c3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3M="]'
ONE = b"sub_one"


async def test_a_sealed_value_opens_to_its_plaintext_and_shows_none_of_it() -> None:
    sealer = Sealer(KeyRing("k1", {"k1": b"k" * 32}))
    sealed = await sealer.seal(SECRET, ONE)
    assert sealed["alg"] == "A256GCM" and sealed["kid"] == "k1"
    assert SECRET.decode() not in json.dumps(sealed) and b"whsec" not in json.dumps(sealed).encode()
    assert await sealer.open(sealed, ONE) == SECRET
    assert await sealer.seal(SECRET, ONE) != sealed  # a fresh data key and nonce every time


async def test_a_sealed_value_moved_to_another_subscription_does_not_open() -> None:
    sealer = Sealer(KeyRing("k1", {"k1": b"k" * 32}))
    sealed = await sealer.seal(SECRET, ONE)
    with pytest.raises(SealError):
        await sealer.open(sealed, b"sub_two")


@pytest.mark.parametrize("field", ["dek", "ct"])
async def test_an_altered_sealed_value_does_not_open(field: str) -> None:
    sealer = Sealer(KeyRing("k1", {"k1": b"k" * 32}))
    sealed = await sealer.seal(SECRET, ONE)
    blob = bytearray(base64.b64decode(sealed[field]))
    blob[-1] ^= 1
    altered = {**sealed, field: base64.b64encode(bytes(blob)).decode()}
    with pytest.raises(SealError):
        await sealer.open(altered, ONE)


@pytest.mark.parametrize(
    "sealed",
    [{}, {"alg": "none", "kid": "k1", "dek": "", "ct": ""}, {"alg": "A256GCM", "kid": "k1"}],
)
async def test_a_malformed_sealed_value_is_a_seal_error(sealed: dict[str, str]) -> None:
    with pytest.raises(SealError):
        await Sealer(KeyRing("k1", {"k1": b"k" * 32})).open(sealed, ONE)


async def test_a_rotation_keeps_older_values_open_and_seals_new_ones_under_the_new_key(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys.json"
    first = KeyRing.with_new_key(path)
    old = await Sealer(first).seal(SECRET, ONE)
    second = KeyRing.with_new_key(path)  # the documented rotation: a new current key
    assert second.current != first.current and set(second.keys) == {first.current, second.current}
    reloaded = Sealer(KeyRing.load(path))
    assert await reloaded.open(old, ONE) == SECRET
    new = await reloaded.seal(SECRET, ONE)
    assert new["kid"] == second.current
    # Once the old key is retired, what it sealed no longer opens (and says so).
    retired = Sealer(KeyRing(second.current, {second.current: second.keys[second.current]}))
    assert await retired.open(new, ONE) == SECRET
    with pytest.raises(SealError):
        await retired.open(old, ONE)


def test_a_key_file_is_readable_by_its_owner_only_and_no_repr_shows_a_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    ring = KeyRing.with_new_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key_text = json.loads(path.read_text())["keys"][ring.current]
    assert key_text not in repr(ring) and key_text not in repr(Sealer(ring))
    assert str(ring.keys[ring.current]) not in repr(ring)


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"current": "a", "keys": {}}',
        '{"current": "a", "keys": {"a": "c2hvcnQ="}}',
        '{"current": "a", "keys": {"a": "!!"}}',
        '{"keys": {"a": "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s="}}',
        '["a"]',
    ],
    ids=["not-json", "current-missing", "short-key", "not-base64", "no-current", "not-object"],
)
def test_a_malformed_key_file_is_refused_without_showing_its_content(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(KeyFileError) as refused:
        KeyRing.load(path)
    assert str(path) in str(refused.value)
    assert "c2hvcnQ" not in str(refused.value) and "a2tr" not in str(refused.value)


def test_bridge_webhooks_new_key_adds_a_current_key_and_keeps_the_older_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    assert main(["webhooks", "new-key", str(path)]) == 0
    first = KeyRing.load(path)
    assert main(["webhooks", "new-key", str(path)]) == 0
    second = KeyRing.load(path)
    assert second.current != first.current and first.current in second.keys
    assert json.loads(path.read_text())["keys"][second.current] not in capsys.readouterr().out
    path.write_text('{"current": "x", "keys": {"x": "not-a-key-c2VjcmV0"}}')
    assert main(["webhooks", "new-key", str(path)]) == 2
    assert "c2VjcmV0" not in capsys.readouterr().err


def test_a_missing_key_file_is_named_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read the key file"):
        KeyRing.load(tmp_path / "absent.json")
