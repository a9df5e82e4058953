"""The wheel as a user installs it: built from the checkout, installed with pip into a clean
virtual environment (not the checkout's), then, from a directory outside the checkout, a job
runs on the embedded mini cluster, the dashboard serves its files and the generated stubs are
there."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from tests.integration.conftest import REPO

pytestmark = pytest.mark.cluster

JOB = """
import json, sys, urllib.request
from importlib.metadata import version
import funke.common, funke.v1.jobmanager_pb2
from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy.execution import MiniCluster

env = ExecutionEnvironment("from the wheel", parallelism=2)
env.from_range(10).map(lambda x: x * 3, schema="t bigint").collect()
result = env.execute()
with urllib.request.urlopen(MiniCluster.current().info.dashboard_url, timeout=30) as page:
    dashboard = page.read().decode()
print(json.dumps({"status": result.status, "rows": sorted(r.t for r in result.collect()),
                  "version": version("funke"), "module": funke.common.__path__[0],
                  "stubs": funke.v1.jobmanager_pb2.__file__, "dashboard": "<html" in dashboard.lower()}))
"""


def test_the_wheel_installs_into_a_clean_venv_and_runs_a_job(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FUNKE_JOBMANAGER", "VIRTUAL_ENV")}
    env["FUNKE_CLUSTER_DIR"] = str(tmp_path / "no-cluster")
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(tmp_path / "dist"),
                    str(REPO)], check=True, env=env, timeout=600, capture_output=True)
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
    for installed in (out["module"], out["stubs"]):  # the wheel's, not the checkout's
        assert installed.startswith(str(venv)) and not installed.startswith(str(REPO)), installed
    assert out["dashboard"], "the dashboard's files are in the wheel"
