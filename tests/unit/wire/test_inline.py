"""engine/wire/inline.py: casts and copies equal torch's own, and start no OpenMP team.

The team check runs in a fresh process (this one may have teams already): torch with two intra-op
threads, the codec's calls made on a second thread, and the process's thread count read before and
after. The same probe with a plain ``.to`` on that thread shows it does add threads, so the check can
fail.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.wire import inline

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


SHAPES = [(), (0,), (5, 0, 3), (7,), (inline.GRAIN + 3,), (3, inline.GRAIN + 1), (300, 1000), (2, 3, 40_000)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_cast_equals_torch(shape: tuple[int, ...], src: torch.dtype, dst: torch.dtype) -> None:
    t = (torch.randn(shape, dtype=torch.float64) * 100).to(src)
    got = inline.cast(t, dst)
    want = t.to(dst)
    assert got.dtype == dst and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want)
    if src == dst:
        assert got is t  # as .to returns the tensor itself


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 70), min_size=1, max_size=4), st.integers(0, 3))
def test_contiguous_equals_torch_for_any_view(dims: list[int], which: int) -> None:
    t = torch.arange(int(torch.tensor(dims).prod()) if dims else 1, dtype=torch.float32).reshape(dims)
    views = [t, t.flip(0), t.transpose(0, -1), t[::2]]
    v = views[which]
    got = inline.contiguous(v)
    assert got.is_contiguous() and torch.equal(got, v.contiguous())


def test_contiguous_of_a_big_transposed_tensor() -> None:
    t = torch.randn(700, 900).t()
    got = inline.contiguous(t)
    assert got.is_contiguous() and torch.equal(got, t.contiguous())
    assert inline.contiguous(got) is got


PROBE = textwrap.dedent(
    """
    import sys, threading
    import psutil, torch
    from engine.wire import Compression, decode_tensor, encode_tensor, inline
    torch.set_num_threads(2)
    x = torch.randn(512, 1024)

    def threads():
        return psutil.Process().num_threads()

    def codec():
        inline.cast(x, torch.float16)
        inline.contiguous(x.t())
        for c in (Compression.FLOAT16, Compression.INT8):
            meta, payload = encode_tensor(x, c)
            decode_tensor(meta, memoryview(bytearray(payload)))

    def plain():
        x.to(torch.float16)

    work = {"codec": codec, "plain": plain}[sys.argv[1]]
    done, release = threading.Event(), threading.Event()

    def worker():
        work()
        done.set()
        release.wait()  # alive while counted: a team's threads leave with the thread that made it

    before = threads()
    t = threading.Thread(target=worker)
    t.start()
    done.wait()
    print(threads() - before - 1)
    release.set()
    t.join()
    """
)


def test_the_codec_starts_no_openmp_team_on_its_thread() -> None:
    def added(work: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, work], capture_output=True, text=True, timeout=120, check=True
        )
        return int(out.stdout.strip())

    assert added("plain") > 0  # the probe sees a team when one is started
    assert added("codec") == 0
