"""The frame reader's credit counters and every limit at its boundary: credit given back as bytes are
consumed, a full window accepted and one byte more refused, frames filled to their size.

Each test is named after the broken version of the code it refuses: see tests/mutation/ and `make mutation`.
"""

import pytest

from engine.p2p.errors import ProtocolError
from engine.p2p.framing import (
    DATA_OVERHEAD,
    Deframer,
    data_frames,
    parse_window,
    window_frame,
)


def feed_message(d: Deframer, message_id: int, size: int, max_frame: int = 1 << 16) -> int:
    """Feeds one whole message; returns its size once it completes."""
    done = []
    for frame in data_frames(message_id, [bytes(size)], max_frame):
        done += d.feed(frame)
    assert done == [(message_id, bytearray(size))]
    return size


# -- 1. credit accounting in release() -------------------------------------------------------------


def test_release_lowers_held_by_what_was_consumed() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19, grant_threshold=1 << 19)
    feed_message(d, 1, 300)
    feed_message(d, 2, 200)
    assert d.held == 500
    assert d.release(300) == 0
    assert d.held == 200
    assert d.release(200) == 500
    assert d.held == 0


def test_release_flushes_small_credit_once_nothing_is_held() -> None:
    # Far below the threshold: without the held == 0 flush, credit for small messages would stall.
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19, grant_threshold=1 << 19)
    feed_message(d, 1, 10)
    assert d.release(10) == 10
    feed_message(d, 2, 7)
    assert d.release(7) == 7


def test_release_grants_at_exactly_the_threshold_while_bytes_are_still_held() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19, grant_threshold=1000)
    feed_message(d, 1, 999)
    feed_message(d, 2, 1)
    feed_message(d, 3, 50)
    assert d.release(999) == 0
    assert d.release(1) == 1000  # pending == threshold, 50 bytes still held
    assert d.held == 50


def test_release_resets_the_pending_counter_after_a_grant() -> None:
    # A pending counter that is not reset grants the same bytes twice: the receiver over-grants and the
    # window no longer bounds its memory.
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19, grant_threshold=100)
    feed_message(d, 1, 100)
    feed_message(d, 2, 30)
    feed_message(d, 3, 30)
    assert d.release(100) == 100
    assert d.release(30) == 0
    assert d.release(30) == 60
    assert d.granted == (1 << 20) + 160


def test_release_raises_the_grant_so_an_honest_sender_may_send_a_full_window_more() -> None:
    window = 1000
    d = Deframer(window=window, max_message_bytes=500, grant_threshold=10)
    feed_message(d, 1, 500)
    feed_message(d, 2, 500)  # the whole window in flight
    assert d.release(500) == 500
    assert d.granted == window + 500
    feed_message(d, 3, 500)  # exactly the credit just granted: accepted
    with pytest.raises(ProtocolError, match="overran"):
        d.feed(next(data_frames(4, [b"x"], 100)))


def test_granted_credit_accumulates_over_many_releases() -> None:
    window = 600
    d = Deframer(window=window, max_message_bytes=300, grant_threshold=1)
    for i in range(10):  # ten windows' worth through a 600-byte window
        feed_message(d, i, 300)
        assert d.release(300) == 300
    assert d.granted == window + 3000
    assert d.received == 3000


# -- 2. limits at their boundary -------------------------------------------------------------------


def test_exactly_window_bytes_in_flight_are_accepted_and_one_more_is_refused() -> None:
    d = Deframer(window=1000, max_message_bytes=500)
    feed_message(d, 1, 500)
    feed_message(d, 2, 500)
    assert d.received == d.granted == 1000
    with pytest.raises(ProtocolError, match="overran its credit window by 1 bytes"):
        d.feed(next(data_frames(3, [b"x"], 100)))


def test_message_of_exactly_max_message_bytes_is_accepted() -> None:
    d = Deframer(window=1 << 12, max_message_bytes=1 << 11)
    assert feed_message(d, 1, 1 << 11, max_frame=300) == 1 << 11
    with pytest.raises(ProtocolError, match="over the 2048 limit"):
        d.feed(next(data_frames(2, [bytes((1 << 11) + 1)], 300)))


def test_max_message_of_exactly_half_the_window_is_allowed() -> None:
    assert Deframer(window=100, max_message_bytes=50).granted == 100
    assert Deframer(window=101, max_message_bytes=50).granted == 101
    with pytest.raises(ValueError, match="half the window"):
        Deframer(window=101, max_message_bytes=51)


def test_a_one_byte_frame_is_short_not_empty() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19)
    with pytest.raises(ProtocolError, match=r"unknown frame type 0 or short frame \(1 bytes\)"):
        d.feed(b"\x00")
    with pytest.raises(ProtocolError, match="belongs to the sender side"):
        d.feed(b"\x01")
    with pytest.raises(ProtocolError, match="empty frame"):
        d.feed(b"")


# -- 5. paths never run ----------------------------------------------------------------------------


@pytest.mark.parametrize("max_frame", [0, DATA_OVERHEAD - 1, DATA_OVERHEAD])
def test_data_frames_refuses_max_frame_at_or_below_its_overhead(max_frame: int) -> None:
    with pytest.raises(ValueError, match="leaves no room"):
        next(data_frames(1, [b"x"], max_frame))


def test_data_frames_with_one_byte_of_room() -> None:
    frames = list(data_frames(1, [b"ab"], DATA_OVERHEAD + 1))
    assert [len(f) for f in frames] == [DATA_OVERHEAD + 1, 6 + 1]
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19)
    assert d.feed(frames[0]) == []
    assert d.feed(frames[1]) == [(1, bytearray(b"ab"))]


def test_frames_are_filled_to_max_frame() -> None:
    # The 8-byte total is in the FIRST frame only; continuation frames carry 8 bytes more payload.
    frames = list(data_frames(1, [bytes(300)], 100))
    assert [len(f) for f in frames] == [100, 100, 100, 6 + 300 - (100 - DATA_OVERHEAD) - 2 * 94]


def test_frame_type_bytes_of_the_wire_format() -> None:
    (frame,) = data_frames(0x01020304, [b"ab", b"", b"c"], 100)
    assert frame == b"\x00\x03\x04\x03\x02\x01" + (3).to_bytes(8, "little") + b"abc"
    first, last = data_frames(5, [b"abcd"], DATA_OVERHEAD + 2)
    assert first == b"\x00\x01\x05\x00\x00\x00" + (4).to_bytes(8, "little") + b"ab"
    assert last == b"\x00\x02\x05\x00\x00\x00cd"
    assert list(data_frames(9, [], 100)) == [b"\x00\x03\x09\x00\x00\x00" + bytes(8)]
    assert window_frame(5) == b"\x01" + (5).to_bytes(8, "little")


def test_a_window_frame_with_credit_1_is_valid() -> None:
    assert parse_window(window_frame(1)) == 1
    assert parse_window(window_frame(2**64 - 1)) == 2**64 - 1
    with pytest.raises(ProtocolError, match="no credit"):
        parse_window(window_frame(0))
    with pytest.raises(ProtocolError, match="malformed"):
        parse_window(b"\x00" + (5).to_bytes(8, "little"))
    with pytest.raises(ProtocolError, match="malformed"):
        parse_window(window_frame(5) + b"\x00")
