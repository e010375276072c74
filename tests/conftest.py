"""Every test process runs the transport the node runs: aiortc with the project's patches, installed
once here as ``lah`` installs them at process start (strict: a mismatch fails the run loudly)."""

from engine.p2p.patches import install

install(strict=True)
