"""A host killed with SIGKILL resumes from its last checkpoint: learned weights survive, nothing is torn."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from engine.moe import ExpertServer, ExpertSpec

SPEC = ExpertSpec("ffn", 8, hidden=16)
UID = "ffn.0.0"

# The child trains its expert with backward steps and checkpoints every 20 steps; after each one it
# prints the weights' sum (what was saved) and pauses, so the parent can kill it knowing the newest
# checkpoint on disk.
CHILD = r"""
import asyncio, json, sys, torch
from engine.moe import ExpertServer, ExpertSpec
async def main(ckpt):
    specs = {"ffn.0.0": ExpertSpec("ffn", 8, hidden=16)}
    options = {"checkpoint_dir": ckpt, "checkpoint_interval_s": 3600, "backend_options": {"lr": 0.05}}
    server = ExpertServer.create(specs, device="cpu", **options)
    await server.start()
    backend = server.experts["ffn.0.0"]
    step = 0
    while True:
        x = torch.randn(4, 8)
        await backend.forward("trainer", f"a{step}", x)
        await backend.backward("trainer", f"a{step}", torch.ones(4, 8))
        step += 1
        if step % 20 == 0:
            paths = await server.checkpoint()
            total = float(sum(p.sum() for p in backend.module.parameters()))
            print(json.dumps({"step": step, "sum": total, "files": [str(p) for p in paths]}), flush=True)
            await asyncio.sleep(0.5)
asyncio.run(main(sys.argv[1]))
"""


def test_restart_after_sigkill_resumes_from_last_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "experts"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ckpt)], stdout=subprocess.PIPE, text=True, env=env
    )
    saved = []
    try:
        deadline = time.monotonic() + 60
        assert child.stdout is not None
        while len(saved) < 3 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if line:
                saved.append(json.loads(line))
        assert len(saved) >= 3, "the child never checkpointed"
    finally:
        child.send_signal(signal.SIGKILL)  # no shutdown, no final checkpoint: whatever is on disk
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    asyncio.run(_restart_and_check(ckpt, saved[-1]["sum"]))


async def _restart_and_check(ckpt: Path, last_saved_sum: float) -> None:
    server = ExpertServer.create({UID: SPEC}, device="cpu", checkpoint_dir=ckpt)
    untrained = float(sum(p.detach().sum() for p in server.experts[UID].module.parameters()))
    await server.start()
    try:
        restored = float(sum(p.detach().sum() for p in server.experts[UID].module.parameters()))
        assert abs(restored - last_saved_sum) < 1e-4, (restored, last_saved_sum)
        assert abs(restored - untrained) > 1e-3  # trained weights came back, not a fresh init
        out = await server.experts[UID].forward("t", "z", torch.randn(2, 8))
        assert torch.isfinite(out).all()
    finally:
        await server.close()
