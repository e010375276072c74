import msgspec
import pytest

from engine.p2p.descriptions import sdp_fingerprints, sign_description, verify_description
from engine.p2p.errors import PeerMismatch
from engine.p2p.identity import Identity

SDP = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\na=fingerprint:sha-256 AA:BB:CC\r\n"


def test_valid_description_yields_its_fingerprints() -> None:
    alice, bob = Identity.generate(), Identity.generate()
    desc = sign_description(alice, "offer", SDP, bob.peer_id, "s1")
    assert verify_description(desc, expected_sender=alice.peer_id, me=bob.peer_id) == [
        ("sha-256", "AA:BB:CC")
    ]


def test_forgeries_are_refused() -> None:
    alice, bob, mallory = Identity.generate(), Identity.generate(), Identity.generate()
    good = sign_description(alice, "offer", SDP, bob.peer_id, "s1")
    # mallory signs with her own key but claims to be alice
    claimed = msgspec.structs.replace(
        sign_description(mallory, "offer", SDP, bob.peer_id, "s1"), sender=alice.peer_id
    )
    cases = {
        "someone else's key": claimed,
        "tampered sdp": msgspec.structs.replace(good, sdp=SDP.replace("AA", "EE")),
        "replayed to another": msgspec.structs.replace(good, recipient=mallory.peer_id),
        "stale": sign_description(alice, "offer", SDP, bob.peer_id, "s1"),
        "no fingerprint": sign_description(alice, "offer", "v=0\r\n", bob.peer_id, "s1"),
        "bad key length": msgspec.structs.replace(good, public_key=b"x"),
    }
    for name, desc in cases.items():
        now = desc.issued_at + 1000 if name == "stale" else None
        with pytest.raises(PeerMismatch):
            verify_description(desc, expected_sender=alice.peer_id, me=bob.peer_id, now=now)
        assert name


def test_fingerprint_parsing_is_case_insensitive() -> None:
    assert sdp_fingerprints("a=fingerprint:SHA-256 ab:cd\r\n") == [("sha-256", "AB:CD")]
