"""scripts/mutation.py fails a run whose mutated functions have no selected test, or whose score is low.

A mutant whose function no selected test calls ends "not killed, exit code 33" (mutmut runs no test
for it), which once let 67 such mutants (the stream-abort functions among them) pass in a run that
exited 0. These tests feed the report a small synthetic mutmut result (the ``.meta`` files mutmut
writes), without running mutmut.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lah_mutation_script", REPO / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mutation = load_script()

FRAMING = "engine.p2p.framing"


def write_meta(scratch: Path, path: str, codes: dict[str, int | None]) -> None:
    meta = scratch / "mutants" / f"{path}.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}), "utf-8")


def diff(change: str) -> str:
    return f"--- a\n+++ b\n@@ -1 +1 @@\n-original line\n+{change}\n"


def killed(n: int, function: str = "x_message_size") -> dict[str, int | None]:
    return {f"{FRAMING}.{function}__mutmut_{i}": 1 for i in range(1, n + 1)}


def test_every_group_selects_tests_that_exist() -> None:
    """A group whose test path no longer exists (a test file moved or renamed) would have mutmut select
    nothing from it, and its functions would end as untested only after a run of minutes."""
    _, groups = mutation.load_config()
    missing = [
        (group, path)
        for group, spec in groups.items()
        for path in spec["tests"]
        if not (REPO / path).exists()
    ]
    assert missing == []


def test_function_names_are_unmangled() -> None:
    assert mutation.function_of(f"{FRAMING}.x_abort_frame__mutmut_3") == f"{FRAMING}.abort_frame"
    assert mutation.function_of(f"{FRAMING}.xǁDeframerǁabort__mutmut_12") == f"{FRAMING}.Deframer.abort"
    assert (
        mutation.function_of(f"{FRAMING}.xǁDeframerǁ__post_init____mutmut_2")
        == f"{FRAMING}.Deframer.__post_init__"
    )
    assert mutation.function_of("coordinator.ledger.x__precheck__mutmut_1") == "coordinator.ledger._precheck"


def test_untested_functions_are_named_with_their_mutant_counts() -> None:
    codes = {
        **killed(40),
        f"{FRAMING}.x_is_abort__mutmut_1": 33,
        f"{FRAMING}.x_is_abort__mutmut_2": 33,
        f"{FRAMING}.xǁDeframerǁabort__mutmut_1": 33,
        f"{FRAMING}.xǁDeframerǁfeed__mutmut_1": 0,  # a survivor was tested: not "untested"
    }
    untested = mutation.untested_functions({"engine/p2p/framing.py": codes})
    assert untested == {f"{FRAMING}.Deframer.abort": 1, f"{FRAMING}.is_abort": 2}


def test_a_module_with_an_untested_function_fails_even_with_a_high_score() -> None:
    codes = {**killed(99), f"{FRAMING}.x_is_abort__mutmut_1": 33}
    by_file = {"engine/p2p/framing.py": codes}
    row, left = mutation.summarise(
        "engine/p2p/framing.py", codes, {}, {f"{FRAMING}.x_is_abort__mutmut_1": diff("return True")}
    )
    assert row == {
        "mutants": 100,
        "killed": 99,
        "survived": 0,
        "no_tests": 1,
        "equivalent": 0,
        "score": 0.99,
    }
    assert left == [f"# {FRAMING}.x_is_abort__mutmut_1: not killed, exit code 33\n{diff('return True')}"]
    problems = mutation.verdict({"engine/p2p/framing.py": row}, mutation.untested_functions(by_file))
    assert len(problems) == 1
    assert f"{FRAMING}.is_abort (1 mutants)" in problems[0] and "pyproject.toml" in problems[0]


def test_a_score_under_the_minimum_fails_and_one_at_it_passes() -> None:
    def row(killed: int) -> dict[str, Any]:
        return {"mutants": 100, "killed": killed, "equivalent": 0, "score": killed / 100}

    assert mutation.MIN_SCORE == 0.95
    assert mutation.verdict({"engine/p2p/rpc.py": row(95)}, {}) == []
    problems = mutation.verdict({"engine/p2p/rpc.py": row(94), "engine/p2p/framing.py": row(100)}, {})
    assert problems == [
        "engine/p2p/rpc.py scores 0.9400 (94 of 100 mutants killed, 0 equivalent), under 0.95"
    ]


def test_equivalent_mutants_leave_the_score_but_a_stale_entry_counts_as_a_survivor() -> None:
    name_ok, name_stale = f"{FRAMING}.x_data_frames__mutmut_8", f"{FRAMING}.x_data_frames__mutmut_66"
    codes = {**killed(18), name_ok: 0, name_stale: 0}
    equivalent = {
        name_ok: {"name": name_ok, "change": "first = None", "reason": "falsy either way"},
        name_stale: {"name": name_stale, "change": "first = 0", "reason": "the code changed since"},
    }
    diffs = {name_ok: diff("first = None"), name_stale: diff("first = False")}
    row, left = mutation.summarise("engine/p2p/framing.py", codes, equivalent, diffs)
    assert (row["killed"], row["survived"], row["equivalent"], row["score"]) == (18, 1, 1, round(18 / 19, 4))
    assert len(left) == 1 and left[0].startswith(f"# {name_stale}: survived (equivalent.toml entry is stale")


def run_report_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, codes: dict[str, int | None]
) -> tuple[str, SystemExit | None]:
    """``scripts/mutation.py framing --report-only`` over a synthetic result in ``tmp_path``."""
    write_meta(tmp_path / "framing", "engine/p2p/framing.py", codes)
    monkeypatch.setattr(mutation, "BUILD", tmp_path)
    monkeypatch.setattr(mutation, "diffs_of", lambda _scratch, names: {n: diff("return None") for n in names})
    monkeypatch.setattr(sys, "argv", ["mutation.py", "framing", "--report-only"])
    try:
        mutation.main()
    except SystemExit as e:
        return (tmp_path / "survivors.txt").read_text("utf-8"), e
    return (tmp_path / "survivors.txt").read_text("utf-8"), None


def test_the_run_exits_non_zero_naming_each_untested_function(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    codes = {
        **killed(200),
        **{f"{FRAMING}.x_abort_frame__mutmut_{i}": 33 for i in range(1, 7)},
        **{f"{FRAMING}.xǁLinkMemoryǁtry_charge__mutmut_{i}": 33 for i in range(1, 15)},
    }
    survivors, exit_ = run_report_only(monkeypatch, tmp_path, codes)
    assert exit_ is not None
    message = str(exit_.code)  # a string code: Python prints it and exits with status 1
    assert message.startswith("mutation: FAILED")
    assert f"{FRAMING}.abort_frame (6 mutants)" in message
    assert f"{FRAMING}.LinkMemory.try_charge (14 mutants)" in message
    assert "engine/p2p/framing.py scores 0.9091" in message  # 200 of 220: both reasons are given
    assert survivors.count("exit code 33") == 20
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["engine/p2p/framing.py"]["no_tests"] == 20


def test_the_run_passes_when_every_function_is_tested_and_the_score_is_met(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    codes = {**killed(190), **{f"{FRAMING}.xǁDeframerǁfeed__mutmut_{i}": 0 for i in range(1, 11)}}
    survivors, exit_ = run_report_only(monkeypatch, tmp_path, codes)
    assert exit_ is None
    assert survivors.count("survived") == 10
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["engine/p2p/framing.py"]["score"] == 0.95
