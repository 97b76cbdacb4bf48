"""The package reads as the pipeline: each module in its stage's folder, imports only downwards."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "quantverdict"
SHARED = {"__init__", "__main__", "cache", "capabilities", "cpuid", "documents", "driver", "errors", "freed_memory",
          "gpu_slot", "hashing", "heartbeat", "memo", "registry", "resources", "scratch"}
# Stages from the bottom up; a module may import its own stage and the ones below it only.
LAYERS = {"shared": 0, "models": 1, "export": 2, "precision": 3, "backends": 4, "judge": 5, "tune": 6,
          "perf": 7, "generate": 7, "report": 8, "run": 9}


def _stage(module: str) -> str:
    if module == "quantverdict.__main__":  # the entry point is the CLI's
        return "run"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "shared"


def _modules() -> dict[str, Path]:
    return {".".join(("quantverdict", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): path
            for path in PACKAGE.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("quantverdict.")}


def test_every_module_lives_in_a_stage_folder_or_is_shared():
    loose = [p.stem for p in PACKAGE.glob("*.py") if p.stem not in SHARED]
    assert not loose, f"modules at the top of quantverdict/ that belong in a stage folder: {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))}  # code; defaults/ is data
    assert folders <= set(LAYERS), f"folders with no place in the layering: {folders - set(LAYERS)}"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_imports_go_only_downwards(module):
    own = LAYERS[_stage(module)]
    upward = sorted(name for name in _imports(_modules()[module])
                    if name in _modules() and LAYERS[_stage(name)] > own)
    assert not upward, f"{module} ({_stage(module)}) imports from higher stages: {upward}"


@pytest.mark.parametrize("stage", ["precision", "models", "report"])
def test_no_backend_imports_below_the_backends(stage):
    offenders = {m: sorted(n for n in _imports(p) if n.startswith("quantverdict.backends"))
                 for m, p in _modules().items() if _stage(m) == stage}
    assert not any(offenders.values()), {m: n for m, n in offenders.items() if n}


def test_importing_the_recipes_loads_neither_torch_nor_onnxruntime():
    code = "import sys, quantverdict.precision; print(sorted({'torch', 'onnxruntime'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_no_module_imports_itself_back_through_others():
    """No import cycle, counting imports under TYPE_CHECKING and inside functions too: the stage order is
    what a reader sees."""
    graph = {module: {name for name in _imports(path) if name in _modules()} - {module}
             for module, path in _modules().items()}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> list[str] | None:
        state[module] = "open"
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                return [*trail, module, other]
            if other not in state and (cycle := visit(other, [*trail, module])):
                return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            assert (cycle := visit(module, [])) is None, " → ".join(cycle)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_module_holds_more_than_300_lines(module):
    assert len(_modules()[module].read_text().splitlines()) <= 300


def test_importing_the_plugin_loads_nothing_heavy():
    """pytest loads the plugin in every run of an environment where the package is installed."""
    code = ("import sys, quantverdict.run.pytest_plugin; "
            "print(sorted({'numpy', 'onnx', 'torch', 'yaml', 'pydantic', 'onnxruntime'} & set(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
