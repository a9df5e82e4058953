#!/usr/bin/env python3
"""Regenerates the committed Python stubs of the wire contract.

Owns the mapping from `proto/funke/v1/*.proto` to the generated `*_pb2.py`, `*_pb2.pyi` and
`*_pb2_grpc.py` next to them. The include root is `proto/`, so a file's virtual path is
`funke/v1/<name>.proto` and generated imports read `from funke.v1 import jobgraph_pb2`, which is
where pyproject.toml installs that directory.

    python proto/generate.py           # rewrite the generated files (and drop stale ones)
    python proto/generate.py --check   # exit 1 with a unified diff if the committed files drift

Both modes generate into a temporary directory first; the output depends only on the .proto
files and the grpcio-tools version (which bundles protoc), so a pinned grpcio-tools gives
byte-identical files on every machine.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = PROTO_ROOT / "funke" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    # Sorted so that protoc sees the files in the same order everywhere.
    return sorted(PACKAGE_DIR.glob("*.proto"))


def is_generated(path: Path) -> bool:
    return path.is_file() and path.name.endswith(GENERATED_SUFFIXES)


def generate(out_root: Path) -> dict[str, bytes]:
    """Runs protoc into `out_root`; returns the generated files of our package by file name."""
    protos = proto_files()
    if not protos:
        raise SystemExit(f"no .proto files under {PACKAGE_DIR}")
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        # After our root, so a file of ours can never be shadowed by a bundled one.
        f"--proto_path={well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        # Absolute paths under the first --proto_path: protoc maps them to their virtual
        # path (funke/v1/x.proto), which is what the generated code records and imports.
        *(str(p) for p in protos),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    out_dir = out_root / PACKAGE_DIR.relative_to(PROTO_ROOT)
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir()) if is_generated(p)}


def committed() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(PACKAGE_DIR.iterdir()) if is_generated(p)}


def check(fresh: dict[str, bytes], current: dict[str, bytes]) -> int:
    rel = PACKAGE_DIR.relative_to(PROTO_ROOT.parent)
    problems: list[str] = []
    for name in sorted(fresh.keys() | current.keys()):
        if name not in current:
            problems.append(f"missing: {rel / name}")
        elif name not in fresh:
            problems.append(f"stale (no .proto generates it): {rel / name}")
        elif fresh[name] != current[name]:
            problems.append(f"differs: {rel / name}")
            diff = difflib.unified_diff(
                current[name].decode("utf-8", "replace").splitlines(keepends=True),
                fresh[name].decode("utf-8", "replace").splitlines(keepends=True),
                fromfile=f"a/{rel / name} (committed)",
                tofile=f"b/{rel / name} (generated)",
            )
            sys.stdout.writelines(diff)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(
            f"generated stubs are out of date; run: python {Path('proto') / 'generate.py'}",
            file=sys.stderr,
        )
        return 1
    return 0


def write(fresh: dict[str, bytes], current: dict[str, bytes]) -> None:
    for name, content in fresh.items():
        # Only rewrite what changed, so that mtimes (and editors) are left alone otherwise.
        if current.get(name) != content:
            (PACKAGE_DIR / name).write_bytes(content)
            print(f"wrote {PACKAGE_DIR / name}")
    for name in current.keys() - fresh.keys():
        (PACKAGE_DIR / name).unlink()
        print(f"removed stale {PACKAGE_DIR / name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 with a diff if the committed generated files differ",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="funke-protoc-") as tmp:
        fresh = generate(Path(tmp))
    current = committed()
    if args.check:
        return check(fresh, current)
    write(fresh, current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
