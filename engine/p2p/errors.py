"""The p2p package's one exception tree. Callers catch the branch they care about::

    P2PError
    ├── IdentityError            a key file that cannot be read, or a signature that does not verify
    ├── SignalingError           the coordinator's signaling socket failed or refused us
    │   └── PeerUnreachable      the coordinator does not know the peer we asked for (not online)
    ├── ConnectError             no WebRTC connection came up in time
    │   └── PeerMismatch         the remote end is not the peer id we asked for (key or DTLS fingerprint)
    ├── ProtocolError            the remote broke the framing or message rules; the link is dropped
    ├── ConnectionLost           the link closed while a call was waiting on it
    ├── PatchMismatch            aiortc/aioice are not what engine/p2p/patches was written for (strict mode)
    └── RpcError                 a call failed
        ├── RpcTimeout           no answer within the call's timeout (also a TimeoutError)
        ├── RpcCancelled         the call was cancelled by either side
        └── RemoteError          the remote handler answered with an error (``code`` says which)
            └── UnknownMethod    the remote serves no such method

A peer's fault (ProtocolError, PeerMismatch) drops that peer's connection and nothing else.
"""

from __future__ import annotations


class P2PError(Exception):
    """Base of everything the p2p layer raises."""


class IdentityError(P2PError):
    pass


class SignalingError(P2PError):
    pass


class PeerUnreachable(SignalingError):
    pass


class ConnectError(P2PError):
    pass


class PeerMismatch(ConnectError):
    pass


class ProtocolError(P2PError):
    pass


class ConnectionLost(P2PError):
    pass


class RpcError(P2PError):
    pass


class RpcTimeout(RpcError, TimeoutError):
    pass


class RpcCancelled(RpcError):
    pass


class RemoteError(RpcError):
    """The remote handler failed; ``code`` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class UnknownMethod(RemoteError):
    pass


class PatchMismatch(P2PError):
    """aiortc/aioice differ from what the transport patches were written for (version or source)."""
