"""The package's layout: layers import one way (algorithms ← models ← rollout ← trainer ← cli), no
module imports another that imports it back (type-only imports included), and the repository cites
only its own documents."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "ppo_lm"

# A layer may import from the layers before it, never from those after it.
LAYERS = ["algorithms", "models", "rollout", "trainer"]


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = p
    return out


def _imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                name = f"{target}.{alias.name}"
                found.add(name if name in mods else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {t for t in found if t in mods and t != mod and not (is_pkg and t.startswith(mod + "."))}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def test_no_import_cycles():
    graph = _graph()
    cycles = []

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    for m in graph:
        if m in reach(m):
            cycles.append(m)
    assert not cycles, f"modules on an import cycle: {sorted(cycles)}"


def test_layers_import_one_way():
    wrong = []
    for mod, targets in _graph().items():
        layer = mod.split(".")[1] if mod.count(".") else ""
        if layer not in LAYERS:
            continue
        later = LAYERS[LAYERS.index(layer) + 1 :] + ["cli", "commands", "demo", "bench"]
        wrong += [f"{mod} -> {t}" for t in targets if t.count(".") and t.split(".")[1] in later]
    assert not wrong, wrong


def test_the_trainer_core_does_not_know_lanes_exist():
    """CPU lanes sit behind Lanes.map_rows/backward_rows; only the code that builds them names them."""
    allowed = {"ppo_lm.lanes", "ppo_lm.trainer.learner", "ppo_lm.trainer.update", "ppo_lm.rollout.collect"}
    users = {m for m, t in _graph().items() if "ppo_lm.lanes" in t}
    assert users <= allowed, users - allowed
    update = (PKG / "trainer" / "update.py").read_text()
    assert "autograd.grad" not in update and "no_sync()" not in update and "DistributedDataParallel" not in update


def test_the_repository_cites_only_its_own_documents():
    files = [*PKG.rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    cited = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bSPEC\b", line)]
    assert not cited, cited
    for p in files:
        for ref in re.findall(r"docs/([\w-]+\.md)", p.read_text()):
            assert (ROOT / "docs" / ref).is_file(), f"{p.relative_to(ROOT)} cites docs/{ref}, which does not exist"


def test_every_case_of_docs_errors_names_a_test_that_exists():
    """docs/errors.md backs each case with a test, named tests/FILE::TEST; each must be defined."""
    text = (ROOT / "docs" / "errors.md").read_text()
    refs = re.findall(r"`tests/([\w/]+\.py)::(\w+)`", text)
    assert len(refs) >= 40, len(refs)
    missing = [f"{f}::{name}" for f, name in refs
               if not (ROOT / "tests" / f).is_file() or f"def {name}(" not in (ROOT / "tests" / f).read_text()]
    assert not missing, f"docs/errors.md names tests that do not exist: {missing}"
