"""`funke conformance` against a live cluster started as a user would: every scenario passes, the
outputs (table, JSON, JUnit) say so, and the cluster is left as it was found."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from funke.deploy import conformance
from tests.integration.conftest import funke

pytestmark = pytest.mark.cluster


def test_every_scenario_passes_on_a_local_cluster(spark_cluster, tmp_path):
    report = tmp_path / "conformance.xml"
    result = spark_cluster.funke("conformance", "--json", "--junit", str(report), timeout=1200, check=False)
    outcome = json.loads(result.stdout)
    failed = [(s["name"], s["problems"]) for s in outcome["scenarios"] if not s["passed"]]
    assert result.returncode == 0 and not failed, failed
    assert [s["name"] for s in outcome["scenarios"]] == [s.name for s in conformance.SCENARIOS]
    observed = {s["name"]: s["observed"] for s in outcome["scenarios"]}
    assert observed["finishes"] == "CREATED -> RUNNING -> FINISHED"
    assert observed["cancel-running"] == "CREATED -> RUNNING -> CANCELLING -> CANCELED"
    assert observed["full-failover"].startswith("CREATED -> RUNNING -> FAILING -> RESTARTING -> CREATED -> RUNNING")
    suite = ET.parse(report).getroot()
    assert suite.get("tests") == str(len(conformance.SCENARIOS)) and suite.get("failures") == "0"
    overview = spark_cluster.client.cluster_overview()
    assert overview.slots_free == overview.slots_total
    from funke.v1 import job_pb2

    live = {job_pb2.JOB_STATUS_CREATED, job_pb2.JOB_STATUS_RUNNING, job_pb2.JOB_STATUS_FAILING,
            job_pb2.JOB_STATUS_CANCELLING, job_pb2.JOB_STATUS_RESTARTING}
    running = [j for j in spark_cluster.client.list_jobs() if j.name.startswith("conformance:") and j.status in live]
    assert not running  # nothing of the kit still runs


def test_an_unknown_scenario_is_a_usage_error(spark_cluster):
    result = spark_cluster.funke("conformance", "--only", "no-such-scenario", check=False)
    assert result.returncode == 2
    assert "unknown scenario(s): no-such-scenario" in result.stderr and "finishes" in result.stderr


def test_the_kit_names_the_illegal_transition_of_a_defective_cluster(tmp_path):
    """The mutation check: a JobManager started with a deliberate defect (test only: executions
    skip INITIALIZING, DEPLOYING -> RUNNING) fails the kit, which names entity, from, to, cause."""
    d = tmp_path / "mutant"
    funke("cluster", "start", "--dir", str(d), "--taskmanagers", "1", "--slots", "2",
          "-D", "funke.testing.mutant=skip-initializing", timeout=300)
    try:
        address = (d / "jobmanager.address").read_text().strip()
        result = funke("conformance", "--jobmanager", address, "--only", "finishes", timeout=300, check=False)
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
