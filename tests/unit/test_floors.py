"""The floors of funke's packages: an import may only go down a floor, never up or sideways.

    deploy/public/ (installed as `funke`)     the public API: funke, funke.state, funke.client
    deploy/                                   CLI, client SDK, launchers
    jobmanager/   |   taskmanager/            the process shells, independent of each other
    runtime/                                  what the processes stand on
    common/                                   the pure core, without gRPC; inside it, lowest first:
        base modules (common/*.py) < streaming/ < graph/ < scheduling/ | task/
        < wire/ | api/ | configuration.py

Every module of the packages is parsed (imports inside functions and under TYPE_CHECKING count
too), so a new import that goes the wrong way fails here with the module and line that made it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Package -> floor. Packages on one floor do not import each other.
PACKAGES = {"common": 0, "runtime": 1, "jobmanager": 2, "taskmanager": 2, "deploy": 3, "public": 4}
# The public API's directory: its modules are `funke` and `funke.<module>`, nothing of funke's
# inside imports them (they stand on everything else).
PUBLIC_DIR = Path("deploy") / "public"
# Inside common/: a unit (a sub-package, or a module of common/ itself) -> floor. Units on one
# floor do not import each other; the base modules of common/ form one unit.
BASE = "common"
COMMON_FLOORS = {
    BASE: 0,
    "streaming": 1,
    "graph": 2,
    "scheduling": 3,
    "task": 3,
    "wire": 4,
    "api": 4,
    "configuration": 4,  # the cluster's options, checked with the rules of every floor below
}
GRPC = ("grpc", "grpc_health", "grpc_reflection")


def modules(root: Path) -> dict[str, Path]:
    """funke.<package>.<...> -> file, for every module of the packages under `root` (the public
    API's modules as `funke` and `funke.<module>`)."""
    found = {}
    for package in PACKAGES:
        if package == "public":
            continue
        for path in sorted((root / package).rglob("*.py")):
            if path.is_relative_to(root / PUBLIC_DIR):
                parts = path.relative_to(root / PUBLIC_DIR).with_suffix("").parts
            else:
                parts = path.relative_to(root).with_suffix("").parts
            found[".".join(("funke",) + parts).removesuffix(".__init__")] = path
    return found


def package_of(module: str, known: dict[str, Path], root: Path) -> str | None:
    """The package (a key of PACKAGES) a funke module belongs to; None for others (funke.v1)."""
    if module == "funke":
        return "public"
    path = known.get(module)
    if path is not None and path.is_relative_to(root / PUBLIC_DIR):
        return "public"
    parts = module.split(".")
    return parts[1] if parts[0] == "funke" and len(parts) > 1 and parts[1] in PACKAGES else None


def imported(tree: ast.AST, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) for every import in `tree`: `from p import m` names module p.m when that
    is a module, else p."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.append((node.lineno, full if full in known else node.module))
    return out


def common_unit(module: str) -> str:
    """The unit of a module of funke.common: its sub-package, or BASE, or configuration."""
    parts = module.split(".")[2:]
    if not parts:
        return BASE
    if len(parts) == 1:
        return "configuration" if parts[0] == "configuration" else BASE
    return parts[0]


def problems(root: Path) -> list[str]:
    known = modules(root)
    found = []
    for module, path in known.items():
        where = path.relative_to(root)
        package = package_of(module, known, root)
        for line, target in imported(ast.parse(path.read_text(), str(path)), known):
            top = target.split(".")[0]
            if package == "common" and top in GRPC:
                found.append(f"{where}:{line} imports {target}: common/ is sans-IO, gRPC belongs to runtime/ and above")
                continue
            other = package_of(target, known, root)
            if other is None:
                continue
            if other != package:
                if PACKAGES[other] >= PACKAGES[package]:
                    side = "sideways" if PACKAGES[other] == PACKAGES[package] else "up a floor"
                    found.append(f"{where}:{line} imports {target}: {package}/ -> {other}/ goes {side}")
                continue
            if package != "common":
                continue
            unit, to = common_unit(module), common_unit(target)
            if unit not in COMMON_FLOORS or to not in COMMON_FLOORS:
                missing = unit if unit not in COMMON_FLOORS else to
                found.append(f"{where}:{line}: common/{missing}/ has no floor in COMMON_FLOORS")
            elif unit != to and COMMON_FLOORS[to] >= COMMON_FLOORS[unit]:
                side = "sideways" if COMMON_FLOORS[to] == COMMON_FLOORS[unit] else "up a floor"
                found.append(f"{where}:{line} imports {target}: common {unit} -> {to} goes {side}")
    return found


def test_no_import_goes_up_a_floor_or_sideways() -> None:
    found = problems(ROOT)
    assert not found, "imports against the floors:\n" + "\n".join(found)


def test_every_subpackage_of_common_has_a_floor() -> None:
    subpackages = {p.parent.name for p in (ROOT / "common").glob("*/__init__.py")}
    assert subpackages and subpackages <= set(COMMON_FLOORS), sorted(subpackages - set(COMMON_FLOORS))


@pytest.mark.parametrize("path, source, expected", [
    ("jobmanager/x.py", "from funke.deploy import cli\n", "jobmanager/ -> deploy/ goes up a floor"),
    ("jobmanager/x.py", "def f():\n    import funke.taskmanager.task\n", "jobmanager/ -> taskmanager/ goes sideways"),
    ("runtime/x.py", "from funke.jobmanager import main\n", "runtime/ -> jobmanager/ goes up a floor"),
    ("common/graph/x.py", "from funke.common.scheduling import scheduler\n", "common graph -> scheduling goes up a floor"),
    ("common/task/x.py", "from funke.common.scheduling.scheduler import Scheduler\n", "common task -> scheduling goes sideways"),
    ("common/ids.py", "from funke.common import configuration\n", "common common -> configuration goes up a floor"),
    ("common/streaming/x.py", "import grpc\n", "imports grpc: common/ is sans-IO"),
    ("common/newfloor/x.py", "from funke.common import ids\n", "common/newfloor/ has no floor"),
    ("deploy/x.py", "from funke import ExecutionEnvironment\n", "deploy/ -> public/ goes up a floor"),
    ("common/api/x.py", "from funke.state import ValueState\n", "common/ -> public/ goes up a floor"),
])
def test_the_check_names_each_kind_of_wrong_import(tmp_path: Path, path: str, source: str, expected: str) -> None:
    for package in PACKAGES:
        if package != "public":
            (tmp_path / package).mkdir()
            (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / PUBLIC_DIR).mkdir()
    (tmp_path / PUBLIC_DIR / "__init__.py").write_text("from funke.common.api import dsl\n")
    (tmp_path / PUBLIC_DIR / "state.py").write_text("from funke.common.api import state\n")
    for name in ("scheduling", "graph", "task", "streaming", "newfloor", "api"):
        (tmp_path / "common" / name).mkdir()
        (tmp_path / "common" / name / "__init__.py").write_text("")
    for name in ("common/ids.py", "common/configuration.py", "common/scheduling/scheduler.py", "deploy/cli.py",
                 "jobmanager/main.py", "taskmanager/task.py"):
        (tmp_path / name).write_text("")
    (tmp_path / path).write_text(source)
    found = problems(tmp_path)
    assert len(found) == 1 and expected in found[0], found
    assert found[0].startswith(f"{path}:")
