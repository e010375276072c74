"""The signaling socket's messages, shared by the coordinator (server) and nodes (client).

JSON text frames, one typed message each (a msgspec tagged union, so anything else is rejected before
it is looked at). The exchange::

    server -> Challenge(nonce)
    client -> Hello(public_key, signature over DOMAIN + nonce,     proves the peer id
                    token)                                         and, where the hub asks for it,
                                                                   an account this host is bound to
    server -> Welcome(peer_id, ice_servers)                        or Error(code), then close
    client -> Signal(id, to, description)    server -> Signal(id, sender, to, description) to ``to``
    server -> Error(code, message, ref=id)   when ``to`` is not online, or a message is malformed
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .descriptions import SignedDescription

DOMAIN = b"lah-signal-v1\x00"
MAX_FRAME_BYTES = 64 * 1024
MAX_TOKEN_CHARS = 1024

# Error codes of a refused hello (the hub closes the socket after sending one).
AUTH_FAILED = "auth_failed"  # the key proof is wrong
TOKEN_REQUIRED = "token_required"
TOKEN_INVALID = "token_invalid"  # malformed or forged
TOKEN_EXPIRED = "token_expired"
TOKEN_REVOKED = "token_revoked"
HOST_NOT_BOUND = "host_not_bound"  # the key is not a host of the token's account
ACCOUNT_DISABLED = "account_disabled"


class IceServer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    urls: list[str]
    username: str | None = None
    credential: str | None = None


class Challenge(msgspec.Struct, tag="challenge", frozen=True, forbid_unknown_fields=True):
    nonce: bytes


class Hello(msgspec.Struct, tag="hello", frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    public_key: bytes
    signature: bytes
    token: Annotated[str, msgspec.Meta(max_length=MAX_TOKEN_CHARS)] | None = None


class Welcome(msgspec.Struct, tag="welcome", frozen=True, forbid_unknown_fields=True):
    peer_id: str
    ice_servers: list[IceServer]


class Signal(msgspec.Struct, tag="signal", frozen=True, forbid_unknown_fields=True):
    id: int
    to: str
    description: SignedDescription
    sender: str = ""


class Error(msgspec.Struct, tag="error", frozen=True, forbid_unknown_fields=True):
    code: str
    message: str
    ref: int | None = None


Incoming = Challenge | Welcome | Signal | Error  # what a client may receive
Outgoing = Hello | Signal  # what a server may receive

client_decoder = msgspec.json.Decoder(Incoming)
server_decoder = msgspec.json.Decoder(Outgoing)
encoder = msgspec.json.Encoder()


def encode(msg: msgspec.Struct) -> str:
    return encoder.encode(msg).decode()
