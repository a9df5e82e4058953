"""The committed protobuf/gRPC stubs match the .proto files, and `proto/generate.py --check`
actually notices when they do not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATE = ROOT / "proto" / "generate.py"


def run_check(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_committed_stubs_match_the_proto_files() -> None:
    result = run_check(GENERATE)
    assert result.returncode == 0, (
        "generated stubs drifted from proto/funke/v1/*.proto; run `python proto/generate.py`\n"
        f"{result.stderr}\n{result.stdout}"
    )


def test_service_stubs_import() -> None:
    from funke.v1 import cluster_pb2_grpc, jobmanager_pb2_grpc

    assert jobmanager_pb2_grpc.JobManagerStub
    assert cluster_pb2_grpc.TaskExecutorStub
    assert cluster_pb2_grpc.ResourceManagerStub
    assert cluster_pb2_grpc.JobMasterStub


@pytest.mark.parametrize("tamper", ["edit", "delete", "extra"])
def test_check_detects_drift(tmp_path: Path, tamper: str) -> None:
    # generate.py locates everything relative to itself, so a copy of proto/ is a sandbox.
    sandbox = tmp_path / "proto"
    shutil.copytree(ROOT / "proto", sandbox, ignore=shutil.ignore_patterns("__pycache__"))
    v1 = sandbox / "funke" / "v1"
    if tamper == "edit":
        stub = v1 / "jobgraph_pb2.pyi"
        stub.write_text(stub.read_text() + "# hand edit\n")
        expected = "differs: proto/funke/v1/jobgraph_pb2.pyi"
    elif tamper == "delete":
        (v1 / "cluster_pb2_grpc.py").unlink()
        expected = "missing: proto/funke/v1/cluster_pb2_grpc.py"
    else:
        (v1 / "gone_pb2.py").write_text("# from a .proto that no longer exists\n")
        expected = "stale (no .proto generates it): proto/funke/v1/gone_pb2.py"

    result = run_check(sandbox / "generate.py")

    assert result.returncode == 1, result.stderr
    assert expected in result.stderr
    if tamper == "edit":
        assert "+# hand edit" not in result.stdout  # the diff goes committed -> generated
        assert "-# hand edit" in result.stdout
