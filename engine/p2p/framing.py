"""Frames on a data channel: messages cut to the channel's size limit, and credit-based flow control.

Sans-I/O: :class:`Framer` turns messages into frames and :class:`Deframer` turns frames back into
messages and credit grants; :mod:`engine.p2p.channel` moves the bytes. Data channels refuse messages
over the negotiated max-message-size (256 KiB between aiortc or browser peers, 64 KiB when the remote
advertises none), while one RPC message may hold megabytes of tensors, hence the split. Frames of
different messages interleave on the one ordered channel, so a small call is not stuck behind a big
transfer.

Layout (little-endian)::

    DATA    u8 0 | u8 flags (FIRST=1, LAST=2) | u32 message id | u64 total size if FIRST | payload
    ABORT   u8 0 | u8 flags = ABORT (4)    | u32 message id        (the sender gave the message up)
    WINDOW  u8 1 | u64 credit increment

Flow control (as HTTP/2's, one window per connection): a sender starts with ``window`` bytes of
credit, spends a frame's payload length on each DATA frame and waits when it has none. The receiver
grants credit back as the application *consumes* messages, so however slowly it reads, at most
``window`` bytes are held for it. The sender also caps the total size of messages it has started but
not finished at ``window // 2``; with the receiver's cap on one message (``max_message_bytes``, at most
half the window) that leaves room for every partial message to complete, so a slow reader stalls the
sender but never deadlocks it.

Memory follows the data, never a claim: a message's buffer grows as its frames arrive (the total a
FIRST frame declares is only checked against the limit and the bytes that follow), so what partial
messages hold is bytes actually received, inside the credit window. A sender that gives a message up
half way (its call timed out or was cancelled) sends ABORT, and the receiver drops the partial and
grants its bytes back. Every received byte is charged to the link's :class:`LinkMemory` as it arrives
and returned when the application consumes it; the RPC layer charges decoded tensors larger than
their wire form to the same budget.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .errors import ProtocolError

DATA = 0
WINDOW = 1
FIRST = 1
LAST = 2
ABORT = 4

_DATA_HEAD = struct.Struct("<BBI")
_TOTAL = struct.Struct("<Q")
_WINDOW = struct.Struct("<BQ")
DATA_OVERHEAD = _DATA_HEAD.size + _TOTAL.size  # the most a DATA frame adds to its payload

Buffer = bytes | bytearray | memoryview


def message_size(pieces: Sequence[Buffer]) -> int:
    return sum(len(p) for p in pieces)


def data_frames(message_id: int, pieces: Sequence[Buffer], max_frame: int) -> Iterator[bytes]:
    """Cut one message (given as pieces, so it is never concatenated whole) into DATA frames."""
    if max_frame <= DATA_OVERHEAD:
        raise ValueError(f"max_frame {max_frame} leaves no room for payload")
    total = message_size(pieces)
    views = [memoryview(p).cast("B") for p in pieces if len(p)]
    index, offset, sent = 0, 0, 0
    first = True
    while first or sent < total:
        flags = FIRST if first else 0
        head = _DATA_HEAD.size + (_TOTAL.size if first else 0)
        room = max_frame - head
        parts: list[Buffer] = []
        while room and index < len(views):
            view = views[index]
            take = min(room, len(view) - offset)
            parts.append(view[offset : offset + take])
            room -= take
            offset += take
            sent += take
            if offset == len(view):
                index, offset = index + 1, 0
        if sent == total:
            flags |= LAST
        header = _DATA_HEAD.pack(DATA, flags, message_id)
        if first:
            header += _TOTAL.pack(total)
        yield b"".join([header, *parts])
        first = False


def window_frame(increment: int) -> bytes:
    return _WINDOW.pack(WINDOW, increment)


def abort_frame(message_id: int) -> bytes:
    return _DATA_HEAD.pack(DATA, ABORT, message_id)


def is_abort(frame: bytes) -> bool:
    return len(frame) >= 2 and frame[0] == DATA and frame[1] == ABORT


@dataclass
class LinkMemory:
    """What one link holds for received data, in bytes: frames not yet consumed (credit bounds
    those) plus decoded tensors beyond their wire size (RPC charges those before decoding).

    ``charge`` is unconditional (bytes the credit window already admitted); ``try_charge`` admits
    an extra only while it fits under ``capacity``, or when nothing extra is charged at all, so one
    message larger than the budget still makes progress, alone."""

    capacity: int
    used: int = 0
    extra: int = 0  # the part of ``used`` charged by try_charge (decoded expansion)
    peak: int = 0
    refused: int = 0  # try_charge calls that had to wait

    def charge(self, n: int) -> None:
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def try_charge(self, n: int) -> bool:
        if n <= 0:
            return True
        if self.extra and self.used + n > self.capacity:
            self.refused += 1
            return False
        self.extra += n
        self.charge(n)
        return True

    def release(self, n: int, *, extra: bool = False) -> None:
        self.used -= n
        if extra:
            self.extra -= n


@dataclass
class _Partial:
    total: int
    buffer: bytearray = field(default_factory=bytearray)

    @property
    def filled(self) -> int:
        return len(self.buffer)


@dataclass
class Deframer:
    """Reassembles messages and keeps the receiving side of the credit window.

    ``feed`` returns the messages a frame completed; ``release`` is called when the application has
    consumed one, and says how much credit to grant back. Any frame that breaks the
    rules raises ProtocolError: the remote is at fault and the connection is to be dropped.
    """

    window: int
    max_message_bytes: int
    max_partial: int = 256
    grant_threshold: int = 256 * 1024
    memory: LinkMemory | None = None
    received: int = 0
    granted: int = 0
    held: int = 0  # bytes received and not yet consumed by the application
    partial_bytes: int = 0  # of which in messages not yet complete
    aborted: int = 0
    _pending_release: int = 0
    _partials: dict[int, _Partial] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_message_bytes > self.window // 2:
            raise ValueError("max_message_bytes must be at most half the window")
        self.granted = self.window
        if self.memory is None:
            self.memory = LinkMemory(capacity=self.window)

    def feed(self, frame: bytes) -> list[tuple[int, bytearray]]:
        """Completed messages as (message id, bytes): none, or the one this frame finished."""
        if len(frame) < 1:
            raise ProtocolError("empty frame")
        kind = frame[0]
        if kind == WINDOW:
            raise ProtocolError("a WINDOW frame belongs to the sender side (use Credit)")
        if kind != DATA or len(frame) < _DATA_HEAD.size:
            raise ProtocolError(f"unknown frame type {kind} or short frame ({len(frame)} bytes)")
        _, flags, message_id = _DATA_HEAD.unpack_from(frame)
        pos = _DATA_HEAD.size
        if flags == ABORT:
            raise ProtocolError("an ABORT frame goes to abort(), not feed()")
        if flags & ~(FIRST | LAST):
            raise ProtocolError(f"unknown frame flags {flags:#x}")
        if flags & FIRST:
            if len(frame) < pos + _TOTAL.size:
                raise ProtocolError("FIRST frame without a total size")
            (total,) = _TOTAL.unpack_from(frame, pos)
            pos += _TOTAL.size
            if total > self.max_message_bytes:
                raise ProtocolError(f"message of {total} bytes is over the {self.max_message_bytes} limit")
            if message_id in self._partials:
                raise ProtocolError(f"message {message_id} started twice")
            if len(self._partials) >= self.max_partial:
                raise ProtocolError(f"more than {self.max_partial} messages in progress")
            partial = _Partial(total)  # nothing allocated from the claim: the buffer grows with data
            self._partials[message_id] = partial
        else:
            found = self._partials.get(message_id)
            if found is None:
                raise ProtocolError(f"continuation of unknown message {message_id}")
            partial = found
        payload = memoryview(frame)[pos:]
        size = len(payload)
        self.received += size
        if self.received > self.granted:
            raise ProtocolError(f"sender overran its credit window by {self.received - self.granted} bytes")
        if partial.filled + size > partial.total:
            raise ProtocolError(f"message {message_id} overflows its declared size {partial.total}")
        partial.buffer += payload
        self.held += size
        self.partial_bytes += size
        assert self.memory is not None
        self.memory.charge(size)
        completed: list[tuple[int, bytearray]] = []
        if flags & LAST:
            if partial.filled != partial.total:
                raise ProtocolError(
                    f"message {message_id} ended at {partial.filled} of {partial.total} bytes"
                )
            del self._partials[message_id]
            self.partial_bytes -= partial.total
            completed.append((message_id, partial.buffer))
        return completed

    def abort(self, frame: bytes) -> int:
        """The sender gave a message up: drop what arrived of it; returns the bytes to release."""
        if len(frame) != _DATA_HEAD.size or not is_abort(frame):
            raise ProtocolError("malformed ABORT frame")
        (_, _, message_id) = _DATA_HEAD.unpack(frame)
        partial = self._partials.pop(message_id, None)
        if partial is None:
            return 0  # it had already completed, or never started: nothing held
        self.partial_bytes -= partial.filled
        self.aborted += 1
        return partial.filled

    def release(self, size: int) -> int:
        """The application consumed ``size`` bytes; return credit to grant now (0 to wait for more)."""
        self.held -= size
        assert self.memory is not None
        self.memory.release(size)
        self._pending_release += size
        if self._pending_release >= self.grant_threshold or self.held == 0:
            increment = self._pending_release
            self._pending_release = 0
            self.granted += increment
            return increment
        return 0

    @property
    def partial_count(self) -> int:
        return len(self._partials)


def parse_window(frame: bytes) -> int:
    if len(frame) != _WINDOW.size or frame[0] != WINDOW:
        raise ProtocolError("malformed WINDOW frame")
    (increment,) = _WINDOW.unpack(frame)[1:]
    if increment <= 0:
        raise ProtocolError("WINDOW frame with no credit")
    return int(increment)
