"""Signed records, the local store's rules, and the uid -> key derivation. No network."""

import pytest

from engine.dht import BadSignature, ExpiredRecord, RecordTooLarge, StaleRecord
from engine.dht.ids import key_id_of, node_id_of
from engine.dht.keys import (
    declaration_slots,
    decode_declaration,
    encode_declaration,
    expert_slot,
    group_slots,
)
from engine.dht.records import (
    MAX_VALUE_BYTES,
    Record,
    check_fresh,
    decode_record,
    encode_record,
    sign_record,
    verify_record,
)
from engine.dht.storage import RecordStore, merge_latest
from engine.p2p import Identity

NOW = 1_000_000.0


@pytest.fixture(scope="module")
def alice() -> Identity:
    return Identity.generate()


@pytest.fixture(scope="module")
def bob() -> Identity:
    return Identity.generate()


def test_sign_verify_roundtrip(alice: Identity) -> None:
    record = sign_record(alice, "ffn.3.7", b"hello", NOW + 10, subkey="x")
    verify_record(record)
    assert record.owner == alice.peer_id
    again = decode_record(encode_record(record))
    assert again == record
    verify_record(again)


@pytest.mark.parametrize("field", ["key", "subkey", "value", "expiration"])
def test_tampered_record_fails(alice: Identity, field: str) -> None:
    record = sign_record(alice, "k", b"v", NOW + 10)
    changes: dict[str, object] = {"key": "k2", "subkey": "s", "value": b"w", "expiration": NOW + 99}
    forged = Record(**{**{f: getattr(record, f) for f in Record.__struct_fields__}, field: changes[field]})
    with pytest.raises(BadSignature):
        verify_record(forged)


def test_record_claiming_someone_elses_key_fails(alice: Identity, bob: Identity) -> None:
    """Bob signs a record naming Alice's public key (to write into her slot): rejected."""
    mine = sign_record(bob, "k", b"evil", NOW + 10)
    forged = Record(mine.key, mine.subkey, mine.value, mine.expiration, alice.public_key, mine.signature)
    assert forged.owner == alice.peer_id
    with pytest.raises(BadSignature):
        verify_record(forged)


def test_sizes_and_expiry(alice: Identity) -> None:
    with pytest.raises(RecordTooLarge):
        sign_record(alice, "k", b"x" * (MAX_VALUE_BYTES + 1), NOW + 10)
    record = sign_record(alice, "k", b"v", NOW + 10)
    check_fresh(record, NOW, 60)
    with pytest.raises(ExpiredRecord):
        check_fresh(record, NOW + 11, 60)
    with pytest.raises(ExpiredRecord):
        check_fresh(record, NOW - 100, 60)  # expires too far ahead


def test_store_slots_per_owner(alice: Identity, bob: Identity) -> None:
    store = RecordStore()
    kid = key_id_of("ffn.3.")
    a1 = sign_record(alice, "ffn.3.", b"a1", NOW + 10, subkey="7")
    a0 = sign_record(alice, "ffn.3.", b"a0", NOW + 5, subkey="7")
    a2 = sign_record(alice, "ffn.3.", b"a2", NOW + 20, subkey="7")
    b1 = sign_record(bob, "ffn.3.", b"b1", NOW + 30, subkey="7")
    store.put(kid, a1, NOW)
    with pytest.raises(StaleRecord):
        store.put(kid, a0, NOW)  # older: refused
    with pytest.raises(StaleRecord):
        store.put(kid, a1, NOW)  # same: refused
    store.put(kid, b1, NOW)  # another owner: its own slot, Alice's untouched
    store.put(kid, a2, NOW)  # newer by the same owner: replaces
    held = {r.owner: r.value for r in store.get(kid, NOW)}
    assert held == {alice.peer_id: b"a2", bob.peer_id: b"b1"}
    assert len(store) == 2
    assert [r.value for r in store.get(kid, NOW + 25)] == [b"b1"]
    assert store.purge(NOW + 25) == 1 and len(store) == 1
    assert merge_latest([a1, a2, a0, b1])[(alice.peer_id, "7")] == a2


def test_store_is_bounded(alice: Identity) -> None:
    store = RecordStore(max_records=2)
    for i in range(2):
        store.put(key_id_of(f"k{i}"), sign_record(alice, f"k{i}", b"", NOW + 10), NOW)
    with pytest.raises(Exception, match="full"):
        store.put(key_id_of("k9"), sign_record(alice, "k9", b"", NOW + 10), NOW)


def test_declaration_slots() -> None:
    assert declaration_slots("ffn.3.7") == [("ffn.3.", "7"), ("ffn.", "3")]
    assert declaration_slots("ffn.0") == [("ffn.", "0")]
    assert expert_slot("ffn.3.7") == ("ffn.3.", "7")
    groups = group_slots(["ffn.3.7", "ffn.3.9", "ffn.4.7"])
    assert groups["ffn."] == {"3": "ffn.3.7", "4": "ffn.4.7"}
    assert groups["ffn.3."] == {"7": "ffn.3.7", "9": "ffn.3.9"}
    assert len(groups) == 2 + 1  # the prefixes only: no record under a full uid
    for bad in ["ffn", "ffn..3", ".3", "ffn.3."]:
        with pytest.raises(ValueError):
            declaration_slots(bad)
    d = decode_declaration(encode_declaration("ab" * 20, "ffn.3.7"))
    assert (d.host, d.uid) == ("ab" * 20, "ffn.3.7")


def test_ids() -> None:
    pid = Identity.generate().peer_id
    assert node_id_of(pid) == int(pid, 16) and node_id_of(pid).bit_length() <= 160
    with pytest.raises(Exception, match="hex"):
        node_id_of("zz" * 20)
