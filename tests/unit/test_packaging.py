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
    for folder, name in roots.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            found.add(".".join([name, *relative.parts]))
    missing = sorted(found - set(setuptools["packages"]))
    assert not missing, f"packages missing from pyproject.toml: {missing}"
