"""`funke conformance` against a live cluster started as a user would: every scenario passes, the
outputs (table, JSON, JUnit) say so, and the cluster is left as it was found."""

from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET

import pytest

from funke.deploy import conformance
from funke.v1 import job_pb2
from tests.integration.conftest import client_of, funke

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def kit_cluster(tmp_path_factory):
    """A cluster of its own: the destructive scenario kills one of its TaskManagers."""
    d = tmp_path_factory.mktemp("kit-cluster")
    funke("cluster", "start", "--dir", str(d), "--taskmanagers", "2", "--slots", "2", timeout=300)
    yield d, (d / "jobmanager.address").read_text().strip()
    funke("cluster", "stop", "--dir", str(d), timeout=120)


def test_every_scenario_passes_on_a_local_cluster(kit_cluster, tmp_path):
    d, address = kit_cluster
    cli = f"{sys.executable} -m funke.deploy.cli cluster"
    report = tmp_path / "conformance.xml"
    # a live cluster is reached as any client reaches one: its address and its client token
    result = funke("conformance", "--jobmanager", address, "--token-file", str(d / "security" / "client.token"), "--json", "--junit", str(report), "--destructive",
                   "--kill-command", f"{cli} kill --dir {d} {{taskmanager}}",
                   "--restore-command", f"{cli} add-taskmanager --dir {d} {{taskmanager}}", timeout=1200, check=False)
    outcome = json.loads(result.stdout)
    failed = [(s["name"], s["problems"]) for s in outcome["scenarios"] if not s["passed"]]
    assert result.returncode == 0 and not failed, failed
    assert [s["name"] for s in outcome["scenarios"]] == [s.name for s in conformance.SCENARIOS]
    observed = {s["name"]: s["observed"] for s in outcome["scenarios"]}
    assert observed["finishes"] == "CREATED -> RUNNING -> FINISHED"
    assert observed["cancel-running"] == "CREATED -> RUNNING -> CANCELLING -> CANCELED"
    assert observed["full-failover"].startswith("CREATED -> RUNNING -> FAILING -> RESTARTING -> CREATED -> RUNNING")
    assert observed["graceful-stop"] == "CREATED -> RUNNING -> FINISHED"
    suite = ET.parse(report).getroot()
    assert suite.get("tests") == str(len(conformance.SCENARIOS)) and suite.get("failures") == "0"
    with client_of(d, address) as client:
        overview = client.cluster_overview()
        # the killed TaskManager is back, and nothing of the kit holds a slot or still runs
        assert sorted(tm.id for tm in overview.task_managers) == ["tm-1", "tm-2"]
        assert overview.slots_free == overview.slots_total
        live = {job_pb2.JOB_STATUS_CREATED, job_pb2.JOB_STATUS_RUNNING, job_pb2.JOB_STATUS_FAILING,
                job_pb2.JOB_STATUS_CANCELLING, job_pb2.JOB_STATUS_RESTARTING}
        assert not [j for j in client.list_jobs() if j.name.startswith("conformance:") and j.status in live]


def test_the_default_run_leaves_the_destructive_scenario_out_and_names_unknown_ones(kit_cluster):
    d, address = kit_cluster
    listed = funke("conformance", "--list").stdout
    assert "taskmanager-lost" in listed and "(--destructive)" in listed
    result = funke("conformance", "--jobmanager", address, "--only", "no-such-scenario", check=False)
    assert result.returncode == 2
    assert "unknown scenario(s): no-such-scenario" in result.stderr and "finishes" in result.stderr
    result = funke("conformance", "--jobmanager", address, "--destructive", check=False)
    assert result.returncode == 2 and "--destructive needs --kill-command" in result.stderr


def test_the_kit_names_the_illegal_transition_of_a_defective_cluster(tmp_path):
    """The mutation check: a JobManager started with a deliberate defect (test only: executions
    skip INITIALIZING, DEPLOYING -> RUNNING) fails the kit, which names entity, from, to, cause."""
    d = tmp_path / "mutant"
    funke("cluster", "start", "--dir", str(d), "--taskmanagers", "1", "--slots", "2",
          "-D", "funke.testing.mutant=skip-initializing", timeout=300)
    try:
        address = (d / "jobmanager.address").read_text().strip()
        result = funke("conformance", "--jobmanager", address, "--only", "finishes", timeout=300, check=False,
                       env=dict(os.environ, FUNKE_CLUSTER_DIR=str(d)))
        assert result.returncode == 1, result.stdout + result.stderr
        # the job's own path is right; what breaks the specification is each task's
        assert re.search(r"^finishes +CREATED -> RUNNING -> FINISHED +CREATED -> RUNNING -> FINISHED +FAIL ",
                         result.stdout, re.M), result.stdout
        problem = re.search(r"finishes: (\S+): DEPLOYING->RUNNING is not in the table \(cause: reported by tm-1\)",
                            result.stdout)
        assert problem and problem.group(1).startswith("source-range["), result.stdout
        assert "0 of 1 scenario(s) passed" in result.stdout
    finally:
        funke("cluster", "stop", "--dir", str(d), timeout=120)
