"""The package's shape as docs/architecture.md draws it: floors that import only downward, and
the modules one cell's run goes through."""

import ast
import re
import subprocess
import sys

from conftest import REPO

# docs/architecture.md, bottom up; cli.py and cli_offline.py stand above them all
FLOORS = ["core", "models", "planning", "probes", "serving", "measuring", "analysis", "output", "offline"]

# What a closed-loop cell's bench job (workflow_scripts/bench.py) and its session's daemon
# (python -m speedsplit.serving.daemon) import. What only some cells need is imported where it
# acts: the quality probe (a stack's last job of run 0), the profiler (a profiled cell's run 0),
# traffic (open-loop and trace loads), gguf (llama.cpp's stacks). docs/architecture.md's "The path of one cell" walks through them.
CELL_PATH = {
    "core": ["apikey", "awake", "errors", "facts", "loads", "numbers", "plausible", "procs", "quality",
             "record", "requestlog", "results", "spans", "specs", "trace_split"],
    "models": ["checkpoint", "prompts"],
    "probes": ["loadgen", "loadspec", "slo", "telemetry"],
    "serving": ["caches", "daemon", "lease", "serverlog", "session", "session_state", "stacks"],
    "measuring": ["bench", "checks", "hostspeed"],
}  # fmt: skip


def _imports(path) -> list[tuple[str, int]]:
    """The speedsplit modules a file imports (at its top or inside a function), with lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("speedsplit."):
            out.append((node.module, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module == "speedsplit":
            out += [(f"speedsplit.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("speedsplit.")]
    return out


def test_no_module_imports_from_a_floor_above_its_own():
    upward = []
    for path in sorted((REPO / "speedsplit").glob("*/**/*.py")):
        floor = path.relative_to(REPO / "speedsplit").parts[0]
        assert floor in FLOORS, f"{path}: a floor docs/architecture.md does not draw"
        for module, line in _imports(path):
            theirs = module.split(".")[1]
            if theirs in FLOORS and FLOORS.index(theirs) > FLOORS.index(floor):
                upward.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not upward, upward


def test_one_cell_runs_on_these_modules_alone():
    probe = """
import ast, sys
sys.path.insert(0, "workflow_scripts")
tree = ast.parse(open("workflow_scripts/bench.py").read())
imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
exec(compile(ast.Module(body=imports, type_ignores=[]), "bench.py", "exec"))
import speedsplit.serving.daemon
print(" ".join(sorted(m for m in sys.modules if m.startswith("speedsplit.") and not hasattr(sys.modules[m], "__path__"))))
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    expected = {f"speedsplit.{floor}.{m}" for floor, mods in CELL_PATH.items() for m in mods}
    assert loaded == expected, (
        f"on the cell's path now: {sorted(loaded - expected)}; off it: {sorted(expected - loaded)} "
        "(a new module here is read by whoever follows a cell: say so in docs/architecture.md)"
    )


def _architecture() -> str:
    return (REPO / "docs/architecture.md").read_text()


def test_the_map_names_every_module():
    """A newcomer reads the package from docs/architecture.md's map: a module it leaves out is
    one they cannot place."""
    drawn = _architecture().split("```")[1]
    modules = [p for p in (REPO / "speedsplit").rglob("*.py") if p.name != "__init__.py"]
    missing = [str(p.relative_to(REPO)) for p in modules if not re.search(rf"\b{p.stem}\b", drawn)]
    assert not missing, f"not on docs/architecture.md's map: {missing}"


def test_the_path_of_one_cell_names_every_module_it_runs_on():
    path = _architecture().split("## The path of one cell")[1]
    missing = [f"{f}/{m}" for f, mods in CELL_PATH.items() for m in mods if not re.search(rf"\b{f}/{m}\b", path)]
    assert not missing, f"on the cell's path, not named in docs/architecture.md's walk through it: {missing}"
