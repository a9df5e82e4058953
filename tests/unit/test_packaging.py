"""Every package of the checkout is in pyproject.toml's package list, so an installed funke (a
wheel, not the editable checkout) has every module the processes import."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_installed():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {Path(folder): name for name, folder in setuptools["package-dir"].items()}
    found = set()
    for folder in roots:
        for init in (REPO / folder).rglob("__init__.py"):
            # the innermost mapped folder names it (deploy/public/ is `funke`, not funke.deploy.public)
            root = max((f for f in roots if init.parent.is_relative_to(REPO / f)), key=lambda f: len(f.parts))
            found.add(".".join([roots[root], *init.parent.relative_to(REPO / root).parts]))
    missing = sorted(found - set(setuptools["packages"]))
    assert not missing, f"packages missing from pyproject.toml: {missing}"
