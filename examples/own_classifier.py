"""Your own classifier, on your own data, with the swarm's experts as its hidden layer.

Read top to bottom: the data (an .npz of yours, or a synthetic one made on first run), the model,
joining the swarm, the loop, the accuracy. The data has a shape of its own (20 features, 4 classes by
default: not the digits demo's 64 and 10); the experiment (a classifier experiment of the coordinator)
fixes only the experts' grid and width, and the model maps its features to that width and back.

    python examples/own_classifier.py --coordinator http://127.0.0.1:8470 --experiment ffn \
        --token-file ~/trainer-token.json --steps 200

Log in first (once): ``lah train login --coordinator URL --name NAME --code=CODE`` (examples/README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from engine.swarm import SKIPPABLE, Swarm, SwarmError

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--coordinator", default="http://127.0.0.1:8470", help="the coordinator's URL")
parser.add_argument("--experiment", required=True, help="a classifier experiment on that coordinator")
parser.add_argument("--token-file", type=Path, help="as given to `lah train login` (default: the keyring)")
parser.add_argument("--data-dir", type=Path, help="this trainer's identity (default: lah train's)")
parser.add_argument("--steps", type=int, default=200, help="batches of this loop")
parser.add_argument("--data", type=Path, default=Path("own_data.npz"), help=".npz: x, y (made if missing)")
parser.add_argument("--grid", help="the experiment's grid for the hidden layer (default: its first)")
parser.add_argument("--batch-size", type=int, help="samples per batch (default: the experiment's)")
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--log-every", type=int, default=20, help="print the loss every this many batches")
args = parser.parse_args()
torch.manual_seed(0)

# -- the data: x (samples x features), y (integer labels), in an .npz --------------------------------

if not args.data.exists():
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=3000, n_features=20, n_informative=12, n_classes=4, class_sep=1.5, random_state=0
    )
    np.savez(args.data, x=x.astype(np.float32), y=y.astype(np.int64))
    print(f"made {args.data}: {x.shape[0]} samples of {x.shape[1]} features, 4 classes", flush=True)
with np.load(args.data) as npz:
    x_all = torch.from_numpy(np.asarray(npz["x"], dtype=np.float32))
    y_all = torch.from_numpy(np.asarray(npz["y"]).astype(np.int64))
order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(0))
cut = int(0.8 * len(order))
x_train, y_train = x_all[order[:cut]], y_all[order[:cut]]
x_test, y_test = x_all[order[cut:]], y_all[order[cut:]]
mean, std = x_train.mean(0), x_train.std(0) + 1e-6  # standardized on the training part only
x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
features, classes = x_train.shape[1], int(y_all.max()) + 1


@torch.no_grad()
def accuracy(model: nn.Module) -> float:
    """Test accuracy (a batch the swarm could not serve counts as wrong)."""
    model.eval()
    correct = 0
    for s in range(0, len(x_test), 256):
        try:
            correct += int((model(x_test[s : s + 256]).argmax(1) == y_test[s : s + 256]).sum())
        except SKIPPABLE:
            continue
    model.train()
    return correct / len(x_test)


# -- joining the swarm, the model, and the loop ------------------------------------------------------

try:
    swarm = Swarm.join(
        args.coordinator, args.experiment, token_file=args.token_file, data_dir=args.data_dir, say=print
    )
except SwarmError as e:  # a wrong address, no login, no such experiment: the sentence says what to do
    print(f"own_classifier: {e}", file=sys.stderr)
    sys.exit(2)

with swarm:
    # A classifier experiment has one grid, named after it (a language model: one per mixture block).
    name = args.grid or next(iter(swarm.grids))
    try:
        hidden = swarm.mixture(name)  # the volunteers' experts: an nn.Module over [samples, width]
    except SwarmError as e:  # a grid the experiment does not offer: the sentence names those it does
        print(f"own_classifier: {e}", file=sys.stderr)
        sys.exit(2)
    dim, shape = hidden.dim, "x".join(map(str, hidden.grid.shape))  # the experiment fixes these
    print(f"{len(x_train)} training samples of {features} features, {classes} classes; "
          f"experts of width {dim} on a {shape} grid", flush=True)  # fmt: skip
    model = nn.Sequential(
        nn.Linear(features, dim),  # your features to the experts' width
        nn.GELU(),
        hidden,
        nn.LayerNorm(dim),
        nn.Linear(dim, classes),  # and to your classes
    )
    opt = swarm.optimizer(torch.optim.Adam, model.parameters(), lr=args.lr)
    batch = args.batch_size or swarm.batch_size
    before = accuracy(model)
    print(f"test accuracy before training: {before:.3f}", flush=True)
    gen = torch.Generator().manual_seed(1)
    for step in range(1, args.steps + 1):
        index = torch.randint(len(x_train), (batch,), generator=gen)
        try:
            loss = F.cross_entropy(model(x_train[index]), y_train[index])
            opt.zero_grad()
            loss.backward()
            opt.step()  # collaborative experiments: steps once the trainers together reach the target
        except SKIPPABLE as e:  # the swarm could not serve this batch: the next one tries again
            print(f"step {step}: skipped ({type(e).__name__}: {e})", flush=True)
            continue
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    after = accuracy(model)
    print(f"test accuracy after {args.steps} steps: {after:.3f} (before: {before:.3f})", flush=True)

print(f"done: {swarm.stats.line()}")  # after leaving: the receipts were flushed
