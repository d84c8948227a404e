"""The options of one `check` travel from the command line to the judge through at most `MAX_FILES` files of the
product, and never back up a layer (issue 48; the layers: `tests/test_layers.py`).

Measured on a real `dflash-parity check` run in this process (`--no-isolate`: the judge runs here): the call stack
at the judge's entry point (`parity.engine.judge.compare`), from `parity.front.cli.main` down, read as the files it
passes through. `path_problems` is the rule, shown to catch a planted long path and a planted climb.
"""

from __future__ import annotations

import sys

from parity.front import cli
from tests.test_layers import ROOT, layer_of

MAX_FILES = 12
JUDGE = ("parity/engine/judge.py", "compare")


def _module(rel: str) -> str:
    return rel[:-3].replace("/", ".").removesuffix(".__init__")


def path_problems(stack: list[tuple[str, str]], max_files: int = MAX_FILES) -> list[str]:
    """What is wrong with a path `[(file relative to the repository, function), ...]`, outermost first: more than
    `max_files` distinct files, or a step from a lower layer back up to a higher one."""
    files: list[str] = []
    for rel, _ in stack:
        if not files or files[-1] != rel:
            files.append(rel)
    problems = []
    if len(set(files)) > max_files:
        problems.append(f"{len(set(files))} files (at most {max_files}): {' > '.join(files)}")
    for a, b in zip(files, files[1:]):
        la, lb = layer_of(_module(a)), layer_of(_module(b))
        if la and lb and lb[0] > la[0]:
            problems.append(f"back up a layer: {a} ({la[1]}) > {b} ({lb[1]})")
    return problems


def _stack_at_the_judge(argv: list[str]) -> list[tuple[str, str]]:
    found: list[list[tuple[str, str]]] = []
    root = str(ROOT) + "/"

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and not found and (code.co_filename.endswith(JUDGE[0]) and code.co_name == JUDGE[1]):
            stack, f = [], frame
            while f is not None:
                if f.f_code.co_filename.startswith(root):
                    stack.append((f.f_code.co_filename[len(root):], f.f_code.co_name))
                f = f.f_back
            found.append(stack[::-1])

    sys.setprofile(profile)
    try:
        cli.main(argv)
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    assert found, "the judge was never called"
    stack = found[0]
    start = next(i for i, (rel, fn) in enumerate(stack) if rel == "parity/front/cli.py")
    return stack[start:]


def test_the_options_of_check_reach_the_judge_through_few_files_and_only_down(tmp_path, capsys):
    stack = _stack_at_the_judge(["check", "--device", "cpu", "--lowering", "context", "--max-examples", "2",
                                 "--no-hardening", "--no-isolate", "--quiet", "--report", str(tmp_path / "r")])
    assert stack[0][0] == "parity/front/cli.py" and stack[-1] == JUDGE, stack
    assert not path_problems(stack), path_problems(stack)


def test_a_long_path_and_a_climb_are_caught():
    long = [(f"parity/engine/m{i}.py", "f") for i in range(13)]
    assert path_problems(long) == [f"13 files (at most 12): {' > '.join(r for r, _ in long)}"]
    climb = [("parity/front/cli.py", "main"), ("parity/engine/sweep.py", "check"),
             ("parity/exec/isolation.py", "run"), ("parity/engine/judge.py", "compare")]
    assert path_problems(climb) == ["back up a layer: parity/engine/sweep.py (parity.engine) > "
                                    "parity/exec/isolation.py (parity.exec)"]
    assert path_problems(climb[:2] + climb[3:]) == []
