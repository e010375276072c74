"""Inbound offers: a cap per peer and in total, replays dropped, so a flood of valid signed offers costs
a bounded number of connection attempts."""

from engine.p2p.admission import InboundAdmission, Verdict, ice_ufrag

SDP = "v=0\r\na=ice-ufrag:{u}\r\na=ice-pwd:x\r\n"


def test_caps_per_peer_and_in_total() -> None:
    a = InboundAdmission(per_peer=2, total=3)
    assert a.admit("p", "s1", SDP.format(u="u1")) is Verdict.ANSWER
    assert a.admit("p", "s2", SDP.format(u="u2")) is Verdict.ANSWER
    assert a.admit("p", "s3", SDP.format(u="u3")) is Verdict.PEER_BUSY
    assert a.admit("q", "s4", SDP.format(u="u4")) is Verdict.ANSWER
    assert a.admit("r", "s5", SDP.format(u="u5")) is Verdict.FULL
    a.done("p")
    assert a.in_flight == 2
    assert a.admit("r", "s5", SDP.format(u="u5")) is Verdict.ANSWER
    assert (a.stats.answered, a.stats.peer_busy, a.stats.full, a.stats.peak_in_flight) == (4, 1, 1, 3)


def test_replays_are_dropped_by_session_and_by_ufrag() -> None:
    a = InboundAdmission()
    assert a.admit("p", "s1", SDP.format(u="u1")) is Verdict.ANSWER
    a.done("p")
    assert a.admit("p", "s1", SDP.format(u="u1")) is Verdict.DUPLICATE
    assert a.admit("p", "s2", SDP.format(u="u1")) is Verdict.DUPLICATE  # same ICE credentials
    assert a.admit("q", "s1", SDP.format(u="u1")) is Verdict.ANSWER  # another sender's own offer
    assert a.stats.duplicate == 2
    assert a.in_flight == 1


def test_refused_offers_do_not_count_as_seen() -> None:
    a = InboundAdmission(per_peer=1)
    assert a.admit("p", "s1", SDP.format(u="u1")) is Verdict.ANSWER
    assert a.admit("p", "s2", SDP.format(u="u2")) is Verdict.PEER_BUSY
    a.done("p")
    assert a.admit("p", "s2", SDP.format(u="u2")) is Verdict.ANSWER  # a retry once there is room


def test_memory_of_seen_offers_is_bounded() -> None:
    a = InboundAdmission(per_peer=10_000, total=10_000, remember=10)
    for i in range(100):
        a.admit("p", f"s{i}", "")
    assert len(a._seen) == 10
    assert ice_ufrag("a=ice-ufrag:abc\r\n") == "abc" and ice_ufrag("") is None
