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
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from typing import Any

import aioice.ice as ice

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
    instead of first failing a STUN parse (an exception per packet); STUN (0..3) is handled as before."""
    if data and 19 < data[0] < 64:
        self.receiver.data_received(data, self.local_candidate.component)
        return
    _stock_datagram_received(self, data, addr)


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
