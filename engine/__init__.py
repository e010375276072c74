"""Learning@home's headless runtime: no Qt, nothing from ``app`` or ``coordinator``.

Layers, bottom up (each imports only those above it in this list; each subpackage's docstring says
exactly which)::

    files       atomic writes (temp + fsync + rename, 0600 when private) for everything kept on disk
    wire/       bytes on the wire, pure: limits, compression, the tensor codec, the RPC message schema
    p2p/        WebRTC transport: identity, signaling client, connections, framing with a credit window,
                RPC, the pool of links (Peer); patches/ (every change to aiortc/aioice), native/ (C)
    dht/        Kademlia: signed records, where experts are declared and found
    moe/        experts hosted (ExpertServer) and called (RemoteExpert, RemoteMixtureOfExperts)
    lm/         the language model: corpus, tokenizers, a GPT whose feed-forward blocks are mixtures
    collab/     DeDLOC collaborative training: progress in the DHT, matchmaking, all-reduce
    resources/  the volunteer's limits (Settings), the machine's readings, decide() and the Governor
    account/    tokens and where they are kept (keyring, 0600 file), and the engine's one client of the
                coordinator's HTTP API: what the node, the trainer, the app and ``lah`` sign in with
    node/       the volunteer node
    control/    a running node's local control API and its client (``lah status``, the tray app)
    trainer/    the trainer: models whose mixtures call volunteers' experts, receipts, spot checks
    swarm/      the public API for a researcher's own model

At the top, :mod:`engine.swarm` is the public API for a researcher's own model:
``from engine.swarm import Swarm`` joins an experiment with the trainer's login and gives its mixture
layers as ``torch.nn.Module``s and its (collaborative) optimizer, with receipts and spot checks as for
``lah train`` (docs/researchers.md). It composes :mod:`engine.trainer` and the coordinator's HTTP API.

The ``lah`` command line and the demo that compose the engine with the coordinator and the app live
in the ``lah`` package above it.

May import: nothing
"""
