"""The wheel as a user installs it: built from a copy of the checkout, installed with pip into a
clean virtual environment (not the checkout's), then, from a directory outside the checkout, a
job runs on the embedded mini cluster, the dashboard serves its files and the generated stubs
are there. The checkout is left as it was: setuptools builds in the source tree (build/, the
egg-info), so the build runs in the copy."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.integration.conftest import REPO

pytestmark = pytest.mark.cluster

JOB = """
import json, sys, urllib.parse, urllib.request
from importlib.metadata import version
import funke, funke.common, funke.v1.jobmanager_pb2
from funke import ExecutionEnvironment
from funke.client import JobManagerClient
from funke.state import KeyedProcessFunction
from funke.deploy.execution import MiniCluster

env = ExecutionEnvironment("from the wheel", parallelism=2)
env.from_range(10).map(lambda x: x * 3, schema="t bigint").collect()
result = env.execute()
with urllib.request.urlopen(MiniCluster.current().info.dashboard_url, timeout=30) as page:
    dashboard = page.read().decode()
root = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(MiniCluster.current().info.dashboard_url))
assets = {}
from funke.jobmanager import rest
for name in sorted(rest._STATIC):  # what the installed JobManager serves: app.js, its ES modules, style.css
    with urllib.request.urlopen(f"{root}/web/{name}", timeout=30) as response:
        assets[name] = [response.status, len(response.read()) > 0]
print(json.dumps({"status": result.status, "rows": sorted(r.t for r in result.collect()),
                  "version": version("funke"), "module": funke.common.__path__[0],
                  "stubs": funke.v1.jobmanager_pb2.__file__, "dashboard": "<html" in dashboard.lower(),
                  "assets": assets,
                  "public": funke.__file__, "public_version": funke.__version__}))
"""


# Not copied for the build: git's, the virtual environment, what a build or an editable install
# leaves in a source tree, Python's and the test tools' caches, the docs site and funke's own
# run directory.
LEFT_OUT = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "site",
            ".funke", "out")
CACHES = {"__pycache__", ".pytest_cache", ".hypothesis"}  # written by any test run: not compared


def checkout_listing() -> dict[str, tuple[int, int]]:
    """Every entry of the checkout but git's, the virtual environment's and the caches: a file with
    its size and modification time, a directory by its name (its time changes with a cache made
    inside it)."""
    found = {}
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in CACHES and not (root == str(REPO) and d in (".git", ".venv"))]
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), REPO) + "/"] = (0, 0)
        for name in files:
            st = os.lstat(os.path.join(root, name))
            found[os.path.relpath(os.path.join(root, name), REPO)] = (st.st_size, st.st_mtime_ns)
    return found


def changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    return sorted([f"+ {p}" for p in after.keys() - before.keys()] + [f"- {p}" for p in before.keys() - after.keys()]
                  + [f"~ {p}" for p in before.keys() & after.keys() if before[p] != after[p]])


def test_the_wheel_installs_into_a_clean_venv_and_runs_a_job(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FUNKE_JOBMANAGER", "VIRTUAL_ENV")}
    env["FUNKE_CLUSTER_DIR"] = str(tmp_path / "no-cluster")
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    before = checkout_listing()
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*LEFT_OUT), symlinks=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(tmp_path / "dist"),
                    str(source)], check=True, env=env, timeout=600, capture_output=True)
    assert changes(before, checkout_listing()) == [], "the wheel's build wrote into the checkout"
    (wheel,) = (tmp_path / "dist").glob("funke-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], env=env, timeout=900,
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stdout + install.stderr

    version = subprocess.run([str(venv / "bin" / "funke"), "--version"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert version.stdout.strip() == f"funke {wheel.name.split('-')[1]}", version.stdout + version.stderr

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "job.py").write_text(textwrap.dedent(JOB))
    run = subprocess.run([str(python), "job.py"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    import json

    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["status"] == "FINISHED" and out["rows"] == [x * 3 for x in range(10)]
    assert out["public_version"] == out["version"]
    for installed in (out["module"], out["stubs"], out["public"]):  # the wheel's, not the checkout's
        assert installed.startswith(str(venv)) and not installed.startswith(str(REPO)), installed
    assert out["dashboard"], "the dashboard's files are in the wheel"
    # app.js and the ES modules it imports (every .js of jobmanager/web) are in the wheel, and served
    assert set(out["assets"]) == {p.name for p in (REPO / "jobmanager" / "web").glob("*.js")} | {"style.css"}
    assert all(served == [200, True] for served in out["assets"].values()), out["assets"]
    assert changes(before, checkout_listing()) == [], "the test wrote into the checkout"
