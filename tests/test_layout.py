"""The package's layout (docs/architecture.md): every package and top-level module sits in a layer,
layers import one way (a module imports only from lower layers and from its own package), and no module
imports another that imports it back — type-only and function-level imports included, and through a
package's ``__init__``, which Python runs before any of its modules. The repository cites only its own
documents."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "ppo_lm"

LAYERS: list[set[str]] = [
    {"ppo_lm", "runtime", "algorithms", "tasks", "presets"},  # the root's face holds only the version
    {"models", "data", "config"},
    {"rollout", "records"},
    {"stages", "trainer"},
    {"reporting"},
    {"cli"},
    {"__main__"},  # python -m ppo_lm
]
"""Bottom to top. A module may import from lower layers and from its own package; two packages of
one layer import nothing of each other. ``ppo_lm`` is the root package's ``__init__``."""


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    out = {}
    for p in pkg.rglob("*.py"):
        rel = p.relative_to(pkg.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = p
    return out


def _ancestors(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """What importing ``mod`` runs: every module it names (at any depth of its code), and each one's
    packages, whose ``__init__`` runs first — except ``mod``'s own, already running when it loads."""
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
    own = set(_ancestors(mod)) | ({mod} if is_pkg else set())
    found |= {a for t in list(found) for a in _ancestors(t)}
    return {t for t in found if t in mods and t != mod and t not in own}


def _graph(pkg: Path = PKG) -> dict[str, set[str]]:
    mods = _modules(pkg)
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _layer(mod: str) -> int | None:
    top = mod.split(".")[1] if mod.count(".") else mod
    return next((i for i, layer in enumerate(LAYERS) if top in layer), None)


def _top(mod: str) -> str:
    return mod.split(".")[1] if mod.count(".") else mod


def unlisted(graph: dict[str, set[str]]) -> list[str]:
    return sorted({_top(m) for m in graph if _layer(m) is None})


def upward_paths(graph: dict[str, set[str]]) -> list[str]:
    """Every import path (direct or through other modules) from a module to one of a layer that is
    not below it, outside its own package: ``a -> b -> c`` where ``c`` is wrongly reached."""
    wrong = []
    for start in graph:
        seen, todo = {start: [start]}, [start]
        while todo:
            here = todo.pop()
            for nxt in sorted(graph[here]):
                if nxt in seen:
                    continue
                seen[nxt] = seen[here] + [nxt]
                todo.append(nxt)
                if _top(nxt) != _top(start) and nxt != "ppo_lm" and not _layer(nxt) < _layer(start):
                    wrong.append(" -> ".join(seen[nxt]))
    return wrong


def cycles(graph: dict[str, set[str]]) -> list[str]:
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return sorted(m for m in graph if m in reach(m))


def test_every_package_and_top_level_module_is_in_a_layer():
    assert not unlisted(_graph()), f"not in a layer of LAYERS: {unlisted(_graph())}"


def test_no_import_cycles():
    found = cycles(_graph())
    assert not found, f"modules on an import cycle: {found}"


def test_layers_import_one_way():
    wrong = upward_paths(_graph())
    assert not wrong, wrong[:10]


def _tree_with(tmp_path: Path, file: str, line: str) -> Path:
    pkg = tmp_path / "ppo_lm"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    target = pkg / file
    target.write_text(target.read_text() + "\n" + line + "\n")
    return pkg


def test_an_algorithms_module_importing_a_command_module_is_caught(tmp_path):
    """algorithms/stats.py -> cli/bench_workloads.py: an upward path, and, since bench_workloads reaches
    the models, which import the algorithms package, a cycle through algorithms/__init__.py."""
    graph = _graph(_tree_with(tmp_path, "algorithms/stats.py", "from ..cli import bench_workloads"))
    assert any(p.startswith("ppo_lm.algorithms.stats -> ppo_lm.cli.bench_workloads") for p in upward_paths(graph))
    assert {"ppo_lm.algorithms", "ppo_lm.algorithms.stats", "ppo_lm.cli.bench_workloads"} <= set(cycles(graph))


def test_a_models_module_importing_reporting_is_caught(tmp_path):
    graph = _graph(_tree_with(tmp_path, "models/onednn.py", "from ..reporting import plots, report_page"))
    wrong = upward_paths(graph)
    assert "ppo_lm.models.onednn -> ppo_lm.reporting.plots" in wrong
    assert "ppo_lm.models.onednn -> ppo_lm.reporting.report_page" in wrong


def test_a_package_missing_from_the_layers_is_caught(tmp_path):
    pkg = _tree_with(tmp_path, "models/onednn.py", "")
    (pkg / "helpers.py").write_text("X = 1\n")
    assert unlisted(_graph(pkg)) == ["helpers"]


def test_every_package_has_an_init():
    missing = [str(d.relative_to(PKG)) for d in PKG.rglob("*") if d.is_dir() and d.name != "__pycache__"
               and not (d / "__init__.py").is_file()]
    assert not missing, missing


def test_the_trainer_core_does_not_know_lanes_exist():
    """CPU lanes and DDP's no_sync sit behind Learner.accumulate/backward (and Lanes.map_rows for scoring);
    only the code that builds them names them. The update calls learner.backward(loss, ...), whose
    single-lane path is loss.backward()."""
    allowed = {"ppo_lm.runtime", "ppo_lm.runtime.lanes", "ppo_lm.trainer.learner", "ppo_lm.rollout.score.scoring"}
    users = {m for m, t in _graph().items() if "ppo_lm.runtime.lanes" in t}
    assert users <= allowed, users - allowed
    update = (PKG / "trainer" / "update.py").read_text()
    for word in ("autograd.grad", "no_sync", "DistributedDataParallel", "lanes", "partial("):
        assert word not in update, word
    assert update.count("learner.backward(") == 2  # the policy's loss, a separate critic's
    assert "loss.backward()" in (PKG / "runtime" / "lanes.py").read_text()


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


def _architecture_rows(text: str) -> dict[str, str]:
    """docs/architecture.md's table of layers: package -> what its row says."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| \d \| `(\w+)` \| (.*) \|$", text, re.M)}


def _architecture_gaps(text: str, pkg: Path = PKG) -> list[str]:
    """What docs/architecture.md leaves out or names wrongly: a package without its row, a module or a
    wing (a sub-package, ``name/``) its package's row does not name, a path (``a/b.py``) that does not exist."""
    rows = _architecture_rows(text)
    gaps = []
    for top in sorted(p for p in pkg.iterdir() if (p / "__init__.py").is_file()):
        row = rows.get(top.name)
        if row is None:
            gaps.append(f"package {top.name}: no row")
            continue
        for p in sorted(top.rglob("*.py")):
            rel = p.relative_to(top)
            if p.stem == "__init__":
                if rel.parent != Path(".") and f"`{rel.parent.as_posix()}/`" not in row:
                    gaps.append(f"{top.name}: wing {rel.parent.as_posix()}/ not named")
            elif not any(f"`{p.stem}{end}" in row for end in ("`", ".py`", ".")):  # `lean`, `ppo.PPOTrainer`
                gaps.append(f"{top.name}: module {rel.as_posix()} not named")
    for path in re.findall(r"`((?:\w+/)+\w+\.py)", text):
        if not (pkg / path).is_file() and not (ROOT / path).is_file():
            gaps.append(f"{path}: no such file")
    return gaps


def test_the_architecture_page_is_in_step_with_the_tree(tmp_path):
    """Every package has its row in docs/architecture.md's table, each row names every module and wing
    of its package, and every path the page gives exists; and the check sees a module added, a path
    gone, a package without a row."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert not _architecture_gaps(text)
    fake = tmp_path / "ppo_lm"
    shutil.copytree(PKG, fake, ignore=shutil.ignore_patterns("__pycache__"))
    (fake / "rollout" / "sample" / "newcomer.py").write_text("")
    (fake / "extra").mkdir()
    (fake / "extra" / "__init__.py").write_text("")
    gaps = _architecture_gaps(text.replace("runtime/lanes.py", "runtime/lanes_gone.py"), fake)
    assert gaps == ["package extra: no row", "rollout: module sample/newcomer.py not named",
                    "runtime/lanes_gone.py: no such file"], gaps
