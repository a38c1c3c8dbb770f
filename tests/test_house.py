"""The kit's house rules, checked on the source: module size, one home per name (no re-export shims, no private
names across modules), no repeated blocks, honest notebooks, package metadata (license, py.typed)."""

from __future__ import annotations

import ast
import json
import re
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "kit"
MODULES = sorted(KIT.rglob("*.py"))
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))
MAX_LINES = 450


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _code_cells(nb: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]


def _private_imports(tree: ast.AST) -> list[str]:
    """``from kit... import _x`` or ``... as _x``: a private name taken across modules."""
    bad = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] in ("kit", "")
            or (isinstance(node, ast.ImportFrom) and node.level)
        ):
            for a in node.names:
                for name in (a.name, a.asname or ""):
                    if name.startswith("_") and not name.startswith("__"):
                        bad.append(
                            f"from {'.' * node.level}{node.module or ''} import {a.name}"
                            + (f" as {a.asname}" if a.asname else "")
                        )
    return bad


def test_modules_are_small():
    long = {_rel(p): n for p in MODULES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split by concern): {long}"


#: the one documented façade: ``import kit`` gives the front door's short names (lazily); no other module re-exports
FACADE = KIT / "__init__.py"


def test_no_module_level_getattr_shims():
    shims = [
        _rel(p)
        for p in MODULES
        if p != FACADE
        and any(
            isinstance(n, ast.FunctionDef) and n.name in ("__getattr__", "__dir__")
            for n in ast.parse(p.read_text()).body
        )
    ]
    assert not shims, f"module-level __getattr__/__dir__ (a re-export shim) outside kit/__init__.py: {shims}"


def test_the_front_door_points_at_each_name_s_one_home():
    """Every short name of ``kit`` resolves to the object defined in the module it names (not a re-export there),
    and its docstring lists every name."""
    import importlib

    import kit

    doc = kit.__doc__
    for name, target in kit.FRONT_DOOR.items():
        module, _, attr = target.partition(":")
        obj = getattr(kit, name)
        if attr:
            assert obj is getattr(importlib.import_module(module), attr), name
            assert getattr(obj, "__module__", module) == module, f"{name}: {target} re-exports {obj.__module__}"
        else:
            assert obj is importlib.import_module(module), name
        assert name in doc, f"the front door's docstring does not list {name}"
    with pytest.raises(AttributeError, match="the front door: "):
        kit.no_such_name  # noqa: B018


def test_import_kit_is_light():
    """``import kit`` (and so ``kit --help``'s first step) imports neither torch nor pandas."""
    import subprocess
    import sys

    code = "import sys, kit; print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_all_lists_only_names_the_module_defines():
    """``__all__`` naming an imported name is a re-export: the name has one home and is imported from there."""
    bad = {}
    for p in MODULES:
        if p == FACADE:  # the front door lists the names it points at (test_the_front_door_points_at_...)
            continue
        tree = ast.parse(p.read_text())
        defined, listed = set(), []
        for n in tree.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        defined.add(t.id)
                        if t.id == "__all__":
                            listed = [e.value for e in n.value.elts]
        reexported = [x for x in listed if x not in defined]
        if reexported:
            bad[_rel(p)] = reexported
    assert not bad, f"__all__ re-exports names defined elsewhere: {bad}"


@pytest.mark.parametrize("where", ["kit", "tests", "notebooks", "benchmarks"])
def test_no_private_name_is_imported_across_modules(where):
    bad = {}
    if where == "notebooks":
        for nb in NOTEBOOKS:
            for src in _code_cells(nb):
                try:
                    found = _private_imports(ast.parse(src))
                except SyntaxError:  # IPython magics: not Python, nothing imported there
                    continue
                if found:
                    bad.setdefault(_rel(nb), []).extend(found)
    else:
        for p in sorted((ROOT / where).rglob("*.py")):
            if "fake_backends" in p.parts:
                continue
            if found := _private_imports(ast.parse(p.read_text())):
                bad[_rel(p)] = found
    assert not bad, f"private names imported across modules: {bad}"


def _significant(line: str) -> str | None:
    s = line.strip()
    if not s or s.startswith(("#", "import ", "from ", '"""', "'''", "@")) or s in (")", "]", "}", "):", "]:"):
        return None
    return re.sub(r"\s+", " ", s)


def test_no_block_of_six_lines_is_repeated_within_kit():
    """The same six significant lines (blank lines, comments, imports and lone brackets skipped) in two places of
    kit/ are one piece of logic with two homes."""
    seen: dict[tuple, list[str]] = defaultdict(list)
    for p in MODULES:
        lines = [(i + 1, s) for i, raw in enumerate(p.read_text().splitlines()) if (s := _significant(raw))]
        for k in range(len(lines) - 5):
            window = tuple(s for _, s in lines[k : k + 6])
            if sum(len(s) for s in window) < 120:  # short boilerplate (returns, else:, pass) is not logic
                continue
            seen[window].append(f"{_rel(p)}:{lines[k][0]}")
    repeated = {w[0][:60]: places for w, places in seen.items() if len(places) > 1}
    assert not repeated, f"blocks of 6+ lines repeated within kit/: {repeated}"


def test_notebooks_never_hide_a_failure():
    bad = []
    for nb in NOTEBOOKS:
        for src in _code_cells(nb):
            if re.search(r"^\s*except\s*(Exception|BaseException)?\s*(as \w+)?\s*:", src, re.M):
                bad.append(_rel(nb))
    assert not bad, f"notebooks with a broad except (a kit failure must fail the notebook): {bad}"


def test_package_metadata_license_and_typing():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    from kit.track.db import DISTRIBUTIONS

    assert meta["name"] == DISTRIBUTIONS["kit"] != "kit"  # `kit` on PyPI is another project; the import name stays
    assert meta["license"] == "Apache-2.0"  # an SPDX expression, matching LICENSE
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert (KIT / "py.typed").exists()
    assert not any(d.startswith("httpx") for d in meta["dependencies"])  # not used by the kit


#: what a user who clones the repository does not have: the reference folder beside the checkout and its metric
#: notes (the literals are built here so this file does not match itself)
OUTSIDE_REFERENCES = ("../" + "shared", "METRICS" + ".md", "shared/" + "cases", "shared/" + "reference")
SELF_CONTAINED_PLACES = ("kit", "notebooks", "docs", "benchmarks", "tests", "README.md")
#: generated or cached folders under those places (never committed)
NOT_SOURCE = {"_build", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", "results"}


def _text_files(place: Path):
    if place.is_file():
        yield place
        return
    for p in sorted(place.rglob("*")):
        if p.is_file() and not NOT_SOURCE.intersection(p.relative_to(ROOT).parts):
            yield p


def test_the_project_points_at_nothing_outside_it():
    """Docs, docstrings, notebooks, benchmarks and tests never send a reader (or a test) to files outside the
    repository: metric definitions are docs/metrics.md, data ships in kit/data/ or tests/data/."""
    hits = []
    for place in SELF_CONTAINED_PLACES:
        for p in _text_files(ROOT / place):
            for i, line in enumerate(p.read_bytes().decode("utf-8", "replace").splitlines(), 1):
                hits += [f"{_rel(p)}:{i}: {ref}" for ref in OUTSIDE_REFERENCES if ref in line]
    assert not hits, "references to files a clone does not have (point at docs/metrics.md or shipped data):\n" + (
        "\n".join(hits)
    )


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


KIT_MODULES = {_module_name(p): p for p in MODULES}


def _import_edges(source: str, here: str, is_package: bool, known=KIT_MODULES) -> dict[str, int]:
    """Modules of ``known`` that module ``here`` imports → the line of the first such import.

    Every import statement counts, at module level or inside a function (an import moved into a function to dodge a
    cycle is still a cycle), with the parent packages it loads; imports in an ``if TYPE_CHECKING:`` block do not
    (they never run). ``kit`` itself is never a target: its ``__init__`` is the lazy front door."""
    tree = ast.parse(source)
    type_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and "TYPE_CHECKING" in {getattr(node.test, "id", ""), getattr(node.test, "attr", "")}
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    edges: dict[str, int] = {}
    for node in ast.walk(tree):
        if id(node) in type_only or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = here.split(".")[: len(here.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(package + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for name in names:
            parts = name.split(".")
            for i in range(2, len(parts) + 1):
                target = ".".join(parts[:i])
                if target in known and target != here:
                    edges.setdefault(target, node.lineno)
    return edges


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (modules, first == last) per strongly connected component of ``graph`` (Tarjan's algorithm): the
    shortest way from the component's first module back to itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for component in components:
        start = min(component)
        paths = {start: [start]}
        frontier = [start]
        while not any(start in graph[v] for v in frontier):  # breadth first: the component always leads back
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in component and w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        cycles.append(paths[next(v for v in frontier if start in graph[v])] + [start])
    return sorted(cycles)


def test_import_edges_count_function_level_imports_and_skip_type_checking_ones():
    known = {"kit.a", "kit.b", "kit.c", "kit.pkg", "kit.pkg.d", "kit.pkg.e"}
    source = (
        "from typing import TYPE_CHECKING\nimport os\nfrom kit import a\n"
        "if TYPE_CHECKING:\n    from kit.c import C\n"
        "def f():\n    from kit.b import g\n"
        "from .d import h\nfrom . import e\n"
    )
    assert _import_edges(source, "kit.pkg.x", False, known) == {
        "kit.a": 3, "kit.b": 7, "kit.pkg": 8, "kit.pkg.d": 8, "kit.pkg.e": 9
    }  # fmt: skip
    graph = {"kit.a": {"kit.b": 1}, "kit.b": {"kit.c": 1, "kit.a": 2}, "kit.c": {"kit.b": 1}, "kit.d": {"kit.a": 1}}
    assert _cycles(graph) == [["kit.a", "kit.b", "kit.a"]]
    assert _cycles({"kit.a": {"kit.b": 1}, "kit.b": {}}) == []


def test_no_import_cycles_in_kit():
    """No module of the kit imports, directly or through others, a module that imports it back (type-only
    imports under ``if TYPE_CHECKING:`` excepted; ``kit/__init__.py``, the lazy front door, is not a source)."""
    graph = {
        name: _import_edges(path.read_text(), name, path.name == "__init__.py")
        for name, path in KIT_MODULES.items()
        if name != "kit"
    }
    assert graph["kit.store"].get("kit.results")  # the walk sees the kit's imports at all
    found = [
        " -> ".join(f"{a} ({_rel(KIT_MODULES[a])}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:]))
        + f" -> {cycle[-1]}"
        for cycle in _cycles(graph)
    ]
    assert not found, "import cycles (move the shared thing into the lower module):\n" + "\n".join(found)


MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 8


def _function_sizes(source: str) -> list[tuple[str, int, int, int]]:
    """``(name, def line, lines, parameters)`` of every function: lines from the ``def`` line to the last (as
    ``ruff format`` leaves them, decorators not counted); parameters positional, positional-only and keyword-only,
    a leading ``self`` / ``cls`` and ``*args`` / ``**kwargs`` not counted."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
            first = (a.posonlyargs + a.args)[:1]
            if first and first[0].arg in ("self", "cls"):
                params -= 1
            out.append((n.name, n.lineno, n.end_lineno - n.lineno + 1, params))
    return out


def test_function_sizes_count_lines_from_def_and_parameters_without_self():
    source = (
        "class C:\n    @staticmethod\n    def m(self, a, /, b, *args, c, **kw):\n        pass\n\n"
        "async def f(x=1,\n      y=2):\n    return (\n        x\n    )\n"
    )
    assert _function_sizes(source) == [("f", 6, 5, 2), ("m", 3, 2, 3)]


def test_functions_are_small():
    """No function in ``kit/`` over :data:`MAX_FUNCTION_LINES` lines or :data:`MAX_PARAMETERS` parameters: a long
    function reads as a few named steps, a long parameter list is a config dataclass."""
    big = [
        f"{_rel(p)}:{line} {name}: {n_lines} lines, {n_params} parameters"
        for p in MODULES
        for name, line, n_lines, n_params in _function_sizes(p.read_text())
        if n_lines > MAX_FUNCTION_LINES or n_params > MAX_PARAMETERS
    ]
    assert not big, (
        f"functions over {MAX_FUNCTION_LINES} lines or {MAX_PARAMETERS} parameters (split into named steps; "
        "take a config dataclass):\n" + "\n".join(sorted(big))
    )
