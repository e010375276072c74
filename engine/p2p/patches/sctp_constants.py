"""The SCTP sender's limits, in one module that its parts (:mod:`.sctp_sender`, :mod:`.sctp_sack`,
:mod:`.sctp_timers`, :mod:`.handshake`) read at call time, so a test may change one for all of them.

Where a value departs from RFC 9260 it follows Chromium's dcSCTP and says so: a 0.3 s minimum RTO
(RFC 9260 section 16 recommends 1 s) because a home link's round trip is tens of milliseconds and a lost
tail would otherwise cost a whole second; the initial RTO keeps the RFC's 1 s (its 3 s is older).
"""

from __future__ import annotations

RTO_INITIAL = 1.0  # RFC 9260 section 16
RTO_MIN = 0.3  # RFC 9260 recommends 1 s; dcSCTP's choice (see the module docstring)
RTO_MAX = 10.0
MAX_RETRANS = 10  # Association.Max.Retrans
ASSOCIATION_TIMEOUT = 30.0  # the longest a peer may stay silent with data outstanding
RECEIVE_WINDOW = 4 << 20  # the most a peer may send beyond what we delivered (Chromium: 5 MiB)
DUPTHRESH = 3
# Added to the probe timeout for the peer's delayed SACK (RFC 9002's max_ack_delay). RFC 8985 says
# 200 ms (TCP); SACK delays are 0 (stock aiortc) or 20 ms (ours), and a probe that comes too early
# costs one packet, one that comes late costs every RPC whose tail was lost that much latency.
WORST_DELAYED_SACK = 0.025
PTO_GRANULARITY = 0.01  # the least the probe timeout adds to SRTT for variance (RFC 9002: 1 ms)
PACING_BURST_S = 0.01  # token bucket depth: timers on a busy event loop fire late
