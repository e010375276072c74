"""int8 blocks follow rows by default (engine.wire.compression.row_block_size): in a batch of tokens,
each row keeps its own scale, so a token whose magnitude is small next to its batch's largest is not
flattened to a few quantization levels."""

from __future__ import annotations

import torch

from engine.wire import Compression, Kind, Message, decode_message, encode_message_bytes
from engine.wire.compression import DEFAULT_BLOCK_SIZE, MIN_BLOCK_SIZE, row_block_size
from engine.wire.tensors import encode_tensor


def test_a_block_is_the_widest_power_of_two_dividing_a_row() -> None:
    assert row_block_size((768, 128)) == 128
    assert row_block_size((4, 32, 1024)) == 1024
    assert row_block_size((10, 192)) == 64  # 192 = 3 * 64: blocks of 64 never span rows
    # no row structure, rows too narrow to split evenly, or rows as wide as the default: the default
    assert row_block_size((5000,)) == DEFAULT_BLOCK_SIZE
    assert row_block_size((10, 100)) == DEFAULT_BLOCK_SIZE  # 4 divides 100; below the minimum block
    assert row_block_size((10, 96)) == DEFAULT_BLOCK_SIZE  # 32 divides 96: below the minimum block
    assert MIN_BLOCK_SIZE == 64
    assert row_block_size((3, 4096)) == DEFAULT_BLOCK_SIZE
    assert row_block_size((3, 16384)) == DEFAULT_BLOCK_SIZE
    assert row_block_size((3, 0)) == DEFAULT_BLOCK_SIZE


def test_an_int8_batch_of_tokens_keeps_every_row_close() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(768, 128, generator=gen) * torch.exp(1.5 * torch.randn(768, 1, generator=gen))
    msg = Message(Kind.REQUEST, 1, "m", tensors=[rows])
    out = decode_message(encode_message_bytes(msg, Compression.INT8)).tensors[0]
    per_row = ((out - rows).norm(dim=1) / rows.norm(dim=1)).median()
    assert per_row < 0.01, per_row  # one block over 32 rows left the median row 18% off
    meta, _ = encode_tensor(rows, Compression.INT8)
    assert meta.block_size == 128
    explicit, _ = encode_tensor(rows, Compression.INT8, DEFAULT_BLOCK_SIZE)  # a caller's choice holds
    assert explicit.block_size == DEFAULT_BLOCK_SIZE
