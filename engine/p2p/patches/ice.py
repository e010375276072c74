"""aioice changes: prefer direct paths, remember why TURN failed, demux DTLS first, bigger UDP buffers.

**Direct paths first.** The controlling ICE agent gives direct pairs a head start over relayed ones.

aioice nominates aggressively: the first check that succeeds wins. A relayed pair (through TURN)
often answers before a server-reflexive one, whose first check is dropped by the NAT until the
remote's check opens the hole and aioice retries after 0.5 s; so pairs that could talk directly
ended up relayed (seen in the NAT testbed), which costs the TURN server bandwidth and both peers
latency. Here, on the controlling side only, a check on a pair with a relay candidate waits up to
:data:`RELAY_GRACE_S` while some direct pair of the same component may still succeed; if one is
nominated meanwhile, the relayed check is dropped; if every direct pair has failed, it starts at
once. Nothing on the wire changes: checks are only scheduled later, as RFC 8445 leaves to agents.

**Why TURN failed.** aioice drops a failed TURN allocation silently, so a pair that needed the
relay fails with no reason. The wrapper keeps the last failures (:func:`recent_turn_failures`) for
the connection layer to put into its error ("TURN refused: 401 Unauthorized").

**Consent that survives a busy machine.** aioice checks consent (RFC 7675) every ~5 s with a single
request that waits 0.5 s, and closes the link after six checks in a row went unanswered in time. A
volunteer's event loop that lags more than half a second (a GPU batch, a loaded desktop; seen at load
10 on two cores, mid all-reduce) fails every check, and a healthy link is torn down. RFC 7675 only asks
that consent expires 30 s after the last response: here each check is retransmitted as any STUN
request is (0.5, 1, 2 s apart; 7.5 s for an answer), and the link closes when no check has been
answered for :func:`consent_expiry_s` (30 s). A dead peer is still dropped after 30-38 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections import deque
from typing import Any

import aioice.ice as ice
import aioice.stun as stun

RELAY_GRACE_S = 0.75
_POLL_S = 0.05

_original_check_start = ice.Connection.check_start
_original_relayed_candidate = ice.relayed_candidate
_turn_failures: deque[tuple[float, str]] = deque(maxlen=32)
_State = ice.CandidatePair.State
_PENDING = (_State.FROZEN, _State.WAITING, _State.IN_PROGRESS)


def _relayed(pair: Any) -> bool:
    return bool(pair.local_candidate.type == "relay" or pair.remote_candidate.type == "relay")


def _direct_pending(conn: Any, pair: Any) -> bool:
    return any(
        p is not pair and p.component == pair.component and not _relayed(p) and p.state in _PENDING
        for p in conn._check_list
    )


async def check_start(self: Any, pair: Any) -> None:
    if self.ice_controlling and _relayed(pair):
        # Shown as in progress so the pacing loop moves on to other pairs meanwhile.
        self.check_state(pair, ice.CandidatePair.State.IN_PROGRESS)
        deadline = time.monotonic() + RELAY_GRACE_S
        while time.monotonic() < deadline and _direct_pending(self, pair):
            if pair.component in self._nominated:
                break
            await asyncio.sleep(_POLL_S)
        if pair.component in self._nominated:
            self.check_state(pair, ice.CandidatePair.State.FAILED)
            self.check_complete(pair)
            return
    await _original_check_start(self, pair)


async def relayed_candidate(**kwargs: Any) -> Any:
    try:
        return await _original_relayed_candidate(**kwargs)
    except asyncio.CancelledError:
        _turn_failures.append(
            (time.monotonic(), f"TURN server {kwargs.get('turn_server')} did not answer in time")
        )
        raise
    except Exception as e:
        _turn_failures.append((time.monotonic(), f"TURN server {kwargs.get('turn_server')} refused: {e}"))
        raise


def recent_turn_failures(since: float) -> list[str]:
    """Reasons TURN allocations failed after ``since`` (``time.monotonic()``), oldest first."""
    return [reason for at, reason in _turn_failures if at >= since]


# --- RFC 7983 demultiplexing before the STUN parse ------------------------------------------------

_stock_datagram_received = ice.StunProtocol.datagram_received


def datagram_received(self: Any, data: Any, addr: Any) -> None:
    """A datagram whose first byte is 20..63 is DTLS (RFC 7983) and goes straight to the connection
    instead of first failing a STUN parse (an exception per packet); STUN (0..3) is handled as before.
    Where the DTLS layer set an inline receiver on the connection (``_lah_inline``: engine/p2p/patches/
    dtls.py, once its records are compiled) that receiver gets the first look."""
    if data and 19 < data[0] < 64:
        conn = self.receiver
        inline = conn.__dict__.get("_lah_inline")
        if inline is None or not inline(data):
            conn.data_received(data, self.local_candidate.component)
        return
    _stock_datagram_received(self, data, addr)


# --- the datagram queue --------------------------------------------------------------------------


class DatagramQueue:
    """What aioice's ``Connection._queue`` (an ``asyncio.Queue``) is asked for, on a deque.

    Every received datagram passes through that queue (``put_nowait`` in the UDP callback, ``get`` or
    ``get_nowait`` in the DTLS reader), and ``asyncio.Queue`` is pure Python with unbounded-size,
    task-accounting and ``Event`` bookkeeping the reader never uses: about 2 µs a datagram, a third of
    what a data packet costs the receiver once its record and chunk are handled in C. Same order, same
    items (``None`` included: aioice's "connection lost"); waiters are woken in order, one per item."""

    __slots__ = ("_items", "_waiters")

    def __init__(self, items: Any = ()) -> None:
        self._items: deque[Any] = deque(items)
        self._waiters: deque[asyncio.Future[None]] = deque()

    @classmethod
    def replacing(cls, queue: Any) -> DatagramQueue:
        """A queue holding what ``queue`` (an idle ``asyncio.Queue``, nobody waiting on it) holds."""
        items = []
        while queue.qsize():
            items.append(queue.get_nowait())
        return cls(items)

    def qsize(self) -> int:
        return len(self._items)

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():  # a cancelled getter's future is done: skipped
                w.set_result(None)
                return

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def get(self) -> Any:
        while not self._items:
            w = asyncio.get_running_loop().create_future()
            self._waiters.append(w)
            try:
                await w
            except asyncio.CancelledError:
                if w.done() and not w.cancelled() and self._items:
                    self._wake()  # woken, then cancelled before taking the item: the next getter takes it
                raise
        return self._items.popleft()


# --- a larger UDP receive buffer ------------------------------------------------------------------

# A node's event loop stalls now and then (a GPU batch, a busy desktop); the kernel's default UDP
# buffer (208 KiB on Linux, about 180 packets) then overflows and the sender sees loss that no network
# caused. Best effort: the kernel caps it (net.core.rmem_max), and nothing on the wire changes.
UDP_RECEIVE_BUFFER = 4 << 20
_stock_connection_made = ice.StunProtocol.connection_made


def connection_made(self: Any, transport: Any) -> None:
    _stock_connection_made(self, transport)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RECEIVE_BUFFER)


# --- consent freshness judged on the time since the last answer (RFC 7675 section 5.1) ------------

CONSENT_RETRANSMISSIONS = 3
log = logging.getLogger(__name__)


def consent_expiry_s() -> float:
    """30 s with aioice's constants (6 checks, 5 s apart); read at call time so tests may shorten them."""
    return float(ice.CONSENT_FAILURES * ice.CONSENT_INTERVAL)


async def query_consent(self: Any) -> None:
    assert self.remote_password is not None
    last_answer = time.monotonic()
    while True:
        await asyncio.sleep(ice.CONSENT_INTERVAL * (0.8 + 0.4 * random.random()))
        for pair in list(self._nominated.values()):
            request = self.build_request(pair, nominate=False)
            try:
                await pair.protocol.request(
                    request,
                    pair.remote_addr,
                    integrity_key=self.remote_password.encode("utf8"),
                    retransmissions=CONSENT_RETRANSMISSIONS,
                )
                last_answer = time.monotonic()
            except stun.TransactionError:
                pass
        if time.monotonic() - last_answer >= consent_expiry_s():
            log.info("ICE consent expired: no answer to a check for %.0f s", time.monotonic() - last_answer)
            self._query_consent_task = None
            await self.close()
            return
