"""peek_message: a message routed on its header and charged at its decoded size before any decoding.

The RPC layer routes and budgets every received message with peek_message and decoded_nbytes, so the
wire group of `make mutation` needs tests of its own that call them.
"""

from __future__ import annotations

import struct

import msgspec
import pytest
import torch

from engine.wire import (
    Compression,
    DecodeError,
    Kind,
    LimitExceeded,
    Limits,
    Message,
    MessageHead,
    decode_message,
    encode_message_bytes,
    peek_message,
)
from engine.wire.tensors import check_meta, decoded_nbytes, encode_tensor


def test_the_head_names_the_message_without_decoding_it() -> None:
    raw = encode_message_bytes(Message(Kind.STREAM, 2**62, "experts.forward", {"k": 1}, [torch.ones(3)]))
    head = peek_message(raw)
    assert head == MessageHead(Kind.STREAM, 2**62, "experts.forward", 12)
    assert type(head.kind) is Kind
    assert peek_message(bytearray(raw)) == peek_message(memoryview(raw)) == head


@pytest.mark.parametrize(
    ("tensor", "compression", "decoded"),
    [
        (torch.zeros(1000, dtype=torch.float64), Compression.INT8, 8000),  # 1,000 bytes of int8 become 8,000
        (torch.zeros(10, 30), Compression.FLOAT16, 1200),  # two dimensions: their product
        (torch.zeros(7, dtype=torch.bfloat16), Compression.NONE, 14),
        (torch.zeros(5, dtype=torch.bool), Compression.NONE, 5),
        (torch.zeros(3, 0, 4), Compression.NONE, 0),
        (torch.zeros((), dtype=torch.int64), Compression.NONE, 8),  # a scalar: one element
    ],
)
def test_decoded_bytes_are_what_the_tensor_takes_once_decoded(
    tensor: torch.Tensor, compression: Compression, decoded: int
) -> None:
    meta, _ = encode_tensor(tensor, compression)
    check_meta(meta)
    assert decoded_nbytes(meta) == decoded
    raw = encode_message_bytes(Message(Kind.REQUEST, 1, "m", {}, [tensor]), compression)
    assert peek_message(raw).decoded_bytes == decoded
    assert decode_message(raw).tensors[0].nbytes == decoded


def test_decoded_bytes_add_up_over_every_tensor() -> None:
    tensors = [torch.zeros(100, dtype=torch.float64), torch.arange(10), torch.zeros(2, 3)]
    raw = encode_message_bytes(
        Message(Kind.REQUEST, 1, "m", {}, tensors), [Compression.INT8, Compression.NONE, Compression.NONE]
    )
    assert peek_message(raw).decoded_bytes == 800 + 80 + 24


def test_peek_applies_the_limits_it_is_given_not_the_defaults() -> None:
    many = encode_message_bytes(
        Message(Kind.REQUEST, 1, "m", {}, [torch.zeros(1)] * 70), limits=Limits(max_tensors=80)
    )
    with pytest.raises(LimitExceeded, match="70 tensors > max_tensors 64"):
        peek_message(many)  # the defaults
    assert peek_message(many, Limits(max_tensors=80)).decoded_bytes == 70 * 4
    small = encode_message_bytes(Message(Kind.REQUEST, 1, "m", {}, [torch.zeros(4)]))
    with pytest.raises(LimitExceeded, match="max_message_bytes 20"):
        peek_message(small, Limits(max_message_bytes=20))


def test_peek_refuses_what_decode_refuses() -> None:
    header = msgspec.msgpack.encode([9, 1, "m", {}, []])  # no such kind
    with pytest.raises(DecodeError, match="unknown message kind 9"):
        peek_message(struct.pack("<I", len(header)) + header)
    raw = encode_message_bytes(Message(Kind.REQUEST, 1, "m", {}, [torch.zeros(4)]))
    with pytest.raises(DecodeError, match="claim 16 bytes but 15 follow"):
        peek_message(raw[:-1])
    with pytest.raises(DecodeError, match="expected a bytes-like object"):
        peek_message("text")  # type: ignore[arg-type]
