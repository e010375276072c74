"""What ``lah`` refuses on its command line, with a sentence and exit status 2, before anything runs: a
coordinator URL without a scheme (it was accepted and failed later as "unreachable" or "no login")."""

from __future__ import annotations

import pytest

from lah.cli import coordinator_url, main


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["train", "--coordinator", "127.0.0.1:8470", "--experiment", "ffn"],
            "did you mean http://127.0.0.1:8470",
        ),
        (["node", "--coordinator", "localhost:8470"], "did you mean http://localhost:8470"),
        (["train", "login", "--coordinator", "ftp://example.org", "--name", "a"], "starts with http://"),
        (["app", "--coordinator", "http://"], "names no host"),
        (["update", "--coordinator", "http://example.org:port"], "is not a URL"),
    ],
)
def test_a_coordinator_url_without_a_scheme_or_host_is_refused(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "argument --coordinator" in err and words in err, err


def test_a_good_url_is_kept_as_given() -> None:
    assert coordinator_url(" https://project.example/ ") == "https://project.example"
    assert coordinator_url("http://[::1]:8470") == "http://[::1]:8470"


def test_bad_limit_flags_are_refused_before_the_node_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["node", "--cpu-max-percent", "0"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--cpu-max-percent 0: must be a whole number >= 1" in err, err
