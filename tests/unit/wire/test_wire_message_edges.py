"""The message layer's edges: which limits each side applies, the byte views it accepts, field checks.

Each test kills a mutant of messages.py (`make mutation`, group wire) that the older tests let through.
"""

from __future__ import annotations

import struct

import msgspec
import numpy as np
import pytest
import torch

from engine.wire import (
    Compression,
    DecodeError,
    EncodeError,
    Header,
    Kind,
    LimitExceeded,
    Limits,
    Message,
    decode_message,
    encode_message,
    encode_message_bytes,
    encoded_size,
)

MSG = Message(Kind.RESPONSE, 7, "m", {"k": 1}, [torch.arange(6, dtype=torch.uint8)])  # bytes: never realigned


def frame(header: list[object], payload: bytes = b"") -> bytes:
    body = msgspec.msgpack.encode(header)
    return struct.pack("<I", len(body)) + body + payload


@pytest.mark.parametrize("fmt", ["B", "b", "c"])
def test_byte_views_of_every_byte_format_decode_without_a_copy(fmt: str) -> None:
    data = bytearray(encode_message_bytes(MSG))
    out = decode_message(memoryview(data).cast(fmt))
    assert out.tensors[0].tolist() == list(range(6))
    data[-1] = 99  # the raw tensor aliases the buffer it came from
    assert out.tensors[0].tolist() == [0, 1, 2, 3, 4, 99]


def test_strided_and_multidimensional_views_are_copied_once_and_decode() -> None:
    data = encode_message_bytes(MSG)
    spread = bytearray(2 * len(data))
    spread[::2] = data
    strided = memoryview(spread)[::2]
    assert not strided.c_contiguous
    assert decode_message(strided).tensors[0].tolist() == list(range(6))
    square = memoryview(bytearray(data)).cast("B", shape=[1, len(data)])
    assert decode_message(square).tensors[0].tolist() == list(range(6))
    wide = np.frombuffer(bytes(data) + bytes(-len(data) % 4 or 4), dtype=np.uint32)
    with pytest.raises(DecodeError, match="follow the header"):  # the padding is trailing garbage
        decode_message(memoryview(wide))


def test_a_message_of_exactly_its_prefix_is_a_malformed_header_not_a_short_message() -> None:
    with pytest.raises(DecodeError, match="shorter than its length prefix"):
        decode_message(b"\x00\x00\x00")
    with pytest.raises(DecodeError, match="malformed header"):
        decode_message(b"\x00\x00\x00\x00")


def test_decoder_checks_every_meta_against_the_callers_limits_before_any_payload() -> None:
    # 11 elements over a limit of 10, and a payload too short for them: the limit is what is reported.
    data = frame([0, 1, "m", {}, [["float32", [11], 0, 44, 0]]], b"\x00" * 8)
    with pytest.raises(LimitExceeded, match="max_tensor_elements 10"):
        decode_message(data, Limits(max_tensor_elements=10))


def test_limits_above_the_defaults_apply_on_both_sides() -> None:
    nine = Limits(max_ndim=9)
    t = torch.arange(2).reshape((1,) * 8 + (2,))
    out = decode_message(encode_message_bytes(Message(Kind.REQUEST, 1, tensors=[t]), limits=nine), nine)
    assert out.tensors[0].shape == t.shape
    with pytest.raises(LimitExceeded):
        decode_message(encode_message_bytes(Message(Kind.REQUEST, 1, tensors=[t]), limits=nine))


def test_encode_message_bytes_applies_the_callers_limits() -> None:
    size = len(encode_message_bytes(MSG))
    with pytest.raises(EncodeError, match="max_message_bytes"):
        encode_message_bytes(MSG, limits=Limits(max_message_bytes=size - 1))


def test_int8_block_size_reaches_every_tensor_of_a_message() -> None:
    msg = Message(Kind.REQUEST, 1, tensors=[torch.randn(200), torch.randn(70)])
    pieces = encode_message(msg, Compression.INT8, block_size=64)
    header = msgspec.msgpack.decode(bytes(pieces[0])[4:], type=Header)
    assert [m.block_size for m in header.tensors] == [64, 64]
    assert [m.nbytes for m in header.tensors] == [4 * 4 + 200, 2 * 4 + 70]


def test_encoded_size_counts_bytes_not_items() -> None:
    wide = memoryview(np.zeros(3, dtype=np.int64))
    assert encoded_size([b"ab", wide]) == 2 + 24
    assert encoded_size([]) == 0


@pytest.mark.parametrize("value", [-(2**63) - 1, 2**64, -(2**64)])
def test_int_fields_outside_64_bits_are_refused_with_their_name(value: int) -> None:
    with pytest.raises(EncodeError, match="field 'wide': int"):
        encode_message(Message(Kind.REQUEST, 1, fields={"wide": value}))
    with pytest.raises(EncodeError, match="field 'wide': int"):
        encode_message(Message(Kind.REQUEST, 1, fields={"wide": [1, value]}))


def test_int_fields_at_both_ends_of_64_bits_round_trip() -> None:
    fields = {"lo": -(2**63), "hi": 2**64 - 1}
    assert decode_message(encode_message_bytes(Message(Kind.REQUEST, 1, fields=fields))).fields == fields


def test_unsupported_field_types_name_the_field() -> None:
    with pytest.raises(EncodeError, match="field 'obj': unsupported type object"):
        encode_message(Message(Kind.REQUEST, 1, fields={"obj": object()}))
    with pytest.raises(EncodeError, match="field 'lst': unsupported type dict"):
        encode_message(Message(Kind.REQUEST, 1, fields={"lst": [1, {}]}))


@pytest.mark.parametrize("rid", [True, False, 1.0, "1", None])
def test_request_id_must_be_a_plain_int(rid: object) -> None:
    with pytest.raises(EncodeError, match="request_id must be an int"):
        encode_message(Message(Kind.REQUEST, rid))  # type: ignore[arg-type]
