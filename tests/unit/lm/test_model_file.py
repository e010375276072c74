"""The one-file model (engine/lm/model_file.py) and ``lah generate`` on it, without a swarm or sockets.

A file loads into a local model with exactly the weights written (same logits), and generation is
reproducible by seed. Every file or prompt that cannot be used is refused with a sentence and exit
status 2: a missing file, bytes that are not safetensors, another safetensors file, metadata that
describes no model, tensors that do not fit it, an expert altered after it was gathered, non-finite
values, symbols outside the tokenizer, another tokenizer, and a file without its tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.lm import LmConfig, ModelFileError, TokenizerMismatch
from engine.lm.model_file import (
    FORMAT,
    encode_model_file,
    expert_prefixes,
    local_model,
    read_model_file,
    stored_tensors,
)
from engine.lm.tokenizer import CharTokenizer, save
from engine.moe.weights import weights_digest
from lah.cli import main as lah_main

TEXT = "to be or not to be: that is the question.\n"
TOK = CharTokenizer.fit(TEXT)
LM = LmConfig(
    vocab_size=TOK.vocab_size, context=16, layers=2, heads=2, dim=16, moe_every=1, grid=(2, 2), k_best=2
)


def write(path: Path, *, tokenizer: bool = True) -> Path:
    torch.manual_seed(1)
    model = local_model(LM)
    state = model.state_dict()
    experts = {}
    for uid, prefix in expert_prefixes(LM, "tiny").items():
        names = [n for n in state if n.startswith(prefix)]
        digest = weights_digest([n[len(prefix) :] for n in names], [state[n] for n in names])
        experts[uid] = {
            "host": "h1",
            "steps": 3,
            "sha256": digest,
            "replicas": 2,
            "answered": 2,
            "agree": False,
        }
    path.write_bytes(
        encode_model_file(
            model, experiment="tiny", tokenizer_digest=TOK.digest, tokenizer=TOK if tokenizer else None,
            experts=experts, missing=[], dense={"checkpoint": "c", "step": 7},
        )
    )  # fmt: skip
    return path


def rewrite(path: Path, change: Callable[[dict[str, torch.Tensor], dict[str, str]], None]) -> Path:
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
    change(tensors, meta)
    save_file(tensors, str(path), metadata=meta)
    return path


def generate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = lah_main(["generate", *args])
    return code, capsys.readouterr().out


def test_a_file_loads_into_a_local_model_with_the_same_weights_and_logits(tmp_path: Path) -> None:
    path = write(tmp_path / "m.safetensors")
    torch.manual_seed(1)
    original = local_model(LM)
    loaded = read_model_file(path)
    assert loaded.experiment == "tiny" and loaded.tokenizer.digest == TOK.digest and loaded.missing == []
    assert loaded.experts["tiny_b0.1.1"]["steps"] == 3 and loaded.model.config == LM
    assert "head.weight" not in stored_tensors(loaded.model)  # tied: stored once
    assert loaded.model.head.weight is loaded.model.tokens.weight
    for name, t in original.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], t), name
    idx = torch.tensor([TOK.encode("to be or not")])
    assert torch.equal(loaded.model(idx)[0], original(idx)[0])


def test_generate_prints_the_prompt_and_its_continuation_reproducibly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "m.safetensors")
    code, out = generate(capsys, "--model", str(path), "--prompt", "to be", "--tokens", "30", "--seed", "3")
    assert code == 0, out
    text = out.rstrip("\n")
    assert text.startswith("to be") and len(text) == len("to be") + 30 and set(text) <= set(TOK.chars)
    assert (
        generate(capsys, "--model", str(path), "--prompt", "to be", "--tokens", "30", "--seed", "3")[1] == out
    )
    args = ["--model", str(path), "--prompt", "to be", "--tokens", "30", "--seed"]
    other = [generate(capsys, *args, str(s))[1] for s in (4, 5)]
    assert any(o != out for o in other)
    greedy = generate(capsys, "--model", str(path), "--prompt", "to", "--tokens", "5", "--top-k", "1")[1]
    model = read_model_file(path).model
    ids = TOK.encode("to")
    for _ in range(5):
        ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    assert greedy.rstrip("\n") == TOK.decode(ids)  # top-1 sampling is the argmax, whatever the seed


def _drop_expert_tensor(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    del t["blocks.1.ffn.experts.3.up.bias"]


def _reshape(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    t["blocks.0.attn.qkv.weight"] = t["blocks.0.attn.qkv.weight"][:8].clone()


def _extra(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    t["blocks.9.secret"] = torch.zeros(3)


def _half(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    t["norm.weight"] = t["norm.weight"].half()


def _alter_expert(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    t["blocks.0.ffn.experts.2.down.weight"][0, 0] += 0.5


def _nan(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    t["positions.weight"][3, 3] = float("nan")


def _format(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    m["format"] = "lah-expert-checkpoint/1"


def _config(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    m["lm"] = json.dumps({**json.loads(m["lm"]), "dim": "wide"})


def _unknown_field(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    m["lm"] = json.dumps({**json.loads(m["lm"]), "rope": True})


def _bigger(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    m["lm"] = json.dumps({**json.loads(m["lm"]), "dim": 32})


def _foreign_expert(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    m["experts"] = json.dumps({**json.loads(m["experts"]), "tiny_b7.0.0": {"sha256": "0" * 64}})


def _tokenizer_digest(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
    m["tokenizer"] = CharTokenizer([*TOK.chars, "#"]).to_json()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_drop_expert_tensor, "1 tensors missing (e.g. blocks.1.ffn.experts.3.up.bias)"),
        (_reshape, "blocks.0.attn.qkv.weight is float32 (8, 16); the model's is float32 (48, 16)"),
        (_extra, "not in the model (e.g. blocks.9.secret)"),
        (_half, "norm.weight is float16"),
        (_alter_expert, "expert tiny_b0.1.0's weights hash to"),
        (_nan, "NaN or infinite"),
        (_format, "not a model lah export wrote"),
        (_config, "metadata does not describe a model"),
        (_unknown_field, "unknown fields ['rope']"),
        (_bigger, "does not fit the model"),
        (_foreign_expert, "no place for: tiny_b7.0.0"),
        (_tokenizer_digest, "differs from the experiment's"),
    ],
)
def test_a_file_that_does_not_fit_is_refused_with_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, said: str
) -> None:
    path = rewrite(write(tmp_path / "m.safetensors"), change)
    code, out = generate(capsys, "--model", str(path), "--prompt", "to be")
    assert code == 2 and out.startswith("lah generate: ") and said in out, out
    assert len(out.strip().splitlines()) == 1  # a sentence, not a traceback


def test_unusable_files_and_prompts_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "m.safetensors")
    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(b"\x07" * 200)
    short = tmp_path / "short.safetensors"
    short.write_bytes(path.read_bytes()[:-100])
    cases = [
        (["--model", str(tmp_path / "none.safetensors"), "--prompt", "to"], "no such file"),
        (["--model", str(tmp_path), "--prompt", "to"], "no such file"),
        (["--model", str(garbage), "--prompt", "to"], "is not a safetensors file"),
        (["--model", str(short), "--prompt", "to"], "is not a safetensors file"),
        (["--model", str(path), "--prompt", "to be Horatio"], "prompt cannot be encoded: character 'H'"),
        (["--model", str(path), "--prompt", ""], "encodes to no tokens"),
    ]
    for args, said in cases:
        code, out = generate(capsys, *args)
        assert code == 2 and said in out, (args, out)
    for bad in (["--tokens", "0"], ["--temperature", "0"], ["--top-k", "-1"]):
        with pytest.raises(SystemExit) as stop:
            lah_main(["generate", "--model", str(path), "--prompt", "to", *bad])
        assert stop.value.code == 2


def test_a_file_without_its_tokenizer_takes_the_experiments_file_and_no_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "m.safetensors", tokenizer=False)
    code, out = generate(capsys, "--model", str(path), "--prompt", "to")
    assert code == 2 and "holds no tokenizer" in out and "--tokenizer FILE" in out
    right, wrong = tmp_path / "right.json", tmp_path / "wrong.json"
    save(TOK, right)
    save(CharTokenizer("abc"), wrong)
    code, out = generate(capsys, "--model", str(path), "--prompt", "to", "--tokenizer", str(right))
    assert code == 0 and out.startswith("to"), out
    code, out = generate(capsys, "--model", str(path), "--prompt", "to", "--tokenizer", str(wrong))
    assert code == 2 and "differs from the experiment's" in out
    with pytest.raises(TokenizerMismatch):
        read_model_file(path, CharTokenizer("abc"))
    with pytest.raises(ModelFileError):
        read_model_file(path)
    assert FORMAT == "lah-lm-export/1"
