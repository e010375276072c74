"""engine.lm's model and loop: causal, per-token routing through the mixture, tied head, FLOPs-matched
dense twin, training that learns, and a stop at the first non-finite loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.lm import (
    ConfigError,
    CsvLog,
    GradientNotFinite,
    LanguageModel,
    LmConfig,
    LossNotFinite,
    TrainSettings,
    open_corpus,
    train,
)
from engine.moe import LocalMixtureOfExperts


def local(config: LmConfig) -> LanguageModel:
    return LanguageModel(
        config, lambda i: LocalMixtureOfExperts(config.dim, config.grid, config.expert_spec, config.k_best)
    )


SMALL = LmConfig(vocab_size=65, context=16, layers=2, heads=2, dim=32, moe_every=1, grid=(4, 4), k_best=2)


def test_the_default_has_256_experts_in_every_other_block_at_dense_flops() -> None:
    config = LmConfig(vocab_size=65)
    assert config.moe_blocks == (1, 3) and config.experts_per_layer == 256
    assert config.k_best * config.expert_spec.hidden_size == 4 * config.dim
    assert config.dense_twin().moe_blocks == ()


def test_the_model_is_causal() -> None:
    torch.manual_seed(0)
    model = local(SMALL).eval()
    x = torch.randint(65, (1, 16))
    y = x.clone()
    y[0, 10] = (y[0, 10] + 1) % 65
    a, _ = model(x)
    b, _ = model(y)
    assert torch.allclose(a[0, :10], b[0, :10], atol=1e-5)
    assert not torch.allclose(a[0, 10:], b[0, 10:])


class Counting(nn.Module):
    """A mixture stand-in that records the shape it is called with."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(x.shape))
        return x


def test_every_token_is_one_sample_of_the_mixture() -> None:
    made: dict[int, Counting] = {}
    model = LanguageModel(SMALL, lambda i: made.setdefault(i, Counting()))
    model(torch.randint(65, (3, 16)))
    assert sorted(made) == [0, 1] and all(m.shapes == [(48, 32)] for m in made.values())


def test_the_head_is_tied_and_experts_are_not_dense_parameters() -> None:
    model = local(SMALL)
    assert model.head.weight is model.tokens.weight
    dense = {id(p) for p in model.dense_parameters()}
    experts = [p for i in SMALL.moe_blocks for p in model.blocks[i].ffn.experts.parameters()]
    gates = [p for i in SMALL.moe_blocks for p in model.blocks[i].ffn.gates.parameters()]
    assert experts and not any(id(p) in dense for p in experts) and all(id(p) in dense for p in gates)


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"dim": 30, "heads": 4}, "not divisible"),
        ({"layers": 0}, "layers must be"),
        ({"grid": ()}, "grid size"),
    ],
)
def test_impossible_configs(kwargs: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        LmConfig(vocab_size=65, **kwargs)  # type: ignore[arg-type]


def test_mixture_blocks_need_a_factory_and_windows_fit_the_context() -> None:
    with pytest.raises(ConfigError, match="give a factory"):
        LanguageModel(SMALL)
    with pytest.raises(ConfigError, match="longer than the context"):
        local(SMALL)(torch.zeros(1, 17, dtype=torch.long))


def test_a_few_hundred_steps_learn_the_corpus_and_generate_from_it(tmp_path: Path) -> None:
    """From a uniform guess (ln 65 = 4.17 nats) to well under the corpus' unigram entropy (3.3)."""
    torch.manual_seed(0)
    corpus = open_corpus()
    config = LmConfig(
        vocab_size=corpus.vocab_size, context=32, layers=2, heads=2, dim=64, grid=(4, 4), k_best=2
    )
    model = local(config)
    log = CsvLog(tmp_path / "metrics.csv")
    rows = list(
        train(
            model,
            corpus,
            TrainSettings(steps=300, batch=16, lr=3e-3, eval_every=150, eval_batches=4),
            log=log,
        )
    )
    log.close()
    assert [r.step for r in rows] == [150, 300]
    assert rows[-1].val_loss is not None and rows[-1].val_loss < 2.9
    assert rows[-1].perplexity == pytest.approx(math.exp(rows[-1].val_loss))
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 3  # header and two rows
    assert corpus.tokenizer is not None
    out = model.generate(
        torch.tensor([corpus.tokenizer.encode("ROMEO:")]), 40, generator=torch.Generator().manual_seed(1)
    )
    assert out.shape == (1, 46) and len(corpus.tokenizer.decode(out[0].tolist())) == 46


def test_a_nan_loss_stops_training_before_it_touches_a_weight() -> None:
    torch.manual_seed(0)
    corpus = open_corpus()
    model = local(SMALL)
    with torch.no_grad():
        model.tokens.weight[0, 0] = float("nan")  # every window holding token 0 goes NaN
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(LossNotFinite, match="at step 1"):
        list(train(model, corpus, TrainSettings(steps=5, batch=8)))
    after = model.state_dict()
    assert all(torch.equal(before[k].nan_to_num(), after[k].nan_to_num()) for k in before)


def test_a_non_finite_gradient_stops_training_before_it_touches_a_weight() -> None:
    torch.manual_seed(0)
    corpus = open_corpus()
    model = local(SMALL)
    name, param = next(iter(model.named_parameters()))
    param.register_hook(lambda g: g * float("inf"))  # a finite loss, an infinite gradient
    before = {k: v.clone() for k, v in model.state_dict().items()}
    settled: list[bool] = []
    with pytest.raises(GradientNotFinite, match=f"the gradient of {name} is not finite at step 1"):
        list(train(model, corpus, TrainSettings(steps=5, batch=8), settle=settled.append))
    assert settled == [False]  # that step's receipts are withheld
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_every_good_step_is_settled_and_a_nan_loss_is_not() -> None:
    torch.manual_seed(0)
    corpus = open_corpus()
    settled: list[bool] = []
    list(train(local(SMALL), corpus, TrainSettings(steps=3, batch=8, eval_every=3), settle=settled.append))
    assert settled == [True, True, True]
    model = local(SMALL)
    with torch.no_grad():
        model.tokens.weight[0, 0] = float("nan")
    settled.clear()
    with pytest.raises(LossNotFinite):
        list(train(model, corpus, TrainSettings(steps=5, batch=8), settle=settled.append))
    assert settled == [False]
