"""Typed RPC message schema and framing of one message into byte pieces.

Layout of one encoded message (the transport adds its own outer framing)::

    [u32 LE header_len][header: msgpack array][payload 0][payload 1]...

The header is ``[kind, request_id, method, fields, [TensorMeta...]]``.  Tensor
payloads follow back to back, in header order, with no padding; their sizes
must add up to *exactly* the rest of the message, so trailing garbage is an
error rather than something silently ignored.

``encode_message`` returns a list of pieces instead of one ``bytes`` so the
transport can write header and (possibly huge) tensor payloads without first
concatenating them into another copy.

``decode_message`` is the trust boundary.  It checks every size against
``Limits`` and validates every tensor's metadata before decoding any payload,
and its only failure mode is ``DecodeError`` (``LimitExceeded`` for hostile
sizes).  The only exceptions it catches are msgspec's own decode errors; every
other failure is prevented by validating up front, which the fuzz test checks.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch

from .errors import DecodeError, EncodeError, LimitExceeded
from .limits import DEFAULT_LIMITS, Limits
from .tensors import Compression, TensorMeta, check_meta, decode_tensor, decoded_nbytes, encode_tensor

__all__ = [
    "FieldValue",
    "Header",
    "Kind",
    "Message",
    "MessageHead",
    "Scalar",
    "decode_message",
    "encode_message",
    "encode_message_bytes",
    "encoded_size",
    "peek_message",
]

_PREFIX = struct.Struct("<I")
_MAX_REQUEST_ID = 2**63  # exclusive; fits a signed 64-bit integer in every language a peer might use


class Kind(enum.IntEnum):
    """Stable integers: part of the wire format, never renumber."""

    REQUEST = 0
    RESPONSE = 1
    ERROR = 2
    STREAM = 3
    END = 4
    CANCEL = 5
    CREDIT = 6  # a stream's consumer grants its producer ``fields["bytes"]`` more (engine.p2p.rpc)


_KIND_VALUES = frozenset(int(k) for k in Kind)

# Flat on purpose: scalars and one level of lists keep decoding depth (and cost) bounded by the schema.
Scalar = None | bool | int | float | str | bytes
FieldValue = Scalar | list[Scalar]
_SCALAR_TYPES = (type(None), bool, int, float, str, bytes, bytearray)

# msgspec refuses unions holding both str and bytes, so bytes travel as msgpack ext type 0 and are
# unwrapped on decode.  Untyped decoding (Any / Raw) is not an option: it recurses on nested arrays.
_BYTES_EXT = 0
_WireScalar = None | bool | int | float | str | msgspec.msgpack.Ext
_WireField = _WireScalar | list[_WireScalar]


def _to_wire(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return msgspec.msgpack.Ext(_BYTES_EXT, bytes(value))
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    return value


def _from_wire_scalar(value: Any) -> Any:
    if isinstance(value, msgspec.msgpack.Ext):
        if value.code != _BYTES_EXT:
            raise DecodeError(f"unknown msgpack ext code {value.code} in fields")
        return value.data
    return value


def _from_wire(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_wire_scalar(v) for v in value]
    return _from_wire_scalar(value)


class Header(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """Array-like so the header costs a few bytes; ``forbid_unknown_fields`` rejects extra elements."""

    kind: int
    request_id: int
    method: str
    fields: dict[str, _WireField]
    tensors: list[TensorMeta]


_DECODER = msgspec.msgpack.Decoder(Header)
_ENCODER = msgspec.msgpack.Encoder()


@dataclass
class Message:
    """The in-memory form callers work with; tensors are real tensors, not metadata."""

    kind: Kind
    request_id: int
    method: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    tensors: list[torch.Tensor] = field(default_factory=list)
    #: How the sender wants its tensors encoded (one setting, or one per tensor). Not sent as such:
    #: each TensorMeta records what was used. Lets a handler choose the compression of its reply.
    compression: Compression | Sequence[Compression] = Compression.NONE


def _check_scalar(key: str, value: object) -> None:
    if not isinstance(value, _SCALAR_TYPES):
        raise EncodeError(f"field {key!r}: unsupported type {type(value).__name__}")
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        raise EncodeError(f"field {key!r}: int {value} does not fit msgpack's 64 bits")


def _check_fields(fields: dict[str, Any], limits: Limits) -> None:
    # Validate here so a bad field fails on the sender with a clear message instead of on every receiver.
    if not isinstance(fields, dict):
        raise EncodeError("fields must be a dict")
    if len(fields) > limits.max_fields:
        raise EncodeError(f"{len(fields)} fields > max_fields {limits.max_fields}")
    for key, value in fields.items():
        if not isinstance(key, str):
            raise EncodeError(f"field names must be str, got {type(key).__name__}")
        if isinstance(value, list | tuple):
            for item in value:
                _check_scalar(key, item)
        else:
            _check_scalar(key, value)


def _compressions(spec: Compression | Sequence[Compression], n: int) -> list[Compression]:
    if isinstance(spec, int):
        return [Compression(spec)] * n
    out = list(spec)
    if len(out) != n:
        raise EncodeError(f"got {len(out)} compression settings for {n} tensors")
    return out


def encode_message(
    msg: Message,
    compression: Compression | Sequence[Compression] = Compression.NONE,
    block_size: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> list[bytes | memoryview]:
    """Pieces of one message: ``[prefix+header, payload...]``; raises ``EncodeError`` if over limits."""
    if not isinstance(msg.kind, int) or int(msg.kind) not in _KIND_VALUES:
        raise EncodeError(f"unknown message kind {msg.kind!r}")
    if isinstance(msg.request_id, bool) or not isinstance(msg.request_id, int):
        raise EncodeError("request_id must be an int")
    if not 0 <= msg.request_id < _MAX_REQUEST_ID:
        raise EncodeError(f"request_id {msg.request_id} outside [0, 2**63)")
    if not isinstance(msg.method, str) or len(msg.method) > limits.max_method_len:
        raise EncodeError(f"method must be a str of at most {limits.max_method_len} characters")
    _check_fields(msg.fields, limits)
    if len(msg.tensors) > limits.max_tensors:
        raise EncodeError(f"{len(msg.tensors)} tensors > max_tensors {limits.max_tensors}")
    comps = _compressions(compression, len(msg.tensors))
    metas: list[TensorMeta] = []
    payloads: list[bytes | memoryview] = []
    for t, comp in zip(msg.tensors, comps, strict=True):
        if isinstance(t, torch.Tensor):  # encode_tensor reports the non-tensor case itself
            if t.dim() > limits.max_ndim:
                raise EncodeError(f"tensor has {t.dim()} dims > max_ndim {limits.max_ndim}")
            if math.prod(max(int(d), 1) for d in t.shape) > limits.max_tensor_elements:
                raise EncodeError(f"tensor of shape {tuple(t.shape)} exceeds max_tensor_elements")
        meta, payload = encode_tensor(t, comp, block_size)
        metas.append(meta)
        payloads.append(payload)
    fields = {k: _to_wire(v) for k, v in msg.fields.items()}
    header = Header(int(msg.kind), msg.request_id, msg.method, fields, metas)
    header_bytes = _ENCODER.encode(header)
    if len(header_bytes) > limits.max_header_bytes:
        raise EncodeError(f"header is {len(header_bytes)} bytes > max_header_bytes {limits.max_header_bytes}")
    pieces: list[bytes | memoryview] = [_PREFIX.pack(len(header_bytes)) + header_bytes, *payloads]
    if encoded_size(pieces) > limits.max_message_bytes:
        raise EncodeError(f"message exceeds max_message_bytes {limits.max_message_bytes}")
    return pieces


def encoded_size(pieces: Sequence[bytes | memoryview]) -> int:
    """Total length, so a transport can write its length prefix before streaming the pieces."""
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in pieces)


def encode_message_bytes(
    msg: Message,
    compression: Compression | Sequence[Compression] = Compression.NONE,
    block_size: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> bytes:
    """Convenience for small messages and tests, where one extra copy does not matter."""
    return b"".join(encode_message(msg, compression, block_size, limits))


def _as_byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    mv = memoryview(data)
    if mv.ndim == 1 and mv.format in ("B", "b", "c") and mv.c_contiguous:
        return mv.cast("B")
    return memoryview(mv.tobytes())  # exotic views (strided, multi-byte items): normalise with one copy


@dataclass(frozen=True)
class MessageHead:
    """What a receiver needs to route a message before decoding its tensors: who it is for, and how
    many bytes its tensors take once decoded (compressed ones grow: int8 to float64 is 8x)."""

    kind: Kind
    request_id: int
    method: str
    decoded_bytes: int


def _parse(data: bytes | bytearray | memoryview, limits: Limits) -> tuple[memoryview, Header, int]:
    """Checks everything but the payloads' contents; returns the view, the header and where payloads start."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"expected a bytes-like object, got {type(data).__name__}")
    mv = _as_byte_view(data)
    total = mv.nbytes
    if total > limits.max_message_bytes:
        raise LimitExceeded(f"message is {total} bytes > max_message_bytes {limits.max_message_bytes}")
    if total < _PREFIX.size:
        raise DecodeError("message shorter than its length prefix")
    (header_len,) = _PREFIX.unpack_from(mv)
    if header_len > limits.max_header_bytes:
        raise LimitExceeded(f"header_len {header_len} > max_header_bytes {limits.max_header_bytes}")
    body_start = _PREFIX.size + header_len
    if body_start > total:
        raise DecodeError(f"header_len {header_len} runs past the end of a {total}-byte message")
    try:
        header = _DECODER.decode(mv[_PREFIX.size : body_start])
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise DecodeError(f"malformed header: {exc}") from None
    if header.kind not in _KIND_VALUES:
        raise DecodeError(f"unknown message kind {header.kind}")
    if not 0 <= header.request_id < _MAX_REQUEST_ID:
        raise DecodeError(f"request_id {header.request_id} outside [0, 2**63)")
    if len(header.method) > limits.max_method_len:
        raise LimitExceeded(f"method name longer than {limits.max_method_len}")
    if len(header.fields) > limits.max_fields:
        raise LimitExceeded(f"{len(header.fields)} fields > max_fields {limits.max_fields}")
    if len(header.tensors) > limits.max_tensors:
        raise LimitExceeded(f"{len(header.tensors)} tensors > max_tensors {limits.max_tensors}")
    for meta in header.tensors:
        check_meta(meta, limits)  # every meta validated before any payload is touched
    claimed = sum(meta.nbytes for meta in header.tensors)
    if claimed != total - body_start:
        raise DecodeError(f"tensor payloads claim {claimed} bytes but {total - body_start} follow the header")
    return mv, header, body_start


def peek_message(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> MessageHead:
    """Validates ``data`` as :func:`decode_message` does, without decoding any tensor; raises only
    ``DecodeError``. ``decoded_bytes`` counts every tensor at its decoded size (raw ones may alias
    the input, or be copied once when misaligned: counted, to be safe)."""
    _, header, _ = _parse(data, limits)
    return MessageHead(
        Kind(header.kind),
        header.request_id,
        header.method,
        sum(decoded_nbytes(meta) for meta in header.tensors),
    )


def decode_message(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decodes untrusted bytes; raises only ``DecodeError``.  Raw tensors alias a writable ``data``."""
    mv, header, body_start = _parse(data, limits)
    fields = {k: _from_wire(v) for k, v in header.fields.items()}
    tensors: list[torch.Tensor] = []
    offset = body_start
    for meta in header.tensors:
        tensors.append(decode_tensor(meta, mv[offset : offset + meta.nbytes], limits))
        offset += meta.nbytes
    return Message(Kind(header.kind), header.request_id, header.method, fields, tensors)
