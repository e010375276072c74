"""Learning@home's headless runtime: no Qt, nothing from ``app`` or ``coordinator``.

Layers, bottom up:

- :mod:`engine.wire`: bytes on the wire (tensor codec, compression, RPC message schema). Pure.
- :mod:`engine.p2p`: identity, signaling client, WebRTC connections, framing and RPC over data channels.
- ``engine.cli``: the ``lah`` command.
"""
