"""Peer-to-peer transport: WebRTC data channels carrying framed, flow-controlled RPC.

Layers, bottom up (each imports only those below it):

- ``errors``: the package's exception tree (drawn there).
- ``identity``: Ed25519 keys on disk; peer id = hash of the public key.
- ``descriptions``: SDP offers/answers signed by the sender's identity key.
- ``signaling_protocol`` / ``signaling``: the coordinator's WebSocket schema and its client.
- ``native`` (a package): the compiled per-packet path (DTLS records, SCTP packets), optional; the
  patches fall back to Python without it.
- ``patches`` (a package) / ``eventloop``: the one place that changes aiortc's behaviour (pinned to its
  version), host candidate pinning, and uvloop where the platform has it.
- ``framing``: sans-I/O frames, credit window and the link's memory budget (``LinkMemory``);
  ``channel``: the same bound to a data channel.
- ``rpc_wire``: what a call is on both ends, no I/O: the handler registry, error replies and their
  exceptions; ``rpc_state``: the endpoint's plain state per waiting request and per served stream
  (its credit); ``rpc``: their asyncio face (``RpcEndpoint``): calls, streams, timeouts on both
  sides and cancellation over one channel.
- ``admission``: which inbound offers are answered (caps per peer and in total, replays dropped; pure).
- ``ice_servers``: the live STUN/TURN servers a new connection gathers from (probed, cached).
- ``connection``: one verified RTCPeerConnection per remote peer (dial/accept).
- ``peer``: the node's facade: signaling + a bounded, idle-reaped pool of links + served methods.
- ``ice_stats``: what ICE chose for a link (the nominated pair's types) and how its SCTP sender is
  doing, for the status lines of engine.node, engine.control and engine.collab.

``identity`` writes keys with engine.files; ``connection``, ``rpc`` and ``peer`` speak engine.wire.

May import: engine.files, engine.wire
"""

from .connection import Link, LinkConfig
from .errors import (
    ConnectError,
    ConnectionLost,
    IdentityError,
    P2PError,
    PeerMismatch,
    PeerUnreachable,
    ProtocolError,
    RemoteError,
    RpcCancelled,
    RpcError,
    RpcTimeout,
    SignalingError,
    UnknownMethod,
)
from .identity import Identity, peer_id_of
from .peer import Peer
from .rpc_wire import CallContext, Handlers

__all__ = [
    "CallContext",
    "ConnectError",
    "ConnectionLost",
    "Handlers",
    "Identity",
    "IdentityError",
    "Link",
    "LinkConfig",
    "P2PError",
    "Peer",
    "PeerMismatch",
    "PeerUnreachable",
    "ProtocolError",
    "RemoteError",
    "RpcCancelled",
    "RpcError",
    "RpcTimeout",
    "SignalingError",
    "UnknownMethod",
    "peer_id_of",
]
