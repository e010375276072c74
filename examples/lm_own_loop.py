"""Your own small GPT, its feed-forward layers the swarm's experts, trained by your own loop.

Read top to bottom, as nanoGPT's train.py: the text, the model, joining the swarm, the loop. Nothing
here is the engine's language model: the model is an ordinary ``nn.Module`` written below, and
``swarm.mixture(grid)`` is the only piece from the swarm, a module over ``[tokens, dim]`` whose experts
run on the volunteers' computers. The experiment (an ``lm`` experiment of the coordinator) fixes the
grids and their width; the vocabulary, the context, the attention, the optimizer and the loop are yours.

    python examples/lm_own_loop.py --coordinator http://127.0.0.1:8470 --experiment shakespeare \
        --token-file ~/trainer-token.json --steps 300

Log in first (once): ``lah train login --coordinator URL --name NAME --code=CODE`` (examples/README.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from engine.lm import DEFAULT_CORPUS  # the shipped text (a path): any UTF-8 text file will do
from engine.swarm import SKIPPABLE, Swarm, SwarmError

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--coordinator", default="http://127.0.0.1:8470", help="the coordinator's URL")
parser.add_argument("--experiment", required=True, help="an experiment of kind lm on that coordinator")
parser.add_argument("--token-file", type=Path, help="as given to `lah train login` (default: the keyring)")
parser.add_argument("--data-dir", type=Path, help="this trainer's identity (default: lah train's)")
parser.add_argument("--steps", type=int, default=300, help="optimizer steps of this loop")
parser.add_argument("--text", type=Path, default=DEFAULT_CORPUS, help="a UTF-8 text file to learn")
parser.add_argument("--context", type=int, default=64, help="tokens per training window")
parser.add_argument("--heads", type=int, default=4, help="attention heads (must divide the width)")
parser.add_argument("--batch-size", type=int, help="windows per step (default: the experiment's)")
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--log-every", type=int, default=10, help="print the loss every this many steps")
args = parser.parse_args()
torch.manual_seed(0)

# -- the data: characters of a text, 90% to train on, 10% to check on -------------------------------

text = args.text.read_text(encoding="utf-8")
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
split = int(0.9 * len(data))
train_data, val_data = data[:split], data[split:]


def get_batch(source: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``context`` tokens, and the same shifted by one (the targets)."""
    starts = torch.randint(len(source) - args.context - 1, (batch,))
    x = torch.stack([source[s : s + args.context] for s in starts])
    y = torch.stack([source[s + 1 : s + 1 + args.context] for s in starts])
    return x, y


# -- the model: a GPT whose feed-forward part is whatever module it is given -------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Attention with a residual, then the feed-forward module. The swarm's experts are residual
    themselves (each returns ``x + FFN(norm(x))``), so the block passes ``x`` to them and keeps what
    they return."""

    def __init__(self, dim: int, heads: int, ffn: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm(x))
        return self.ffn(x)  # [batch, time, dim]: the mixture routes every token on its own


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int, heads: int, ffns: list[nn.Module]) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for ffn in ffns)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


@torch.no_grad()
def val_loss(model: nn.Module, batches: int = 4) -> float:
    """The mean loss on held-out text (a batch the swarm could not serve is left out)."""
    gen_state = torch.get_rng_state()
    torch.manual_seed(1234)  # the same windows every time: before and after are comparable
    losses = []
    for _ in range(batches):
        try:
            losses.append(float(loss_of(model, *get_batch(val_data, 16))))
        except SKIPPABLE:
            continue
    torch.set_rng_state(gen_state)
    return sum(losses) / len(losses) if losses else math.nan


# -- joining the swarm, and the loop -----------------------------------------------------------------

try:
    swarm = Swarm.join(
        args.coordinator, args.experiment, token_file=args.token_file, data_dir=args.data_dir, say=print
    )
except SwarmError as e:  # a wrong address, no login, no such experiment: the sentence says what to do
    print(f"lm_own_loop: {e}", file=sys.stderr)
    sys.exit(2)

with swarm:
    grids = list(swarm.grids.values())  # an lm experiment has one grid per mixture block
    dim = grids[0].dim
    if dim % args.heads:
        print(
            f"lm_own_loop: the experiment's width {dim} is not divisible by --heads {args.heads}",
            file=sys.stderr,
        )
        sys.exit(2)
    print(f"{len(chars)} characters in {args.text.name}; {len(grids)} blocks of width {dim} on grids "
          f"{', '.join(g.name for g in grids)}", flush=True)  # fmt: skip
    model = TinyGPT(len(chars), args.context, dim, args.heads, [swarm.mixture(g.name) for g in grids])
    # The dense part (embeddings, attention, gates, head): the experts hold no parameters here.
    opt = swarm.optimizer(torch.optim.AdamW, model.parameters(), lr=args.lr, weight_decay=0.0)
    batch = args.batch_size or swarm.batch_size
    before = val_loss(model)
    print(f"validation loss before training: {before:.3f}", flush=True)
    for step in range(1, args.steps + 1):
        x, y = get_batch(train_data, batch)
        try:
            loss = loss_of(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        except SKIPPABLE as e:  # the swarm could not serve this batch: the next one tries again
            print(f"step {step}: skipped ({type(e).__name__}: {e})", flush=True)
            continue
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    after = val_loss(model)
    print(f"validation loss after {args.steps} steps: {after:.3f} (before: {before:.3f})", flush=True)

print(f"done: {swarm.stats.line()}")  # after leaving: the receipts were flushed
