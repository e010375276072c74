"""Which inbound offers a node answers: a cap per remote peer, a cap in total, and no replays.

Answering an offer costs an RTCPeerConnection (sockets, timers, a DTLS certificate) held until the
connection opens or ``connect_timeout`` passes. Signatures say who sent an offer, not that the sender
is honest: a peer that signs hundreds of offers a second would otherwise make us start hundreds of
connections and run out of file descriptors. So the node answers at most ``per_peer`` offers of one
peer at a time (one link per peer is the rule; two allow a redial while an old attempt dies) and
``total`` at a time, and drops an offer it has seen already (same sender and session, or same sender
and ICE ufrag: a replayed or duplicated offer). Pure bookkeeping, no I/O; :class:`engine.p2p.Peer`
asks it before answering and tells it when an attempt ends.
"""

from __future__ import annotations

import enum
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

_UFRAG = re.compile(r"^a=ice-ufrag:(\S+)\s*$", re.MULTILINE)


class Verdict(enum.Enum):
    ANSWER = "answer"
    DUPLICATE = "duplicate"
    PEER_BUSY = "peer_busy"  # this peer already has ``per_peer`` attempts in flight
    FULL = "full"  # ``total`` attempts in flight


def ice_ufrag(sdp: str) -> str | None:
    found = _UFRAG.search(sdp)
    return found.group(1) if found else None


@dataclass
class OfferStats:
    answered: int = 0
    duplicate: int = 0
    peer_busy: int = 0
    full: int = 0
    peak_in_flight: int = 0


@dataclass
class InboundAdmission:
    per_peer: int = 2
    total: int = 32
    remember: int = 4096  # offers remembered for duplicate checks (the oldest are forgotten first)
    stats: OfferStats = field(default_factory=OfferStats)
    _in_flight: Counter[str] = field(default_factory=Counter)
    _seen: OrderedDict[tuple[str, str, str], None] = field(default_factory=OrderedDict)

    def admit(self, sender: str, session: str, sdp: str) -> Verdict:
        """Decide on one verified offer; an ANSWER counts as in flight until :meth:`done`."""
        keys = [(sender, "session", session)]
        ufrag = ice_ufrag(sdp)
        if ufrag is not None:
            keys.append((sender, "ufrag", ufrag))
        if any(k in self._seen for k in keys):
            self.stats.duplicate += 1
            return Verdict.DUPLICATE
        if self._in_flight[sender] >= self.per_peer:
            self.stats.peer_busy += 1
            return Verdict.PEER_BUSY
        if self.in_flight >= self.total:
            self.stats.full += 1
            return Verdict.FULL
        for k in keys:
            self._seen[k] = None
        while len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        self._in_flight[sender] += 1
        self.stats.answered += 1
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.in_flight)
        return Verdict.ANSWER

    def done(self, sender: str) -> None:
        """An answered attempt ended (connected or not)."""
        self._in_flight[sender] -= 1
        if self._in_flight[sender] <= 0:
            del self._in_flight[sender]

    @property
    def in_flight(self) -> int:
        return sum(self._in_flight.values())
