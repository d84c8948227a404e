"""The layers of the house, checked on the source tree (docs/concepts.md, "Layers"):

    oracle < lowerings < strategies < parity.engine < parity.exec, parity.report < parity.front, parity.bench

- no import points up a layer, nor across between `parity.exec` and `parity.report`, counting every import (the
  ones inside functions too; only `if TYPE_CHECKING:` imports are left out: they run never);
- no import circle, counting every import;
- no module imports another package's private module (`from strategies._determinism import ...` outside
  `strategies`);
- the engine imports none of `subprocess`, `signal`, `multiprocessing`, `fcntl` and calls no `os.fork`;
- no product file over 400 lines (Triton kernels aside), no function over 80 lines or 10 parameters (Triton
  kernels, `@triton.jit`, aside);
- no product module cites a GPU run, a session or a machine (`run 27`, `session 8`, `docs/gpu/runs/`, `H200`):
  docstrings keep the contract and a link to a reference page or the lab notebook, where the numbers live.

Each check is shown to catch a planted violation.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_architecture import ROOT, PACKAGES, _statements, _targets, cycles, import_graph, modules

LAYERS = (("oracle",), ("lowerings",), ("strategies",), ("parity.engine",), ("parity.exec", "parity.report"),
          ("parity.front", "parity.bench"))
NEUTRAL = ("parity",)  # the package itself (a docstring) and its deprecated aliases of moved modules
ALIASES = ("parity.cli", "parity.warmup", "parity.pytest_plugin", "parity.hooks", "parity.shared_compile_cache")
FORBIDDEN_IN_ENGINE = ("subprocess", "signal", "multiprocessing", "fcntl")
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 400, 80, 10
TRITON_KERNEL_FILES = ("lowerings/_hybrid_kernel.py", "lowerings/_merge_kernel.py", "oracle/_fast_kernel.py",
                       "oracle/_values_kernel.py")


def layer_of(module: str) -> tuple[int, str] | None:
    """`(rank, layer)` of `module` by its longest layer prefix; None for `parity` itself and its aliases."""
    if module in NEUTRAL or module in ALIASES:
        return None
    best = None
    for rank, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (rank, name)
    return best


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> imported (layer -> layer)` for every import that points up a layer or across between the
    peers of one rank."""
    found = []
    for m, targets in sorted(graph.items()):
        lm = layer_of(m)
        for t in sorted(targets):
            lt = layer_of(t)
            if lm is None or lt is None:
                continue
            if lt[0] > lm[0] or (lt[0] == lm[0] and lt[1] != lm[1]):
                found.append(f"{m} -> {t} ({lm[1]} -> {lt[1]})")
    return found


def _every_import_graph(mods):
    return import_graph(mods, lazy=True)


def private_modules(mods: dict[str, Path], root: Path = ROOT) -> list[str]:
    """`file: module` for every import of a private module (a name part starting with `_`) of another package."""
    found = []
    for name, f in mods.items():
        own = layer_of(name)
        for node in _statements(ast.parse(f.read_text()), lazy=True):
            for module, imported in _targets(node, name, f.name == "__init__.py"):
                full = f"{module}.{imported}" if imported and f"{module}.{imported}" in mods else module
                parts = full.split(".")
                if parts[0] not in PACKAGES or not any(p.startswith("_") and not p.startswith("__") for p in parts):
                    continue
                if layer_of(full) != own:
                    found.append(f"{f.relative_to(root)}: {full}")
    return found


def engine_impurities(mods: dict[str, Path]) -> list[str]:
    """What an engine module imports of process machinery (`FORBIDDEN_IN_ENGINE`) or calls of `os.fork`."""
    found = []
    for name, f in mods.items():
        if not name.startswith("parity.engine"):
            continue
        tree = ast.parse(f.read_text())
        for node in _statements(tree, lazy=True):
            for module, imported in _targets(node, name, f.name == "__init__.py"):
                if module.split(".")[0] in FORBIDDEN_IN_ENGINE:
                    found.append(f"{name}: imports {module}")
                elif module == "os" and imported in ("fork", "forkpty"):
                    found.append(f"{name}: imports os.{imported}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("fork", "forkpty") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"{name}:{node.lineno}: os.{node.attr}")
    return found


RUN_CITATION = re.compile(r"\b(?:[Rr]uns?|[Ss]essions?) [0-9]+(?:-[0-9]+)?\b(?![.\d])|docs/gpu/runs|\b[AHB][12]00\b")


def run_citations(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """`file:line: text` of every line of a product module that cites a run, a session or a machine."""
    found = []
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            for i, line in enumerate(f.read_text().splitlines(), 1):
                m = RUN_CITATION.search(line)
                if m:
                    found.append(f"{f.relative_to(root)}:{i}: {m.group(0)}")
    return found


def _is_triton_kernel(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.dump(d) for d in fn.decorator_list)


def oversized(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Product files over `MAX_FILE_LINES` (Triton kernel files aside) and functions over `MAX_FUNCTION_LINES`
    lines or `MAX_PARAMETERS` parameters (`self`/`cls` not counted; Triton kernels aside)."""
    found = []
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            rel = str(f.relative_to(root))
            text = f.read_text()
            if len(text.splitlines()) > MAX_FILE_LINES and rel not in TRITON_KERNEL_FILES:
                found.append(f"{rel}: {len(text.splitlines())} lines")
            for n in ast.walk(ast.parse(text)):
                if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) or _is_triton_kernel(n):
                    continue
                a = n.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                count = len(params) + bool(a.vararg) + bool(a.kwarg) - bool(params and params[0].arg in ("self", "cls"))
                lines = n.end_lineno - n.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{rel}:{n.lineno} {n.name}: {lines} lines")
                if count > MAX_PARAMETERS:
                    found.append(f"{rel}:{n.lineno} {n.name}: {count} parameters")
    return found


# ---- the checks -------------------------------------------------------------------------------------------

def test_no_import_points_up_a_layer():
    found = wrong_way(_every_import_graph(modules()))
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_no_import_circle_counting_every_import():
    found = cycles(_every_import_graph(modules()))
    assert not found, f"modules importing each other (imports inside functions counted): {found}"


def test_no_other_packages_private_module_is_imported():
    found = private_modules(modules())
    assert not found, "\n".join(found)


def test_the_engine_starts_no_process_and_sends_no_signal():
    found = engine_impurities(modules())
    assert not found, "\n".join(found)


def test_no_file_function_or_signature_is_oversized():
    found = oversized()
    assert not found, "split these:\n" + "\n".join(found)


def test_no_product_module_cites_a_run_a_session_or_a_machine():
    found = run_citations()
    assert not found, "move these numbers to docs/gpu or docs/lab and link the page:\n" + "\n".join(found)


# ---- each check catches a planted violation ---------------------------------------------------------------

def _planted(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for pkg in ("oracle", "strategies", "parity", "parity/engine", "parity/exec", "parity/report", "parity/front"):
        init = tmp_path / pkg / "__init__.py"
        init.parent.mkdir(parents=True, exist_ok=True)
        if not init.exists():
            init.write_text("")
    return modules(tmp_path, ("oracle", "strategies", "parity"))


def test_an_upward_import_inside_a_function_is_caught(tmp_path):
    mods = _planted(tmp_path, {"parity/engine/judge.py": "def f():\n    from parity.front import cli\n",
                               "parity/front/cli.py": "from parity.engine import judge\n",
                               "parity/exec/pool.py": "import parity.report.files\n",
                               "parity/report/files.py": "x = 1\n"})
    found = wrong_way(_every_import_graph(mods))
    assert found == ["parity.engine.judge -> parity.front (parity.engine -> parity.front)",
                     "parity.engine.judge -> parity.front.cli (parity.engine -> parity.front)",
                     "parity.exec.pool -> parity.report (parity.exec -> parity.report)",
                     "parity.exec.pool -> parity.report.files (parity.exec -> parity.report)"], found
    assert cycles(_every_import_graph(mods)) == [["parity.engine.judge", "parity.front.cli"]]


def test_a_private_module_of_another_package_is_caught(tmp_path):
    mods = _planted(tmp_path, {"strategies/_determinism.py": "x = 1\n",
                               "strategies/_cases.py": "from strategies._determinism import x\n",
                               "parity/engine/sweep.py": "from strategies._determinism import x\n"})
    assert private_modules(mods, tmp_path) == ["parity/engine/sweep.py: strategies._determinism"]


def test_process_machinery_in_the_engine_is_caught(tmp_path):
    mods = _planted(tmp_path, {"parity/engine/a.py": "import os\ndef f():\n    import signal\n    return os.fork()\n",
                               "parity/engine/b.py": "from multiprocessing import Pool\n",
                               "parity/exec/c.py": "import subprocess\n"})
    assert sorted(engine_impurities(mods)) == ["parity.engine.a: imports signal", "parity.engine.a:4: os.fork",
                                               "parity.engine.b: imports multiprocessing"]


def test_oversized_files_functions_and_signatures_are_caught(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (tmp_path / "oracle").mkdir()
    (tmp_path / "oracle" / "big.py").write_text(
        f"def long():\n{body}\n\ndef wide(a, b, c, d, e, f, g, h, i, j, k):\n    pass\n\n"
        "class C:\n    def m(self, a, b, c, d, e, f, g, h, i, j):\n        pass\n" + "\n" * 320)
    found = oversized(tmp_path, ("oracle",))
    assert found == ["oracle/big.py: 409 lines", "oracle/big.py:1 long: 82 lines",
                     "oracle/big.py:84 wide: 11 parameters"], found


def test_a_run_number_in_a_docstring_is_caught(tmp_path):
    (tmp_path / "parity").mkdir()
    (tmp_path / "parity" / "a.py").write_text('"""Fast: 3 ms a case (run 27).\n\nSince session 8; on the H200; see\n'
                                              'docs/gpu/runs/27.log. Startup: session 0.4 s."""\nruns = 4\n')
    assert run_citations(tmp_path, ("parity",)) == ["parity/a.py:1: run 27", "parity/a.py:3: session 8",
                                                    "parity/a.py:4: docs/gpu/runs"]
