"""Task identities without Kafka: the keyring, the signature, the index's rule, 128-bit owners.

The broker-side behaviour (forged records, pipelines, retention, rotation across processes,
the upgrade from 8fd441c) is in test_identity_records.py and test_upgrade_8fd441c.py.
"""

from __future__ import annotations

import base64
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.layout import merged
from support.legacy_index import legacy_marker_value, legacy_task_value

from bridge.config import Settings
from bridge.envelope import TaskEvent
from bridge.log.identity import (
    IDENTITY_HEADER,
    Keyring,
    KeyringError,
    identity_message,
    is_signed,
    keyring_env,
    load_keyring,
    parse_keyring,
)
from bridge.log.records import task_facts_of
from bridge.log.seqindex import (
    FLAG_OWNER_PREFIX,
    UNSIGNED_UNDECIDED,
    MarkerRecord,
    PartitionIndex,
    TaskEntry,
    TaskIdentity,
    TaskRecord,
    decode_index_record,
    marker_key,
    owner_key,
    task_key,
)
from bridge.log.updates import TaskUpdate, UpdateRecordError, decode_update
from bridge.tasks.create import identity_header
from bridge.tasks.messages import owner_digest
from bridge.vocabulary import CreatedPayload, TaskEventTypes, TaskStatus

PREFIX = "io.mcpbridge"
OWN = TaskEventTypes.of(PREFIX)
#: Two owner digests with the same first 64 bits: 8fd441c could not tell them apart.
ALICE = "0123456789abcdef" + "0" * 16
TWIN = "0123456789abcdef" + "f" * 16


def ring(*ids: str) -> Keyring:
    return Keyring([(kid, kid.encode() * 32) for kid in ids])


def created(owner: str = ALICE, **changes: object) -> CreatedPayload:
    fields: dict[str, object] = {
        "tool": "parked",
        "owner": owner,
        "createdMs": 1_000,
        "ttlMs": 60_000,
        "pollIntervalMs": 500,
    }
    fields.update(changes)
    return CreatedPayload.model_validate(fields)


def signed_by(keys: Keyring, task_id: str, payload: CreatedPayload, seen_as: str = "t") -> bool:
    """Whether the indexer takes ``payload``, signed for ``task_id``, as record ``seen_as``."""
    header = identity_header(keys, OWN.created, task_id, payload)
    event = TaskEvent(OWN.created, payload.to_dict(), None, 0)
    _, _, identity = task_facts_of(event, PREFIX)
    return is_signed(keys, seen_as, event, identity, [header])


# --- the keyring and the signature ----------------------------------------------------------


def test_a_signature_verifies_under_the_ring_that_made_it():
    assert signed_by(ring("k1"), "t", created())


@pytest.mark.parametrize(
    "changes",
    [
        {"owner": TWIN},
        {"createdMs": 1_001},
        {"ttlMs": None},
        {"ttlMs": 60_001},
        {"pollIntervalMs": 501},
        {"tool": "other"},
    ],
)
def test_a_signature_covers_every_identity_field(changes):
    keys = ring("k1")
    header = identity_header(keys, OWN.created, "t", created())
    event = TaskEvent(OWN.created, created(**changes).to_dict(), None, 0)
    _, _, identity = task_facts_of(event, PREFIX)
    assert not is_signed(keys, "t", event, identity, [header])


def test_a_signature_is_bound_to_its_task_id_and_type():
    keys = ring("k1")
    assert not signed_by(keys, "t", created(), seen_as="u")
    identity = TaskIdentity(owner_key(ALICE), 1_000, 60_000, 500)
    message = identity_message(OWN.created, "t", identity, "parked")
    header = keys.sign(message)
    assert keys.verify(message, header)
    assert not keys.verify(
        identity_message(f"{PREFIX}x.task.created", "t", identity, "parked"), header
    )


def test_fields_are_length_prefixed_so_no_two_identities_share_an_encoding():
    identity = TaskIdentity(owner_key(ALICE), 1_000, 60_000, 500)
    assert identity_message(OWN.created, "ab", identity, "c") != identity_message(
        OWN.created, "a", identity, "bc"
    )


@pytest.mark.parametrize(
    "header",
    [
        None,
        b"",
        b"v1.k1",
        b"v2.k1.AAAA",
        b"v1.k9.AAAA",
        b"v1.k1.!!!!",
        b"v1.k1." + b"A" * 200,
        b"v1.k1.AAAA.AAAA",
        "v1.k1.é".encode(),
    ],
)
def test_a_malformed_or_unknown_signature_verifies_nothing(header):
    assert not ring("k1").verify(b"message", header)


def test_a_rotated_ring_still_verifies_the_old_keys_signatures_and_signs_with_the_new():
    old, rotated, dropped = ring("k1"), ring("k2", "k1"), ring("k2")
    message = b"an identity"
    assert rotated.verify(message, old.sign(message))  # tasks created before the rotation
    assert rotated.sign(message).startswith(b"v1.k2.")
    assert old.verify(message, rotated.sign(message)) is False  # the new key is new
    assert not dropped.verify(message, old.sign(message))  # why old keys stay listed


def test_the_keyring_text_is_parsed_and_bad_text_refused_without_echoing_keys():
    secret = base64.b64encode(b"s" * 32).decode()
    keys = parse_keyring(f"# rotated 2026-12\n\nk2 {secret}\nk1 {secret}\n")
    assert keys.current == "k2" and keys.key_ids == ["k2", "k1"]
    assert secret not in repr(keys)
    short = base64.b64encode(b"s" * 31).decode()
    for text, why in [
        ("", "at least one key"),
        (f"k1 {secret} extra", "line 1"),
        ("k1 not-base64!", "not base64"),
        (f"k1 {short}", "fewer than 32 bytes"),
        (f"k1 {secret}\nk1 {secret}", "twice"),
        (f"k.1 {secret}", "key id"),
    ]:
        with pytest.raises(KeyringError, match=why) as caught:
            parse_keyring(text)
        assert secret not in str(caught.value)


def test_the_configured_keyring_is_a_secret_the_settings_never_show(tmp_path: Path):
    secret = base64.b64encode(b"q" * 32).decode()
    settings = Settings(identity={"keys": f"k1 {secret}"})
    assert secret not in repr(settings) and secret not in str(settings.model_dump())
    assert load_keyring(settings).key_ids == ["k1"]
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"k7 {secret}\n")
    from_file = Settings(identity={"keys_file": str(keys_file), "keys": f"k1 {secret}"})
    assert load_keyring(from_file).key_ids == ["k7"]  # the file wins


def test_replicas_without_a_keyring_share_a_key_derived_from_the_peer_secret():
    group = {
        "replicas": {"ownership": "group"},
        "peers": {"advertised_url": "http://bridge-0:8081", "secret": "p" * 40},
    }
    one, other = load_keyring(Settings(**group)), load_keyring(Settings(**group))
    assert other.verify(b"m", one.sign(b"m"))
    changed = load_keyring(Settings(**merged(group, {"peers": {"secret": "q" * 40}})))
    assert not changed.verify(b"m", one.sign(b"m"))


def test_one_process_without_a_keyring_makes_a_private_development_key_once(tmp_path: Path):
    path = tmp_path / "state" / "identity.keys"
    settings = Settings(identity={"dev_keys_file": str(path)})
    first = load_keyring(settings)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = load_keyring(settings)  # the file is reused: restarts verify what was signed
    assert again.verify(b"m", first.sign(b"m"))


def test_one_process_that_cannot_keep_a_development_key_refuses_to_start(tmp_path: Path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    settings = Settings(identity={"dev_keys_file": str(blocker / "identity.keys")})
    with pytest.raises(KeyringError, match="BRIDGE_IDENTITY__KEYS_FILE"):
        load_keyring(settings)


# --- the index's rule -----------------------------------------------------------------------

IDENTITY = TaskIdentity(owner_key(ALICE), 1_000, 60_000, 500)


def test_an_unsigned_task_created_defines_nothing_and_is_counted():
    idx = PartitionIndex(0, 64)
    assert idx.apply("t", 0, created=True, identity=IDENTITY, signed=False) == 0
    entry = idx.get("t")
    assert entry.owner == 0 and entry.status is TaskStatus.UNKNOWN
    assert idx.refused == 1
    assert idx.apply("t", 0, created=True, identity=IDENTITY) is None  # a re-read: not again
    assert idx.refused == 1
    assert idx.apply("u", 1, created=True, identity=IDENTITY, signed=True) == 0
    assert idx.get("u").owned_by(owner_key(ALICE)) and idx.refused == 1


def test_a_signed_record_without_a_readable_identity_defines_nothing():
    idx = PartitionIndex(0, 64)
    idx.apply("t", 0, created=True, identity=None, signed=True)
    assert idx.get("t").owner == 0 and idx.get("t").status is TaskStatus.UNKNOWN


def test_unsigned_records_below_the_upgrade_offset_define_their_task_and_none_after():
    idx = PartitionIndex(0, 64, unsigned_below=2)
    idx.apply("old", 1, created=True, identity=IDENTITY)
    idx.apply("new", 2, created=True, identity=IDENTITY)
    assert idx.get("old").owned_by(owner_key(ALICE))
    assert idx.get("new").owner == 0 and idx.refused == 1


def test_an_undecided_upgrade_offset_honours_no_unsigned_record():
    idx = PartitionIndex(0, 64, unsigned_below=UNSIGNED_UNDECIDED)
    idx.apply("t", 0, created=True, identity=IDENTITY)
    assert idx.get("t").owner == 0


def test_after_a_loss_no_unsigned_record_defines_a_task_even_below_the_upgrade_offset():
    idx = PartitionIndex(0, 64, unsigned_below=1_000)
    idx.mark_lost(100)  # the first retained record of a task may be any later one
    idx.apply("t", 100, created=True, identity=IDENTITY)
    assert idx.get("t").owner == 0
    idx.apply("u", 101, created=True, identity=IDENTITY, signed=True)
    assert idx.get("u").owned_by(owner_key(ALICE))


# --- 128-bit owners and the index record versions -------------------------------------------


def test_owners_are_compared_on_all_128_bits():
    idx = PartitionIndex(0, 64)
    idx.apply("t", 0, created=True, identity=IDENTITY, signed=True)
    entry = idx.get("t")
    assert entry.owned_by(owner_key(ALICE))
    assert not entry.owned_by(owner_key(TWIN))
    assert not TaskEntry().owned_by(0)  # no owner is nobody's


@pytest.mark.parametrize("digest", ["0" * 31, "0" * 33, "A" * 32, "+" + "0" * 31, "0_" * 16])
def test_an_owner_digest_is_exactly_32_lowercase_hex_digits(digest):
    with pytest.raises(ValueError):
        owner_key(digest)
    assert owner_key(owner_digest("alice")) >> 64  # 128 bits: the first 64 are not lost


def test_a_current_task_record_keeps_the_whole_owner():
    idx = PartitionIndex(4, 64)
    idx.apply("t", 7, created=True, identity=IDENTITY, signed=True)
    record = decode_index_record(task_key("t"), idx.encode_task("t"))
    assert isinstance(record, TaskRecord) and record.version == 3
    assert record.entry == idx.get("t") and record.entry.owner == owner_key(ALICE)


@pytest.mark.parametrize("version", [1, 2])
def test_a_task_record_of_8fd441c_keeps_its_owner_compared_on_the_64_bits_it_holds(version):
    idx = PartitionIndex(4, 64)
    idx.apply("t", 7, created=True, identity=IDENTITY, signed=True)
    record = decode_index_record(task_key("t"), legacy_task_value(idx.get("t"), 4, version))
    assert isinstance(record, TaskRecord) and record.version == version
    entry = record.entry
    assert entry.flags & FLAG_OWNER_PREFIX
    assert entry.owned_by(owner_key(ALICE)) and entry.owned_by(owner_key(TWIN))
    assert not entry.owned_by(owner_key(owner_digest("mallory")))
    # Persisted again (version 3), it still says what it does not know.
    again = decode_index_record(task_key("t"), entry.encode(4))
    assert isinstance(again, TaskRecord) and again.entry == entry


def test_a_task_record_of_8fd441c_without_an_owner_stays_ownerless():
    entry = TaskEntry()
    record = decode_index_record(task_key("t"), legacy_task_value(entry, 0))
    assert isinstance(record, TaskRecord) and record.entry.owner == 0
    assert not record.entry.flags & FLAG_OWNER_PREFIX


def test_markers_carry_the_upgrade_offset_and_an_old_marker_says_it_has_none():
    idx = PartitionIndex(3, 64, through=77, lost_before=5, unsigned_below=40)
    assert decode_index_record(marker_key(3), idx.marker()) == MarkerRecord(3, 77, 5, 3, 40)
    old = decode_index_record(marker_key(3), legacy_marker_value(77, 5))
    assert isinstance(old, MarkerRecord) and old.version == 2 and old.unsigned_below == 0


# --- task-updates records -------------------------------------------------------------------


def test_an_update_names_its_whole_owner_and_a_reader_matches_all_128_bits():
    update = TaskUpdate(owner_key(ALICE), "t", 0, "working", 0, 1, 2)
    read = decode_update(update.key(), update.value())
    assert read == update and read.matches(owner_key(ALICE))
    assert not read.matches(owner_key(TWIN))


def test_an_update_written_by_8fd441c_is_matched_on_its_key():
    value = b'{"v":1,"taskId":"t","seq":0,"status":"working","partition":0,"offset":1,"ts":2}'
    read = decode_update(ALICE[:16].encode(), value)
    assert not read.full_owner and read.matches(owner_key(ALICE))
    assert not read.matches(owner_key(owner_digest("mallory")))


def test_an_update_whose_owner_disagrees_with_its_key_is_unreadable():
    update = TaskUpdate(owner_key(ALICE), "t", 0, "working", 0, 1, 2)
    with pytest.raises(UpdateRecordError):
        decode_update(b"ffffffffffffffff", update.value())


def test_the_identity_header_is_named_as_documented():
    assert IDENTITY_HEADER == "mcpbridge-identity"


def test_settings_with_an_unusable_keyring_are_refused_at_load_without_the_key():
    secret = base64.b64encode(b"s" * 16).decode()
    with pytest.raises(ValueError, match="BRIDGE_IDENTITY__KEYS_FILE") as caught:
        Settings(identity={"keys": f"k1 {secret}"})
    assert "fewer than 32 bytes" in str(caught.value) and secret not in str(caught.value)


def test_a_child_process_is_given_the_same_keyring(tmp_path: Path):
    path = tmp_path / "identity.keys"
    dev = Settings(identity={"dev_keys_file": str(path)})
    env = keyring_env(dev)
    assert env == {"BRIDGE_IDENTITY__KEYS_FILE": str(path)} and path.is_file()
    child = Settings(
        replicas={"ownership": "group"},
        peers={"advertised_url": "http://b:8081", "secret": "p" * 40},
        identity={"keys_file": env["BRIDGE_IDENTITY__KEYS_FILE"]},
    )
    assert load_keyring(child).verify(b"m", load_keyring(dev).sign(b"m"))


def test_processes_starting_together_share_one_development_key(tmp_path: Path):
    path = tmp_path / "state" / "identity.keys"
    settings = Settings(identity={"dev_keys_file": str(path)})
    with ThreadPoolExecutor(8) as pool:
        rings = list(pool.map(lambda _: load_keyring(settings), range(16)))
    signature = rings[0].sign(b"m")
    assert all(ring.verify(b"m", signature) for ring in rings)
    assert sorted(p.name for p in path.parent.iterdir()) == ["identity.keys"]  # nothing aside
