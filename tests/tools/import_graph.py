"""The import graph of one or more of funke's packages, as text: every module with its line count
and floor, then its arrows (the funke modules it imports, TYPE_CHECKING imports included), inside
the packages asked for and out of them, each arrow marked when it runs up a floor or sideways
between the two process packages.

    python3 tests/tools/import_graph.py taskmanager            # the TaskManager
    python3 tests/tools/import_graph.py taskmanager/operators  # one package inside it
    python3 tests/tools/import_graph.py --summary taskmanager  # counts only

Floors, lowest first: common (pure), runtime, jobmanager | taskmanager, deploy. Run from the
checkout's root; reads the code as text (nothing is imported)."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

FLOORS = {"common": 0, "runtime": 1, "jobmanager": 2, "taskmanager": 2, "deploy": 3, "proto": 0}


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for top in FLOORS:
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else ():
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts).removesuffix(".__init__")] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The funke modules `name` imports (`funke.x.y` and relative imports, as `x.y`)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            target = target.removeprefix("funke.")
            if target in known and target != name:
                out.add(target)
    # "from funke.x import y" names both x and x.y: when y is a module, the arrow is to it
    return {t for t in out if not any(o.startswith(t + ".") for o in out)}


def floor(name: str) -> int:
    return FLOORS.get(name.split(".")[0], 0)


def mark(src: str, dst: str) -> str:
    a, b = src.split(".")[0], dst.split(".")[0]
    if floor(dst) > floor(src):
        return "  UP A FLOOR"
    if floor(dst) == floor(src) == 2 and a != b:
        return "  SIDEWAYS"
    return ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="+", help="folders such as taskmanager or taskmanager/operators")
    parser.add_argument("--summary", action="store_true", help="counts only")
    args = parser.parse_args(argv)
    root = Path.cwd()
    known = modules(root)
    prefixes = [p.strip("/").replace("/", ".").removesuffix(".py") for p in args.packages]
    chosen = [m for m in known if any(m == p or m.startswith(p + ".") for p in prefixes)]
    if not chosen:
        print(f"no funke modules under {', '.join(args.packages)} (run from the checkout's root)", file=sys.stderr)
        return 2
    inside = outside = wrong = 0
    lines_total = 0
    for name in chosen:
        lines = len(known[name].read_text().splitlines())
        lines_total += lines
        deps = sorted(imports_of(name, known[name], known), key=lambda d: (floor(d), d))
        ins = [d for d in deps if d in chosen]
        outs = [d for d in deps if d not in chosen]
        inside, outside = inside + len(ins), outside + len(outs)
        wrong += sum(1 for d in deps if mark(name, d))
        if args.summary:
            continue
        print(f"{name}  ({lines} lines, floor {floor(name)})")
        for d in ins:
            print(f"    -> {d}{mark(name, d)}")
        for d in outs:
            print(f"    => {d}  (floor {floor(d)}){mark(name, d)}")
    print(f"{len(chosen)} modules, {lines_total} lines; arrows: {inside} inside, {outside} out "
          f"(->: inside, =>: out), {wrong} up a floor or sideways")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
