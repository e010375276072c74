"""Wire format for expert RPC: pure encoding/decoding, no sockets, no I/O.

Layers, bottom to top (each only imports the ones beneath it)::

    limits.py       Limits / DEFAULT_LIMITS: hard caps checked before any allocation
        │
    finite.py       all_finite: the NaN/inf check every untrusted tensor passes, one cheap pass
    inline.py       casts and copies on the calling thread only (no OpenMP team beside the compute's)
        │
    compression.py  float16 cast, int8 and int4 blockwise absmax quantization (stated error bounds)
        │
    tensors.py      TensorMeta + payload <-> torch.Tensor (dtype whitelist, little-endian)
        │
    messages.py     Kind, Header, Message: [u32 header_len][msgpack header][payloads...]

Beside them, importing none of them: statements.py, the exact bytes of signed statements (host
bindings, receipts, spot-check reports, assignments) that nodes, trainers and the coordinator all build.

Exception tree (errors.py)::

    WireError
    ├── DecodeError          only thing decoding untrusted bytes may raise
    │   └── LimitExceeded    claimed sizes over a hard limit
    └── EncodeError          unsendable local input

No pickle, no ``torch.load``, no ``eval``: a peer's bytes can only ever become
the scalar fields and dense tensors the schema describes.

May import: nothing
"""

from __future__ import annotations

from .compression import (
    DEFAULT_BLOCK_SIZE,
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    dequantize_int4,
    dequantize_int8,
    from_float16,
    quantize_int4,
    quantize_int8,
    to_float16,
)
from .errors import DecodeError, EncodeError, LimitExceeded, WireError
from .finite import all_finite
from .limits import DEFAULT_LIMITS, Limits
from .messages import (
    FieldValue,
    Header,
    Kind,
    Message,
    MessageHead,
    decode_message,
    encode_message,
    encode_message_bytes,
    encoded_size,
    peek_message,
)
from .tensors import SUPPORTED_DTYPES, Compression, TensorMeta, decode_tensor, encode_tensor

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_LIMITS",
    "MAX_BLOCK_SIZE",
    "MIN_BLOCK_SIZE",
    "SUPPORTED_DTYPES",
    "Compression",
    "DecodeError",
    "EncodeError",
    "FieldValue",
    "Header",
    "Kind",
    "LimitExceeded",
    "Limits",
    "Message",
    "MessageHead",
    "TensorMeta",
    "WireError",
    "all_finite",
    "decode_message",
    "decode_tensor",
    "dequantize_int4",
    "dequantize_int8",
    "encode_message",
    "encode_message_bytes",
    "encode_tensor",
    "encoded_size",
    "from_float16",
    "peek_message",
    "quantize_int4",
    "quantize_int8",
    "to_float16",
]
