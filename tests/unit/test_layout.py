"""The package layout: which sub-package may import which (the README's map states the same
rules), every sub-package says what it owns, the evaluator registry's named entries point
where the rules allow, and each test file sits in its tier's folder."""

import ast
from pathlib import Path

import pytest
from helpers import LATE_IMPORTS, REPO

PACKAGE = REPO / "bert_jax"

# Each part of the package and the parts it may import (directly or inside functions). A part
# is a sub-package or a top-level module. Lower layers first: models and data know nothing of
# training; training knows nothing of translation, interop, cloud, viz or tools; the command line
# (commands) sits above all of them; tools are imported by nothing in the library.
BASE = {"trees", "paths", "log", "specs", "chips"}
ALLOWED = {
    "trees": set(),
    "paths": set(),
    "log": set(),
    "specs": set(),
    "chips": set(),
    "models": {"trees", "chips"},  # chips: leaf facts (splash's tiles per TPU generation)
    "data": {"paths", "trees", "specs"},
    "config": {"models", "paths", "specs"},
    "tasks": BASE | {"config", "models", "data"},
    "training": BASE | {"config", "models", "data", "tasks"},
    "translation": BASE | {"config", "models", "data", "training"},
    "interop": BASE | {"config", "models", "data", "tasks", "training"},
    "cloud": BASE | {"config", "models", "data", "tasks", "training"},
    "viz": BASE | {"config", "models", "data", "tasks", "training", "translation"},
    "tools": BASE | {"config", "models", "data", "tasks", "training", "translation", "interop",
                     "cloud", "viz", "commands"},
    "commands": BASE | {"config", "models", "data", "tasks", "training", "translation", "interop",
                        "cloud", "viz"},
    # The entry points of earlier installs and sweep files: bert_jax.main:run, bert_jax.sweep.
    "main": {"commands"},
    "sweep": {"commands"},
    "__main__": {"commands"},
    "__init__": set(),
}

# Imports against the directions, each inside the one function that needs it (so importing the
# file never imports the part above), and why: helpers.LATE_IMPORTS, (file, module) -> reason.


def _part(module: str) -> str:
    """bert_jax.training.train -> training; bert_jax.config -> config; bert_jax -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imported_by(node: ast.AST) -> set[str]:
    """The modules one import statement imports (`from bert_jax import config`: bert_jax.config)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if isinstance(node, ast.ImportFrom) and node.module == "bert_jax":
        return {f"bert_jax.{a.name}" for a in node.names}
    return {node.module or ""} if isinstance(node, ast.ImportFrom) else set()


def _imported(path: Path) -> set[str]:
    """The bert_jax modules `path` imports anywhere in its body (functions included)."""
    return {m for node in ast.walk(ast.parse(path.read_text())) for m in _imported_by(node)
            if m.startswith("bert_jax")}


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def arrows() -> dict[tuple[str, str], list[str]]:
    """(from part, to part) -> the files that import across that arrow."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        src = _part(_module(path)) if path.parent != PACKAGE else path.stem
        for target in _imported(path):
            dst = _part(target)
            if (str(path.relative_to(REPO)), target) in LATE_IMPORTS:
                continue
            if dst != src:
                found.setdefault((src, dst), []).append(str(path.relative_to(REPO)))
    return found


def test_every_part_is_in_the_rules():
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir()
                                                       if (p / "__init__.py").is_file()}
    assert parts == set(ALLOWED), "add the new part to ALLOWED (and to the README's map)"


def test_imports_follow_the_allowed_directions():
    found = arrows()
    assert ("training", "models") in found and ("commands", "training") in found  # the walk sees arrows
    bad = {f"{a} -> {b}": files for (a, b), files in found.items() if b not in ALLOWED[a]}
    assert not bad, f"imports against the layout rules: {bad}"


def test_late_imports_are_inside_functions():
    """Each listed import upwards is made when its function runs, never on importing the file."""
    for file, module in LATE_IMPORTS:
        tree = ast.parse((REPO / file).read_text())
        inner = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                 for n in ast.walk(f) if isinstance(n, ast.ImportFrom | ast.Import)
                 and module in _imported_by(n)}
        top = [n for n in tree.body if module in _imported_by(n)]
        assert inner and not top, f"{file}: import {module} inside the function that needs it"


def test_the_rules_would_catch_a_wrong_arrow(tmp_path, monkeypatch):
    """A models module importing training is reported (the check is not vacuous)."""
    fake = tmp_path / "bert_jax"
    (fake / "models").mkdir(parents=True)
    (fake / "models" / "__init__.py").write_text("from bert_jax.training import train\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    assert arrows() == {("models", "training"): ["bert_jax/models/__init__.py"]}


@pytest.mark.parametrize("package", sorted(p.name for p in PACKAGE.iterdir()
                                            if (p / "__init__.py").is_file()))
def test_each_sub_package_says_what_it_owns_and_may_import(package):
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
    assert doc and len(doc.split()) >= 25, f"bert_jax/{package}/__init__.py needs its paragraph"
    assert "import" in doc, f"bert_jax/{package}'s docstring should say what it may import"


def test_named_evaluators_live_where_training_may_not_import():
    """Registry entries given by name ("module:Class") load, and name a part above training."""
    from bert_jax.training import evaluate

    for kind, entry in evaluate.EVALUATORS.items():
        cls = evaluate.evaluator_class(kind)
        assert callable(cls.run) and callable(cls.prepare)
        if isinstance(entry, str):
            assert _part(entry.partition(":")[0]) not in ALLOWED["training"] | {"training"}


def test_the_readme_map_states_the_layout_rules():
    """The README's Map table says what ALLOWED says."""
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| part | what it owns"):].split("\n\n")[0].splitlines()[2:]
    stated = {}
    for row in table:
        part, _, may = [c.strip() for c in row.strip("|").split(" | ")]
        names = {n.strip("`").removesuffix("/").removesuffix(".py") for n in part.split(", ")}
        imports = set() if may == "nothing" else {m.strip() for m in may.split(",")}
        stated.update({name: imports for name in names})
    assert stated == ALLOWED


def test_each_test_file_is_in_its_tier_folder():
    """tests/unit/ or tests/unit/<a sub-package>/, tests/integration/, tests/e2e/ (docs/testing.md):
    a test file elsewhere would be in no tier's command; names are unique (pytest imports a test
    file by its name)."""
    tests = REPO / "tests"
    files = sorted(tests.rglob("test_*.py"))
    folders = {"unit", "integration", "e2e"} | {f"unit/{p.name}" for p in PACKAGE.iterdir()
                                                if (p / "__init__.py").is_file()}
    outside = sorted({f.parent.relative_to(tests).as_posix() for f in files} - folders)
    assert len(files) > 40 and not outside, f"test files outside the tier folders: {outside}"
    names = [f.name for f in files]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
