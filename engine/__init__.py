"""Learning@home's headless runtime: no Qt, nothing from ``app`` or ``coordinator``.

Layers, bottom up:

- :mod:`engine.wire`: bytes on the wire (tensor codec, compression, RPC message schema). Pure.
- :mod:`engine.p2p`: identity, signaling client, WebRTC connections, framing and RPC over data channels.

At the top, :mod:`engine.swarm` is the public API for a researcher's own model:
``from engine.swarm import Swarm`` joins an experiment with the trainer's login and gives its mixture
layers as ``torch.nn.Module``s and its (collaborative) optimizer, with receipts and spot checks as for
``lah train`` (docs/researchers.md). It composes :mod:`engine.trainer` and the coordinator's HTTP API.

The ``lah`` command line and the demo that compose the engine with the coordinator and the app live
in the ``lah`` package above it.
"""
