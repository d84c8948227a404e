"""The house rules, checked on the source tree:

- every module imports on its own, first, in a fresh interpreter state (no import circle that breaks an
  import), and the imports that run at import time form no cycle;
- no module imports another module's private name (`from m import _x`, or `m._x` off an imported module),
  checked over the packages, the examples and the scripts;
- no file is longer than about 500 lines, the Triton kernels aside.

Each checker is also shown to catch a planted violation.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("oracle", "lowerings", "strategies", "parity")


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """`{dotted name: file}` for every module of `packages` (a package as its own name)."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = f
    return out


def _targets(node: ast.Import | ast.ImportFrom, current: str, is_package: bool) -> list[tuple[str, str | None]]:
    """`(module, imported name or None)` for each name an import statement binds (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    base = node.module or ""
    if node.level:
        pkg = current.split(".") if is_package else current.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return [(base, a.name) for a in node.names]


def _statements(tree: ast.Module, lazy: bool):
    """Import statements of a module: those run at import (not inside a function, nor under
    `if TYPE_CHECKING:`), or every one when `lazy`."""
    def walk(body, top):
        for n in body:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                if top or lazy:
                    yield n
                continue
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test):
                continue
            inner = top and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for field in ("body", "orelse", "finalbody", "handlers"):
                sub = getattr(n, field, None)
                if isinstance(sub, list):
                    yield from walk(sub, inner)
    yield from walk(tree.body, True)


def import_graph(mods: dict[str, Path], *, lazy: bool = False) -> dict[str, set[str]]:
    """Which project modules each module imports (with the packages whose `__init__` that runs)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in _statements(ast.parse(f.read_text()), lazy):
            for module, name in _targets(node, m, f.name == "__init__.py"):
                target = f"{module}.{name}" if name and f"{module}.{name}" in mods else module
                parts = target.split(".")
                for k in range(1, len(parts) + 1):
                    p = ".".join(parts[:k])
                    if p in mods and p != m and not m.startswith(p + "."):
                        graph[m].add(p)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@dataclass(frozen=True)
class PrivateUse:
    """`file:line` uses `name`, private to `module`."""

    file: str
    line: int
    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.module}.{self.name}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str, current: str, is_package: bool, mods: dict[str, Path], file: str = "") -> list[PrivateUse]:
    """Another module's private names (`_x`, not dunders) that `source` imports (`from m import _x`) or
    reads off an imported module (`m._x`). A private submodule of the importer's own top-level package
    (`from lowerings import _merge_kernel` inside `lowerings`) is that package's business: allowed."""
    tree = ast.parse(source)
    top = current.split(".")[0]
    uses: list[PrivateUse] = []
    bound: dict[str, str] = {}  # local name -> module it is bound to

    def own_submodule(module: str, name: str) -> bool:
        return f"{module}.{name}" in mods and module.split(".")[0] == top

    for node in _statements(tree, lazy=True):
        for module, name in _targets(node, current, is_package):
            if name is None:
                alias = next(a for a in node.names if a.name == module)
                bound[alias.asname or module.split(".")[0]] = module if alias.asname else module.split(".")[0]
                continue
            alias = next(a for a in node.names if a.name == name)
            if f"{module}.{name}" in mods:
                bound[alias.asname or name] = f"{module}.{name}"
            if (module.split(".")[0] in PACKAGES and _private(name) and not own_submodule(module, name)
                    and module != current):
                uses.append(PrivateUse(file, node.lineno, module, name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            module = bound[node.value.id]
            if module.split(".")[0] not in PACKAGES:  # the standard library's and torch's are theirs
                continue
            if _private(node.attr) and not own_submodule(module, node.attr) and module != current:
                uses.append(PrivateUse(file, node.lineno, module, node.attr))
    return uses


def line_counts(root: Path = ROOT) -> dict[str, int]:
    """Lines per Python file of the repository (tests, scripts and examples included; not .venv)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if rel.parts[0].startswith(".") or "egg-info" in rel.parts[0] or rel.parts[0] == "build":
            continue
        out[str(rel)] = len(f.read_text().splitlines())
    return out


# ---- the checks ---------------------------------------------------------------------------------------------

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

MAX_LINES = 500
LONG_FILES_ALLOWED = {
    # Triton kernels: one kernel's specializations read best in one file.
    "lowerings/_hybrid_kernel.py": "Triton kernel",
    "lowerings/_merge_kernel.py": "Triton kernel",
    "oracle/_fast_kernel.py": "Triton kernel",
}
SLACK = 1.15  # "about 500": a file may run 15% over before it must be split
# Private names still imported across modules (none: the outcome model's JSON helpers are public in
# parity.engine.outcome). A listed use that is gone fails too, so this list only shrinks.
PENDING_PRIVATE: set[str] = set()
IMPORT_ALL = """
import importlib, json, sys
names = json.loads(sys.argv[1])
packages = tuple(json.loads(sys.argv[2]))
baseline = set(sys.modules)
failed = {}
for name in names:
    for mod in [m for m in sys.modules if m.split(".")[0] in packages]:
        del sys.modules[mod]
    try:
        importlib.import_module(name)
    except BaseException as err:  # noqa: BLE001
        failed[name] = f"{type(err).__name__}: {err}"
print(json.dumps(failed))
"""


def test_every_module_imports_on_its_own_first():
    """Each module imported first, with every project module dropped from `sys.modules` before it (one
    interpreter: torch, hypothesis and triton stay loaded, the project's modules are imported afresh)."""
    names = sorted(modules())
    res = subprocess.run([sys.executable, "-c", IMPORT_ALL, json.dumps(names), json.dumps(PACKAGES)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    failed = json.loads(res.stdout.strip().splitlines()[-1])
    assert not failed, failed


def test_the_isolated_import_check_catches_a_circle(tmp_path):
    """Two modules importing a name from each other at import time: the check above reports it."""
    pkg = tmp_path / "circle_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circle_pkg.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from circle_pkg.a import A\nB = 2\n")
    res = subprocess.run([sys.executable, "-c", IMPORT_ALL, json.dumps(["circle_pkg.a"]), json.dumps(["circle_pkg"])],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    failed = json.loads(res.stdout.strip().splitlines()[-1])
    assert "partially initialized" in failed["circle_pkg.a"], failed


def test_import_time_imports_form_no_cycle():
    found = cycles(import_graph(modules()))
    assert not found, f"modules importing each other at import time: {found}"


def test_the_cycle_check_catches_a_planted_cycle(tmp_path):
    pkg = tmp_path / "oracle"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from oracle import b\n")
    (pkg / "b.py").write_text("import oracle.c\n")
    (pkg / "c.py").write_text("from . import a\ndef f():\n    from oracle import b\n")
    mods = modules(tmp_path, ("oracle",))
    assert cycles(import_graph(mods)) == [["oracle.a", "oracle.b", "oracle.c"]]


def _private_uses_in_tree() -> set[str]:
    mods = modules()
    found = set()
    for name, f in mods.items():
        found |= {str(u) for u in private_uses(f.read_text(), name, f.name == "__init__.py", mods,
                                                  str(f.relative_to(ROOT)))}
    for folder in ("examples", "scripts"):
        for f in sorted((ROOT / folder).glob("*.py")):
            found |= {str(u) for u in private_uses(f.read_text(), f"{folder}.{f.stem}", False, mods,
                                                      str(f.relative_to(ROOT)))}
    return {u.split(":", 1)[0] + ":" + u.split(":", 2)[2] for u in found}  # without line numbers


def test_no_module_uses_another_modules_private_name():
    found = _private_uses_in_tree()
    assert found - PENDING_PRIVATE == set(), sorted(found - PENDING_PRIVATE)
    assert PENDING_PRIVATE - found == set(), f"no longer used, drop from PENDING_PRIVATE: {PENDING_PRIVATE - found}"


def test_the_private_name_check_catches_each_form():
    mods = modules()
    src = ("from parity.engine.runner import _jsonable\n"
           "from lowerings import registry\n"
           "import parity.engine.invocation as inv\n"
           "from lowerings import _merge_kernel\n"  # another package's private module
           "def f():\n"
           "    from lowerings.registry import _REGISTRY\n"
           "    return registry._load_builtins, inv.call_lowering, _merge_kernel, registry.__name__\n")
    uses = {(u.module, u.name) for u in private_uses(src, "parity.planted", False, mods)}
    assert uses == {("parity.engine.runner", "_jsonable"), ("lowerings", "_merge_kernel"), ("lowerings.registry", "_REGISTRY"),
                    ("lowerings.registry", "_load_builtins")}, uses
    own = "from lowerings import _merge_kernel as mk\nx = mk.KERNELS\n"  # a package's own private module
    assert private_uses(own, "lowerings.merges", False, mods) == []


def test_no_file_is_much_longer_than_500_lines():
    long = {f: n for f, n in line_counts().items() if n > MAX_LINES * SLACK and f not in LONG_FILES_ALLOWED}
    assert not long, f"split these by concern (at most about {MAX_LINES} lines): {long}"


def test_the_length_check_counts_lines(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * 600)
    assert line_counts(tmp_path) == {"pkg/big.py": 600}
