"""Fuzz: decoding arbitrary bytes returns a Message or raises DecodeError, nothing else."""

from __future__ import annotations

import os
import random
import struct

import msgspec
import pytest
import torch

from engine.wire import (
    Compression,
    DecodeError,
    Kind,
    LimitExceeded,
    Message,
    decode_message,
    encode_message_bytes,
)

# `make mutation` runs this once per mutant, with fewer frames (LAH_FUZZ_FRAMES).
N_FRAMES = int(os.environ.get("LAH_FUZZ_FRAMES", 100_000))


def frame(header: list[object], payload: bytes = b"", prefix: int | None = None) -> bytes:
    body = msgspec.msgpack.encode(header)
    return struct.pack("<I", len(body) if prefix is None else prefix) + body + payload


def meta(
    dtype: str = "float32", shape: list[int] | None = None, comp: int = 0, nbytes: int = 8, bs: int = 0
) -> list[object]:
    return [dtype, [2] if shape is None else shape, comp, nbytes, bs]


def hdr(
    kind: int = 0, rid: int = 1, method: str = "m", fields: object = None, tensors: object = None
) -> list[object]:
    return [kind, rid, method, {} if fields is None else fields, [] if tensors is None else tensors]


HOSTILE: list[tuple[str, bytes, type[DecodeError]]] = [
    ("2**40 elements", frame(hdr(tensors=[meta(shape=[2**20, 2**20], nbytes=2**42)])), LimitExceeded),
    ("ndim 100", frame(hdr(tensors=[meta(shape=[1] * 100, nbytes=4)]), b"\0" * 4), LimitExceeded),
    ("huge header_len", struct.pack("<I", 0xFFFFFFFF) + b"\x95", LimitExceeded),
    ("65 tensors", frame(hdr(tensors=[meta(shape=[0], nbytes=0)] * 65)), LimitExceeded),
    ("long method", frame(hdr(method="m" * 129)), LimitExceeded),
    ("65 fields", frame(hdr(fields={str(i): i for i in range(65)})), LimitExceeded),
    ("empty dim times huge", frame(hdr(tensors=[meta(shape=[0, 2**40], nbytes=0)])), LimitExceeded),
    ("negative dim", frame(hdr(tensors=[meta(shape=[-2], nbytes=-8)])), DecodeError),
    ("nbytes mismatch", frame(hdr(tensors=[meta(nbytes=9)]), b"\0" * 9), DecodeError),
    ("payload short", frame(hdr(tensors=[meta()]), b"\0" * 7), DecodeError),
    ("trailing garbage", frame(hdr(tensors=[meta()]), b"\0" * 9), DecodeError),
    ("unknown dtype", frame(hdr(tensors=[meta(dtype="object")]), b"\0" * 8), DecodeError),
    ("unknown compression", frame(hdr(tensors=[meta(comp=3)]), b"\0" * 8), DecodeError),
    ("int8 bad block", frame(hdr(tensors=[meta(comp=2, nbytes=6, bs=63)]), b"\0" * 6), DecodeError),
    ("compressed int", frame(hdr(tensors=[meta(dtype="int64", comp=1, nbytes=4)]), b"\0" * 4), DecodeError),
    ("unknown kind", frame(hdr(kind=7)), DecodeError),
    ("negative request id", frame(hdr(rid=-1)), DecodeError),
    ("request id 2**63", frame(hdr(rid=2**63)), DecodeError),
    ("header past end", frame(hdr(), prefix=100), DecodeError),
    ("short prefix", b"\x01\x00", DecodeError),
    ("extra header element", frame([*hdr(), 1]), DecodeError),
    ("nested list field", frame(hdr(fields={"a": [[1]]})), DecodeError),
    (
        "deeply nested field",
        frame(hdr())[:0]
        + struct.pack("<I", 20007)
        + b"\x95\x00\x01\xa1m\x81\xa1a"
        + b"\x91" * 20000
        + b"\x90",
        DecodeError,
    ),
    ("bin field", frame(hdr(fields={"a": b"raw"})), DecodeError),
    ("unknown ext", frame(hdr(fields={"a": msgspec.msgpack.Ext(5, b"x")})), DecodeError),
    ("meta as map", frame(hdr(tensors=[{"dtype": "float32"}])), DecodeError),
]


@pytest.mark.parametrize(("name", "data", "exc"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile(name: str, data: bytes, exc: type[DecodeError]) -> None:
    with pytest.raises(DecodeError) as info:
        decode_message(data)
    assert type(info.value) is exc, f"{name}: {info.value!r}"


def _seeds(rng: random.Random) -> list[bytes]:
    msgs = [
        Message(Kind.REQUEST, 1, "f", {"a": 1, "b": [b"x", 2.5, None]}, [torch.randn(3, 4)]),
        Message(Kind.RESPONSE, 2**63 - 1, "", {}, [torch.randn(70), torch.arange(5), torch.tensor(True)]),
        Message(Kind.STREAM, 9, "s", {"s": "t"}, [torch.randn(2, 3).bfloat16(), torch.empty(0, 2)]),
        Message(Kind.END, 3),
    ]
    out = []
    for m in msgs:
        for comp in Compression:
            out.append(encode_message_bytes(m, comp, block_size=64))
    return out


def _mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(8)
        if op == 0 and data:
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 2:
            del data[rng.randrange(len(data) + 1) :]
        elif op == 3:
            data += rng.randbytes(rng.randint(1, 16))
        elif op == 4:
            other = rng.choice(seeds)
            data = data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]
        elif op == 5 and len(data) >= 4:
            data[:4] = struct.pack(
                "<I", min(2**32 - 1, max(0, struct.unpack_from("<I", data)[0] + rng.randint(-8, 8)))
            )
        elif op == 6 and len(data) >= 4:
            data[:4] = struct.pack("<I", rng.choice([0, 65536, 65537, 2**31, 2**32 - 1]))
        elif op == 7 and len(data) > 8:
            # Large msgpack integers inside the header hit sizes, dims and ids.
            i = rng.randrange(4, len(data) - 1)
            data[i : i + 1] = rng.choice(
                [b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", b"\xd3\x80" + b"\0" * 7, b"\xce\xff\xff\xff\xff"]
            )
    return bytes(data)


def test_fuzz_only_decode_errors() -> None:
    rng = random.Random(0xC0FFEE)
    seeds = _seeds(rng)
    ok = failed = 0
    for i in range(N_FRAMES):
        r = i % 10
        if r < 3:
            data: bytes | bytearray = rng.randbytes(rng.randint(0, 512))
        elif r < 9:
            data = _mutate(rng, seeds)
        else:
            data = rng.choice(HOSTILE)[1] if rng.random() < 0.5 else rng.choice(seeds)
        if rng.random() < 0.5:
            data = bytearray(data)
        try:
            result = decode_message(data)
        except DecodeError:
            failed += 1
        else:
            assert isinstance(result, Message)
            ok += 1
    assert ok > N_FRAMES // 20, ok
    assert failed > N_FRAMES // 2, failed
