"""Message schema: round trips, limits on both sides, encode-side validation."""

from __future__ import annotations

import struct
import time

import msgspec
import pytest
import torch

from engine.wire import (
    Compression,
    DecodeError,
    EncodeError,
    Kind,
    LimitExceeded,
    Limits,
    Message,
    decode_message,
    encode_message,
    encode_message_bytes,
    encoded_size,
)

FIELDS = {
    "none": None,
    "t": True,
    "f": False,
    "i": -(2**63),
    "u": 2**64 - 1,
    "x": 1.5e-300,
    "s": "héllo",
    "b": b"\x00\xff",
    "empty": [],
    "mixed": [None, True, 3, 2.5, "s", b"b"],
}


def frame(header: list[object], payload: bytes = b"", prefix: int | None = None) -> bytes:
    body = msgspec.msgpack.encode(header)
    return struct.pack("<I", len(body) if prefix is None else prefix) + body + payload


@pytest.mark.parametrize("rid", [0, 1, 2**63 - 2, 2**63 - 1])
@pytest.mark.parametrize("kind", list(Kind))
def test_roundtrip(kind: Kind, rid: int) -> None:
    tensors = [
        torch.randn(3, 70),
        torch.arange(12, dtype=torch.int32).reshape(3, 4),
        torch.randn(5, dtype=torch.float64),
        torch.tensor(7.0).bfloat16(),
        torch.empty(0, 3),
        torch.tensor([True, False]),
    ]
    comps = [
        Compression.INT8,
        Compression.INT8,
        Compression.FLOAT16,
        Compression.NONE,
        Compression.INT8,
        Compression.FLOAT16,
    ]
    msg = Message(kind, rid, "expert.forward", FIELDS, tensors)
    pieces = encode_message(msg, comps, block_size=64)
    data = b"".join(pieces)
    assert encoded_size(pieces) == len(data)
    for buf in (data, bytearray(data), memoryview(data)):
        out = decode_message(buf)
        assert (out.kind, out.request_id, out.method, out.fields) == (kind, rid, msg.method, FIELDS)
        assert type(out.kind) is Kind
        assert [t.dtype for t in out.tensors] == [t.dtype for t in tensors]
        assert [t.shape for t in out.tensors] == [t.shape for t in tensors]
        assert (out.tensors[0] - tensors[0]).abs().max() <= tensors[0].abs().max() / 100
        for i in (1, 3, 4, 5):
            assert torch.equal(out.tensors[i], tensors[i])


def test_defaults_and_tuple_fields() -> None:
    out = decode_message(encode_message_bytes(Message(Kind.CANCEL, 5, fields={"l": (1, "a")})))
    assert out == Message(Kind.CANCEL, 5, "", {"l": [1, "a"]}, [])


@pytest.mark.parametrize(
    "msg",
    [
        Message(Kind.REQUEST, -1),
        Message(Kind.REQUEST, 2**63),
        Message(7, 1),  # type: ignore[arg-type]
        Message(Kind.REQUEST, 1, "m" * 129),
        Message(Kind.REQUEST, 1, fields={str(i): i for i in range(65)}),
        Message(Kind.REQUEST, 1, fields={"nested": [[1]]}),
        Message(Kind.REQUEST, 1, fields={"d": {"a": 1}}),
        Message(Kind.REQUEST, 1, fields={"big": 2**64}),
        Message(Kind.REQUEST, 1, fields={1: 1}),  # type: ignore[dict-item]
        Message(Kind.REQUEST, 1, tensors=[torch.zeros(1)] * 65),
        Message(Kind.REQUEST, 1, tensors=[torch.zeros((1,) * 9)]),
        Message(Kind.REQUEST, 1, tensors=[torch.zeros(2, dtype=torch.complex64)]),
        Message(Kind.REQUEST, 1, tensors=[torch.tensor([float("nan")])]),
        Message(Kind.REQUEST, 1, fields={"s": "x" * 70_000}),
    ],
)
def test_encode_rejects(msg: Message) -> None:
    comp = Compression.INT8 if msg.tensors and msg.tensors[0].dtype == torch.float32 else Compression.NONE
    with pytest.raises(EncodeError):
        encode_message(msg, comp)


def test_encode_limits_configurable() -> None:
    small = Limits(max_message_bytes=1000, max_tensor_elements=100)
    with pytest.raises(EncodeError):
        encode_message(Message(Kind.REQUEST, 1, tensors=[torch.zeros(101)]), limits=small)
    with pytest.raises(EncodeError):
        encode_message(
            Message(Kind.REQUEST, 1, tensors=[torch.zeros(50, dtype=torch.float64)] * 3), limits=small
        )
    with pytest.raises(EncodeError):
        encode_message(Message(Kind.REQUEST, 1, tensors=[torch.zeros(1)] * 2), [Compression.NONE])
    with pytest.raises(ValueError):
        Limits(max_tensors=0)


def test_huge_tensor_claim_fails_fast() -> None:
    meta = ["float32", [2**20, 2**20], 0, 2**42, 0]
    data = frame([0, 1, "m", {}, [meta]])
    start = time.perf_counter()
    with pytest.raises(LimitExceeded):
        decode_message(data)
    assert time.perf_counter() - start < 0.05


def test_decode_limits_configurable() -> None:
    data = encode_message_bytes(Message(Kind.REQUEST, 1, tensors=[torch.zeros(300)]))
    with pytest.raises(LimitExceeded):
        decode_message(data, Limits(max_message_bytes=1000))
    with pytest.raises(LimitExceeded):
        decode_message(data, Limits(max_tensor_elements=299))
    with pytest.raises(LimitExceeded):
        decode_message(data, Limits(max_header_bytes=4))


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(DecodeError):
        decode_message("text")  # type: ignore[arg-type]
