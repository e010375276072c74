"""`make mutation`: mutmut over the node's guards, each group of modules against only its own unit tests.

The groups live in pyproject.toml (``[tool.lah-mutation.<group>]``: files to mutate, the tests that own
them, optionally the functions to mutate); the settings every run shares are ``[tool.mutmut]``. Each group
runs in a fresh copy of the tree under ``build/mutation/<group>`` whose pyproject.toml adds the group's
``only_mutate`` and test selection to ``[tool.mutmut]``, so mutmut's stats run, its cache and its
``mutants/`` folder never mix two groups. Mutants listed in ``tests/mutation/equivalent.toml`` (name, the
changed line and why no test can tell it apart) are subtracted; an entry whose changed line no longer
matches is stale and ignored. The per-module JSON is printed last.

The run fails (exit status 1, after the report) when a module scores under ``MIN_SCORE`` or when a
mutated function has no test the group selects: mutmut then records exit code 33 for each of its mutants
without running anything, which would otherwise pass for a survivor and hide that the group's tests
never call the function at all (the fix is a test, or the test file that has one, in the group).

    .venv/bin/python scripts/mutation.py [group ...] [--max-children N] [--report-only]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

import tomli_w

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "mutation"
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.toml"
COPIED = ("engine", "coordinator", "tests")
MUTMUT = Path(sys.executable).parent / "mutmut"
# mutmut's exit codes: a failing test, a test run killed for running too long, a crash all catch a mutant.
KILLED = {1, 3, 36, -24, 24, 152, 255, -11, -9, 37}
SURVIVED = {0}
# mutmut's stats run saw no selected test call the mutated function, so it ran none (mutmut/__main__.py).
NO_TESTS = 33
MIN_SCORE = 0.95


def load_config() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return data, data["tool"]["lah-mutation"]


def mutant_globs(module_files: list[str], functions: list[str]) -> list[str]:
    """mutmut's names: ``pkg.mod.x_func__mutmut_3`` and ``pkg.mod.xǁClassǁmethod__mutmut_3``."""
    globs = []
    for path in module_files:
        module = path.removesuffix(".py").replace("/", ".")
        for f in functions:
            cls, _, meth = f.rpartition(".")
            name = f"xǁ{cls}ǁ{meth}" if cls else f"x_{f}"
            globs.append(f"{module}.{name}__mutmut_*")
    return globs


def prepare(group: str, spec: dict[str, Any], project: dict[str, Any]) -> Path:
    scratch = BUILD / group
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis")
    for name in COPIED:
        shutil.copytree(ROOT / name, scratch / name, ignore=ignore)
    settings = dict(project["tool"]["mutmut"])
    settings["only_mutate"] = list(spec["mutate"])
    settings["pytest_add_cli_args_test_selection"] = list(spec["tests"])
    doc = {key: value for key, value in project.items() if key != "tool"}
    doc["tool"] = {"pytest": project["tool"]["pytest"], "mutmut": settings}
    (scratch / "pyproject.toml").write_text(tomli_w.dumps(doc), "utf-8")
    return scratch


def run_group(scratch: Path, globs: list[str], max_children: int) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LAH_FUZZ_FRAMES": "10000",  # tests/unit/wire/test_wire_fuzz.py, once per mutant
        "LAH_MUTATION_EXAMPLES": "50",  # property tests' examples (tests/mutation/fast_first.py)
    }
    cmd = [str(MUTMUT), "run", "--max-children", str(max_children), *globs]
    with open(scratch / "mutmut.log", "w") as log:
        proc = subprocess.run(cmd, cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = (scratch / "mutmut.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"mutmut failed in {scratch} (exit {proc.returncode}):\n{tail}")


def results(scratch: Path, spec: dict[str, Any]) -> dict[str, dict[str, int | None]]:
    """Exit code per mutant, by module file, for the group's files (and functions, if it names some)."""
    globs = mutant_globs(spec["mutate"], spec["functions"]) if spec.get("functions") else ["*"]
    out: dict[str, dict[str, int | None]] = {}
    for path in spec["mutate"]:
        meta = json.loads((scratch / "mutants" / f"{path}.meta").read_text("utf-8"))
        codes: dict[str, int | None] = meta["exit_code_by_key"]
        out[path] = {k: v for k, v in codes.items() if any(fnmatch.fnmatchcase(k, g) for g in globs)}
    return out


_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
print(json.dumps({name: get_diff_for_mutant(name) for name in json.load(sys.stdin)}))
"""


def diffs_of(scratch: Path, names: list[str]) -> dict[str, str]:
    """mutmut's diff of each mutant, from one process (``mutmut show`` costs a start-up per mutant)."""
    if not names:
        return {}
    proc = subprocess.run(
        [sys.executable, "-c", _DIFFS], cwd=scratch, input=json.dumps(names), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"could not read the mutants' diffs:\n{proc.stderr[-2000:]}")
    diffs: dict[str, str] = json.loads(proc.stdout.splitlines()[-1])
    return diffs


def changed_lines(diff: str) -> list[str]:
    return [line[1:].strip() for line in diff.splitlines() if re.match(r"^\+(?!\+\+)", line)]


def check_equivalents(
    path: str, codes: dict[str, int | None], equivalent: dict[str, dict[str, str]]
) -> list[str]:
    """Entries for this module that no longer name a mutant, or name one that a test now kills."""
    module = path.removesuffix(".py").replace("/", ".") + "."
    out = []
    for name in equivalent:
        if not name.startswith(module):
            continue
        if name not in codes:
            out.append(f"equivalent.toml: {name} is not a mutant of {path} any more")
        elif codes[name] in KILLED:
            out.append(f"equivalent.toml: {name} is listed as equivalent but a test kills it")
    return out


def function_of(mutant: str) -> str:
    """The function a mutant changes, as the code names it: ``engine.p2p.framing.Deframer.abort``."""
    module, _, mangled = mutant.rpartition("__mutmut_")[0].rpartition(".")
    if mangled.startswith("xǁ"):
        return f"{module}." + ".".join(mangled[2:].split("ǁ"))
    return f"{module}.{mangled.removeprefix('x_')}"


def summarise(
    path: str, codes: dict[str, int | None], equivalent: dict[str, dict[str, str]], diffs: dict[str, str]
) -> tuple[dict[str, float | int], list[str]]:
    """One module's row of the report, and each mutant left alive with its diff."""
    killed = equiv = survived = no_tests = 0
    left = []
    for name, code in sorted(codes.items()):
        if code in KILLED:
            killed += 1
            continue
        entry = equivalent.get(name)
        if entry is not None and entry["change"].strip() in changed_lines(diffs[name]):
            equiv += 1
            continue
        if code == NO_TESTS:
            no_tests += 1
        else:
            survived += 1
        stale = " (equivalent.toml entry is stale: the change differs)" if entry else ""
        status = "survived" if code in SURVIVED else f"not killed, exit code {code}"
        left.append(f"# {name}: {status}{stale}\n{diffs[name]}")
    n = len(codes)
    score = killed / (n - equiv) if n > equiv else 1.0
    row: dict[str, float | int] = {
        "mutants": n,
        "killed": killed,
        "survived": survived,
        "no_tests": no_tests,
        "equivalent": equiv,
        "score": round(score, 4),
    }
    return row, left


def untested_functions(by_file: dict[str, dict[str, int | None]]) -> dict[str, int]:
    """Functions no selected test calls, with how many of their mutants went untested for it."""
    out: dict[str, int] = defaultdict(int)
    for codes in by_file.values():
        for name, code in codes.items():
            if code == NO_TESTS:
                out[function_of(name)] += 1
    return dict(sorted(out.items()))


def verdict(
    report: dict[str, dict[str, float | int]], untested: dict[str, int], min_score: float = MIN_SCORE
) -> list[str]:
    """What makes the run fail; empty when every module is tested and scores at least ``min_score``."""
    problems = []
    if untested:
        names = ", ".join(f"{name} ({n} mutants)" for name, n in untested.items())
        problems.append(
            f"no test that its group selects calls {names}: add a test that does, or add the test file "
            "that has one to the group's tests in pyproject.toml [tool.lah-mutation]"
        )
    for path, row in sorted(report.items()):
        if row["score"] < min_score:
            problems.append(
                f"{path} scores {row['score']:.4f} ({row['killed']} of {row['mutants']} mutants killed, "
                f"{row['equivalent']} equivalent), under {min_score}"
            )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", help="groups of [tool.lah-mutation] (default: all)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="report the last run's results again (after editing equivalent.toml)",
    )
    args = parser.parse_args()
    project, groups = load_config()
    chosen = args.groups or list(groups)
    unknown = sorted(set(chosen) - set(groups))
    if unknown:
        raise SystemExit(f"unknown groups {unknown}; known: {sorted(groups)}")
    equivalent = {e["name"]: e for e in tomllib.loads(EQUIVALENT.read_text("utf-8"))["mutant"]}
    report: dict[str, dict[str, float | int]] = {}
    untested: dict[str, int] = {}
    survivors: list[str] = []
    started = time.monotonic()
    for group in chosen:
        spec = groups[group]
        t0 = time.monotonic()
        scratch = BUILD / group
        if not args.report_only:
            scratch = prepare(group, spec, project)
            globs = mutant_globs(spec["mutate"], spec["functions"]) if spec.get("functions") else []
            run_group(scratch, globs, args.max_children)
        by_file = results(scratch, spec)
        left = sorted(k for codes in by_file.values() for k, v in codes.items() if v not in KILLED)
        diffs = diffs_of(scratch, left)
        count = 0
        for path, codes in by_file.items():
            report[path], texts = summarise(path, codes, equivalent, diffs)
            survivors += texts
            count += len(texts)
            for warning in check_equivalents(path, codes, equivalent):
                print(warning, file=sys.stderr)
        untested.update(untested_functions(by_file))
        print(f"{group}: {time.monotonic() - t0:.0f} s, {count} left", file=sys.stderr)
    (BUILD / "survivors.txt").write_text("\n".join(survivors), "utf-8")
    for text in survivors:
        print(text)
    print(f"mutation: {time.monotonic() - started:.0f} s; survivors in {BUILD / 'survivors.txt'}")
    print(json.dumps(report))
    problems = verdict(report, untested)
    if problems:
        raise SystemExit("mutation: FAILED\n" + "\n".join(f"- {p}" for p in problems))


if __name__ == "__main__":
    main()
