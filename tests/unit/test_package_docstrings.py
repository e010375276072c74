"""Every package's ``__init__`` docstring stays true: the modules it names and the packages it may import.

A package is a directory with an ``__init__.py`` under ``engine/``, ``coordinator/``, ``app/`` or ``lah/``.
Its docstring is the map a newcomer reads first; this test reads it and the code with :mod:`ast` alone
(nothing here imports the packages, so it needs no torch, Qt or aiortc) and fails when the map is wrong.

The convention the docstrings follow:

- Every module (``foo.py`` is ``foo``) and subpackage directly in the package is named, in one of these
  forms: ``foo.py``; a literal ````foo```` (or ````foo/````); ``:mod:`.foo``` or ``:mod:`pkg.foo```; or an
  entry: the first word of an indented line or a list item (after the indentation, the ``-`` and any
  tree-drawing characters), bare or as a literal, optionally ending in ``.py`` or ``/``, followed by
  two spaces or a colon. A word that merely occurs in prose does not count, so a new module nobody
  mentions fails.
- Nothing stale: every entry is something in the package's directory, and every ``:mod:`` reference
  (relative ones resolved) is a module or package of the project.
- One line ``May import: engine.wire, engine.p2p.errors`` (continued on the next lines while it ends with
  a comma; ``May import: nothing`` for none) lists what the package's own modules may import of the
  project (top-level ``engine``, ``coordinator``, ``app``, ``lah``) beyond the package itself. An entry
  allows that module or package and everything under it (``engine.node`` allows
  ``engine.node.home``). Each subpackage's own line governs its own modules, so a parent's line grants
  nothing to its subpackages. Third-party imports are not listed. Every import counts, the same way:
  module level, inside functions, under ``TYPE_CHECKING``, relative ones (resolved), and
  ``importlib.import_module`` with a constant name. ``from a.b import c`` imports ``a.b.c`` where that
  is a module of the project, else ``a.b``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROJECT = ("engine", "coordinator", "app", "lah")

# Packages whose modules need not each be named, and why; their imports and stale names are still checked.
NAMING_EXEMPT = {
    "coordinator.db.migrations.versions": "Alembic's revision files: named by revision, found by directory, "
    "ordered by their own down_revision links; the list is `alembic history`.",
}

_IDENT = r"[a-z_][a-z0-9_]*"
_ENTRY = re.compile(
    rf"^(?=[ \t]|[-*] )[ \t\-*│├└┬─▼|]*(?:``)?(?P<name>{_IDENT})(?:\.py|/)?(?:``)?(?=[ \t]{{2,}}|:(?:\s|$))",
    re.MULTILINE,
)
_MOD_REF = re.compile(r":mod:`~?(?P<ref>\.*[A-Za-z_][\w.]*)`")
_MAY_IMPORT = "May import:"


@dataclass(frozen=True)
class Import:
    """One import of a project module, as written in one file (``line`` for the message)."""

    file: Path
    line: int
    target: str


def packages(root: Path, tops: tuple[str, ...] = PROJECT) -> list[Path]:
    """Every package directory under the project's top-level packages, parents first."""
    found: list[Path] = []
    for top in tops:
        if (root / top / "__init__.py").is_file():
            found.extend(sorted(init.parent for init in (root / top).rglob("__init__.py")))
    return found


def dotted(root: Path, package_dir: Path) -> str:
    return ".".join(package_dir.relative_to(root).parts)


def children(package_dir: Path) -> list[str]:
    """The modules (``foo.py``) and subpackages directly in a package: what its docstring must name."""
    names = [p.stem for p in package_dir.glob("*.py") if p.name != "__init__.py"]
    names += [p.name for p in package_dir.iterdir() if (p / "__init__.py").is_file()]
    return sorted(names)


def docstring(package_dir: Path) -> str:
    tree = ast.parse((package_dir / "__init__.py").read_text(encoding="utf-8"))
    return ast.get_docstring(tree, clean=True) or ""


def module_exists(root: Path, name: str) -> bool:
    """Whether a dotted name is a module or package of the tree (compiled ones by their stub or source)."""
    path = root.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return True
    return any(path.with_name(path.name + suffix).is_file() for suffix in (".py", ".pyi", ".c"))


def resolve_ref(package: str, ref: str) -> str:
    """A ``:mod:`` reference as an absolute name: ``.foo`` in ``a.b`` is ``a.b.foo``, ``..foo`` ``a.foo``."""
    level = len(ref) - len(ref.lstrip("."))
    if not level:
        return ref
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    rest = ref[level:]
    return ".".join([*base, rest] if rest else base)


def is_named(doc: str, package: str, name: str) -> bool:
    """Whether the docstring names the module or subpackage ``name`` in one of the accepted forms."""
    if re.search(rf"(?<![\w/.]){re.escape(name)}\.py\b", doc):
        return True
    if re.search(rf"``{re.escape(name)}/?``", doc):
        return True
    if any(m["name"] == name for m in _ENTRY.finditer(doc)):
        return True
    child = f"{package}.{name}"
    return any(
        resolve_ref(package, m["ref"]) == child or resolve_ref(package, m["ref"]).startswith(child + ".")
        for m in _MOD_REF.finditer(doc)
    )


def allowed_imports(doc: str) -> list[str] | None:
    """The entries of the docstring's ``May import:`` line (and its continuations); None if it has none."""
    lines = doc.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith(_MAY_IMPORT)]
    if len(starts) != 1:
        return None
    i = starts[0]
    text = lines[i].strip()[len(_MAY_IMPORT) :]
    while text.rstrip().endswith(",") and i + 1 < len(lines):
        i += 1
        text += " " + lines[i].strip()
    entries = [e.strip() for e in text.split(",") if e.strip()]
    return [] if entries == ["nothing"] else entries


def project_imports(root: Path, file: Path, tops: tuple[str, ...] = PROJECT) -> list[Import]:
    """Every import of a project module in one file, anywhere in it, relative ones made absolute."""
    tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    package = dotted(root, file.parent)
    found: list[Import] = []

    def add(node: ast.AST, target: str) -> None:
        if target.split(".")[0] in tops:
            found.append(Import(file, getattr(node, "lineno", 0), target))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_ref(package, "." * node.level + (node.module or "")) if node.level else node.module
            if base is None:
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                add(node, candidate if module_exists(root, candidate) else base)
        elif isinstance(node, ast.Call) and _is_import_module(node.func):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                add(node, resolve_ref(package, first.value))
    return found


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "import_module") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )


def _allows(entry: str, target: str) -> bool:
    return target == entry or target.startswith(entry + ".")


def check_package(root: Path, package_dir: Path, tops: tuple[str, ...] = PROJECT) -> list[str]:
    """What is untrue in one package's docstring, each as a plain sentence (empty when all holds)."""
    package = dotted(root, package_dir)
    init = package_dir.relative_to(root) / "__init__.py"
    doc = docstring(package_dir)
    problems: list[str] = []
    if not doc:
        return [f"{init} has no docstring: it must name its modules and say what it may import."]

    if package not in NAMING_EXEMPT:
        for name in children(package_dir):
            kind = "subpackage" if (package_dir / name).is_dir() else "module"
            if not is_named(doc, package, name):
                problems.append(f"{init}'s docstring does not name its {kind} {name!r}.")

    present = {p.name for p in package_dir.iterdir()} | {p.name.split(".")[0] for p in package_dir.iterdir()}
    for name in sorted({m["name"] for m in _ENTRY.finditer(doc)} - present):
        problems.append(
            f"{init}'s docstring lists {name!r}, which is not in {package_dir.relative_to(root)}/."
        )
    for ref in sorted({m["ref"] for m in _MOD_REF.finditer(doc)}):
        absolute = resolve_ref(package, ref)
        if absolute.split(".")[0] in tops and not module_exists(root, absolute):
            problems.append(f"{init}'s docstring refers to :mod:`{ref}`, which does not exist.")

    allowed = allowed_imports(doc)
    if allowed is None:
        problems.append(f"{init}'s docstring needs exactly one line starting {_MAY_IMPORT!r}.")
        return problems
    for entry in allowed:
        if entry.split(".")[0] not in tops or not module_exists(root, entry):
            problems.append(f"{init}'s {_MAY_IMPORT!r} line names {entry!r}, which is no project module.")
    for file in sorted(package_dir.glob("*.py")):
        for imp in project_imports(root, file, tops):
            if _allows(package, imp.target) or any(_allows(entry, imp.target) for entry in allowed):
                continue
            problems.append(
                f"{imp.file.relative_to(root)} line {imp.line} imports {imp.target}, "
                f"which {init}'s {_MAY_IMPORT!r} line does not allow."
            )
    return problems


# The project's own packages.

REAL_PACKAGES = packages(REPO)


def test_the_project_has_the_packages_this_test_reads() -> None:
    names = {dotted(REPO, p) for p in REAL_PACKAGES}
    assert {"engine", "engine.moe", "engine.p2p.patches", "coordinator.site", "app", "lah"} <= names
    assert len(names) >= 20


@pytest.mark.parametrize("package_dir", REAL_PACKAGES, ids=lambda p: dotted(REPO, p))
def test_package_docstring_is_true(package_dir: Path) -> None:
    problems = check_package(REPO, package_dir)
    assert not problems, "\n".join(problems)


# The checker itself, on small trees that are wrong in one way each.


def write_package(root: Path, name: str, doc: str, modules: dict[str, str]) -> Path:
    package_dir = root.joinpath(*name.split("."))
    package_dir.mkdir(parents=True, exist_ok=True)
    (package_dir / "__init__.py").write_text(f'"""{doc}"""\n', encoding="utf-8")
    for module, source in modules.items():
        (package_dir / f"{module}.py").write_text(source, encoding="utf-8")
    return package_dir


WIRE_INIT = Path("engine/wire/__init__.py")

GOOD_ENGINE = """The engine.

Layers::

    files      atomic writes
    wire/      bytes on the wire

May import: nothing
"""

GOOD_WIRE = """Bytes on the wire: ``limits`` (caps), ``codec.py`` (tensors).

May import: engine.files
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_package(tmp_path, "engine", GOOD_ENGINE, {"files": "import os\n"})
    write_package(
        tmp_path,
        "engine.wire",
        GOOD_WIRE,
        {"limits": "from engine.files import write\n", "codec": "from . import limits\nimport torch\n"},
    )
    write_package(tmp_path, "coordinator", "The coordinator.\n\nMay import: engine.wire\n", {})
    return tmp_path


def all_problems(root: Path) -> list[str]:
    return [problem for package_dir in packages(root) for problem in check_package(root, package_dir)]


def test_a_true_tree_passes(tree: Path) -> None:
    assert all_problems(tree) == []


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ("``codec``, then more", True),
        ("see codec.py", True),
        ("see :mod:`.codec`", True),
        ("see :mod:`~engine.wire.codec.Codec`", True),
        ("    codec      tensors", True),
        ("- ``codec``: tensors", True),
        ("    experts\n      │   codec: tensors", True),
        ("    codec.py   tensors", True),
        ("a codec in prose", False),
        ("codec: a prose line at the margin", False),
        ("benchmarks/codec.py", False),
        (":mod:`engine.wire.codecs`", False),
        ("``codecs``", False),
        ("    codec tensors", False),
    ],
)
def test_what_counts_as_naming_a_module(doc: str, named: bool) -> None:
    assert is_named(doc, "engine.wire", "codec") is named


def test_a_module_the_docstring_does_not_name_fails(tree: Path) -> None:
    (tree / "engine" / "wire" / "messages.py").write_text("", encoding="utf-8")
    # A word in prose is not a name: "messages" here is not an entry, a literal or a file name.
    (tree / "engine" / "wire" / "__init__.py").write_text(
        f'"""{GOOD_WIRE}\nIt frames messages.\n"""\n', encoding="utf-8"
    )
    assert all_problems(tree) == [f"{WIRE_INIT}'s docstring does not name its module 'messages'."]


def test_a_subpackage_the_docstring_does_not_name_fails(tree: Path) -> None:
    write_package(tree, "engine.p2p", "Peers.\n\nMay import: nothing\n", {})
    assert all_problems(tree) == [
        f"{Path('engine/__init__.py')}'s docstring does not name its subpackage 'p2p'."
    ]


def test_a_stale_name_fails(tree: Path) -> None:
    (tree / "engine" / "files.py").unlink()
    (tree / "engine" / "wire" / "__init__.py").write_text(
        f'"""{GOOD_WIRE}\nSee :mod:`.tensors` and :mod:`engine.dht`.\n"""\n', encoding="utf-8"
    )
    assert all_problems(tree) == [
        f"{Path('engine/__init__.py')}'s docstring lists 'files', which is not in engine/.",
        f"{WIRE_INIT}'s docstring refers to :mod:`.tensors`, which does not exist.",
        f"{WIRE_INIT}'s docstring refers to :mod:`engine.dht`, which does not exist.",
        f"{WIRE_INIT}'s 'May import:' line names 'engine.files', which is no project module.",
    ]


def test_a_disallowed_import_fails_wherever_it_is_written(tree: Path) -> None:
    (tree / "engine" / "wire" / "codec.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from coordinator import app\n"
        "def f():\n"
        "    import lah.cli\n"
        "    from ..files import write\n"
        "    return importlib.import_module('app.main')\n",
        encoding="utf-8",
    )
    codec = Path("engine/wire/codec.py")
    assert all_problems(tree) == [
        f"{codec} line 3 imports coordinator, which {WIRE_INIT}'s 'May import:' line does not allow.",
        f"{codec} line 5 imports lah.cli, which {WIRE_INIT}'s 'May import:' line does not allow.",
        f"{codec} line 7 imports app.main, which {WIRE_INIT}'s 'May import:' line does not allow.",
    ]


def test_a_relative_import_is_resolved_before_it_is_judged(tree: Path) -> None:
    write_package(tree, "engine.dht", "Kademlia.\n\nMay import: nothing\n", {})
    (tree / "engine" / "__init__.py").write_text(
        f'"""{GOOD_ENGINE}\n``dht``: records."""\n', encoding="utf-8"
    )
    (tree / "engine" / "wire" / "codec.py").write_text("from ..dht import node\n", encoding="utf-8")
    assert all_problems(tree) == [
        f"{Path('engine/wire/codec.py')} line 1 imports engine.dht, "
        f"which {WIRE_INIT}'s 'May import:' line does not allow."
    ]


def test_an_entry_allows_what_is_under_it_and_nothing_beside_it(tree: Path) -> None:
    write_package(tree, "engine.node", "Node: ``tokens``.\n\nMay import: nothing\n", {"tokens": ""})
    write_package(tree, "engine.nodes", "Nodes.\n\nMay import: nothing\n", {})
    (tree / "engine" / "__init__.py").write_text(
        f'"""{GOOD_ENGINE}\n``node``, ``nodes``: volunteers."""\n', encoding="utf-8"
    )
    (tree / "coordinator" / "ok.py").write_text(
        "import engine.node.tokens\nfrom engine.wire import limits\nfrom engine import nodes\n",
        encoding="utf-8",
    )
    (tree / "coordinator" / "__init__.py").write_text(
        '"""The coordinator: ``ok``.\n\nMay import: engine.wire,\n    engine.node\n"""\n', encoding="utf-8"
    )
    assert all_problems(tree) == [
        f"{Path('coordinator/ok.py')} line 3 imports engine.nodes, "
        f"which {Path('coordinator/__init__.py')}'s 'May import:' line does not allow."
    ]


def test_a_parents_line_grants_nothing_to_its_subpackage(tree: Path) -> None:
    # engine.files is inside engine, but engine.wire's modules answer to engine.wire's line alone.
    (tree / "engine" / "wire" / "__init__.py").write_text(
        '"""``limits``, ``codec``.\n\nMay import: nothing\n"""'
    )
    assert all_problems(tree) == [
        f"{Path('engine/wire/limits.py')} line 1 imports engine.files, "
        f"which {WIRE_INIT}'s 'May import:' line does not allow."
    ]


def test_a_docstring_without_its_import_line_fails(tree: Path) -> None:
    (tree / "coordinator" / "__init__.py").write_text('"""The coordinator."""\n', encoding="utf-8")
    assert all_problems(tree) == [
        f"{Path('coordinator/__init__.py')}'s docstring needs exactly one line starting 'May import:'."
    ]
