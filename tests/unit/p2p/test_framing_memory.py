"""Memory follows the data: partial messages hold what arrived, not the size their first frame declares,
and ABORT gives it back."""

import pytest

from engine.p2p.errors import ProtocolError
from engine.p2p.framing import (
    ABORT,
    DATA,
    DATA_OVERHEAD,
    FIRST,
    Deframer,
    LinkMemory,
    abort_frame,
    data_frames,
    is_abort,
    window_frame,
)


def first_frame(message_id: int, declared: int, payload: bytes = b"") -> bytes:
    return bytes([DATA, FIRST]) + message_id.to_bytes(4, "little") + declared.to_bytes(8, "little") + payload


def test_a_first_frame_reserves_nothing_for_its_declared_size() -> None:
    d = Deframer(window=64 << 20, max_message_bytes=32 << 20)
    for i in range(256):
        d.feed(first_frame(i, 32 << 20, b"abc"))
    assert d.partial_count == 256
    assert d.partial_bytes == 256 * 3
    assert sum(len(p.buffer) for p in d._partials.values()) == 256 * 3
    assert d.memory is not None and d.memory.used == 256 * 3


def test_a_message_reassembles_as_its_frames_arrive() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19)
    data = bytes(range(256)) * 40
    frames = list(data_frames(3, [data], 1000))
    for f in frames[:-1]:
        assert d.feed(f) == []
    assert d.partial_bytes == len(data) - (len(frames[-1]) - 6)
    assert d.feed(frames[-1]) == [(3, bytearray(data))]
    assert d.partial_bytes == 0 and d.held == len(data)
    d.release(len(data))
    assert d.memory is not None and d.memory.used == 0


def test_abort_drops_the_partial_and_returns_its_bytes() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19)
    frames = list(data_frames(5, [bytes(5000)], 1000))
    for f in frames[:2]:
        d.feed(f)
    held = d.partial_bytes
    assert held > 0
    assert is_abort(abort_frame(5)) and abort_frame(5)[1] == ABORT
    assert d.abort(abort_frame(5)) == held
    assert d.partial_count == 0 and d.partial_bytes == 0 and d.aborted == 1
    assert d.release(held) == held  # credit for the dropped bytes goes back to the sender
    assert d.abort(abort_frame(5)) == 0  # unknown or finished message: nothing to drop
    with pytest.raises(ProtocolError, match="continuation of unknown"):
        d.feed(frames[2])


def test_a_malformed_abort_is_a_protocol_error() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19)
    with pytest.raises(ProtocolError, match="malformed ABORT"):
        d.abort(abort_frame(1) + b"x")


def test_link_memory_admits_extras_while_they_fit_and_always_one() -> None:
    m = LinkMemory(capacity=100)
    m.charge(60)  # wire bytes: always charged
    assert m.try_charge(80)  # nothing extra charged yet: admitted even past the capacity
    assert not m.try_charge(1)
    assert m.refused == 1
    m.release(80, extra=True)
    assert m.try_charge(40) and not m.try_charge(1)
    m.release(60)
    assert m.try_charge(1)
    assert m.peak == 140 and m.used == 41 and m.extra == 41
    assert m.try_charge(0)


def test_a_deframer_without_a_budget_gets_one_as_large_as_its_window() -> None:
    # The window already bounds wire bytes; decoded extras may fill the rest of it, no more.
    d = Deframer(window=1000, max_message_bytes=500)
    assert d.memory is not None
    assert d.memory.try_charge(600) and d.memory.try_charge(400)
    assert not d.memory.try_charge(1)


def test_only_a_data_frame_flagged_abort_is_an_abort() -> None:
    # The channel routes on is_abort before the deframer sees a frame: a WINDOW frame whose credit
    # happens to start with byte 4, a short frame or a DATA frame with other flags must not be taken.
    assert is_abort(bytes([DATA, ABORT]))  # the shortest: kind and flags, as the check reads them
    assert is_abort(abort_frame(0xFFFFFFFF))
    assert not is_abort(b"") and not is_abort(bytes([DATA]))
    assert not is_abort(window_frame(ABORT)) and window_frame(ABORT)[1] == ABORT
    assert not is_abort(next(data_frames(1, [b"x"], 100)))
    assert not is_abort(bytes([DATA, ABORT | FIRST]) + bytes(4))


def test_every_abort_and_every_refusal_is_counted() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19)
    for message_id in (1, 2):
        d.feed(next(data_frames(message_id, [bytes(300)], 100)))
    assert d.abort(abort_frame(1)) == 100 - DATA_OVERHEAD
    assert d.abort(abort_frame(2)) == 100 - DATA_OVERHEAD
    assert d.aborted == 2
    m = LinkMemory(capacity=100)
    assert m.try_charge(90)
    assert not m.try_charge(20) and not m.try_charge(20)
    assert m.refused == 2


def test_a_zero_extra_is_admitted_even_over_the_budget() -> None:
    # A request without tensors decodes to nothing more: it never waits behind a big one.
    m = LinkMemory(capacity=100)
    assert m.try_charge(150)  # alone, so admitted past the capacity
    assert m.try_charge(0)
    assert (m.used, m.extra, m.refused) == (150, 150, 0)
