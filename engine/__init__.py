"""Learning@home's headless runtime: no Qt, nothing from ``app`` or ``coordinator``.

Layers, bottom up:

- :mod:`engine.wire`: bytes on the wire (tensor codec, compression, RPC message schema). Pure.
- :mod:`engine.p2p`: identity, signaling client, WebRTC connections, framing and RPC over data channels.

The ``lah`` command line and the demo that compose the engine with the coordinator and the app live
in the ``lah`` package above it.
"""
