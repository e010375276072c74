import pytest

from engine.p2p.errors import ProtocolError
from engine.p2p.framing import DATA_OVERHEAD, Deframer, data_frames, parse_window, window_frame


def deframer(window: int = 1 << 20, max_message: int = 1 << 19) -> Deframer:
    return Deframer(window=window, max_message_bytes=max_message)


@pytest.mark.parametrize("size", [0, 1, 100 - DATA_OVERHEAD, 100 - DATA_OVERHEAD + 1, 94, 95, 1000, 4096])
def test_round_trip_every_boundary(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    pieces = [data[: size // 3], data[size // 3 : size // 2], data[size // 2 :]]
    frames = list(data_frames(7, pieces, max_frame=100))
    assert all(len(f) <= 100 for f in frames)
    d = deframer()
    out = []
    for f in frames:
        done = d.feed(f)
        out += done
    assert out == [(7, bytearray(data))]
    assert d.held == size


def test_interleaved_messages_reassemble() -> None:
    a = list(data_frames(1, [b"a" * 500], 64))
    b = list(data_frames(2, [b"b" * 300], 64))
    d = deframer()
    done = []
    for i in range(max(len(a), len(b))):
        for frames in (a, b):
            if i < len(frames):
                done += d.feed(frames[i])
    assert sorted(done) == [(1, bytearray(b"a" * 500)), (2, bytearray(b"b" * 300))]


def test_release_grants_credit_in_batches() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19, grant_threshold=1000)
    for f in data_frames(1, [b"x" * 600], 256):
        d.feed(f)
    for f in data_frames(2, [b"y" * 600], 256):
        d.feed(f)
    assert d.release(600) == 0  # below the threshold and other bytes still held
    assert d.release(600) == 1200
    assert parse_window(window_frame(1200)) == 1200


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([b""], "empty"),
        ([b"\x07\x00\x00\x00\x00\x00"], "unknown frame type"),
        ([b"\x00\x08\x01\x00\x00\x00"], "flags"),
        ([b"\x00\x04\x01\x00\x00\x00"], "ABORT frame goes to abort"),
        ([b"\x00\x01\x01\x00\x00\x00"], "total size"),
        ([b"\x00\x00\x09\x00\x00\x00abc"], "unknown message"),
        ([next(data_frames(1, [b"z" * 100], 50)), next(data_frames(1, [b"z" * 100], 50))], "started twice"),
        ([b"\x00\x03\x01\x00\x00\x00" + (5).to_bytes(8, "little") + b"toolong"], "overflows"),
        ([b"\x00\x03\x01\x00\x00\x00" + (9).to_bytes(8, "little") + b"short"], "ended at"),
        ([b"\x00\x01\x01\x00\x00\x00" + (1 << 40).to_bytes(8, "little")], "over the"),
        ([window_frame(5)], "WINDOW"),
    ],
)
def test_malformed_frames_are_protocol_errors(frames: list[bytes], match: str) -> None:
    d = deframer()
    with pytest.raises(ProtocolError, match=match):
        for f in frames:
            d.feed(f)


def test_sender_overrunning_its_window_is_caught() -> None:
    d = Deframer(window=1000, max_message_bytes=500)
    d.feed(next(data_frames(1, [b"a" * 480], 1000)))
    d.feed(next(data_frames(2, [b"b" * 480], 1000)))
    with pytest.raises(ProtocolError, match="overran"):
        d.feed(next(data_frames(3, [b"c" * 100], 1000)))


def test_too_many_partial_messages() -> None:
    d = Deframer(window=1 << 20, max_message_bytes=1 << 19, max_partial=3)
    for i in range(3):
        d.feed(next(data_frames(i, [b"q" * 100], 50)))
    with pytest.raises(ProtocolError, match="in progress"):
        d.feed(next(data_frames(9, [b"q" * 100], 50)))


def test_window_frame_validation() -> None:
    with pytest.raises(ProtocolError):
        parse_window(b"\x01\x00")
    with pytest.raises(ProtocolError):
        parse_window(window_frame(0))


def test_max_message_must_fit_half_the_window() -> None:
    with pytest.raises(ValueError):
        Deframer(window=100, max_message_bytes=51)
