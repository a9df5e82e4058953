"""examples/notebook.ipynb through a real Jupyter kernel, headless, with no cluster anywhere: the
first execute() starts an embedded mini cluster owned by the kernel; a batch job's rows come back
as pandas, a streaming query's batches as they commit, then it is stopped; once the kernel is
gone, so is the mini cluster."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.integration.conftest import REPO, wait_for

pytestmark = pytest.mark.cluster


def outputs(cell, stream: str = "stdout") -> str:
    """A cell's printed text (`stream`) and rich results (a DataFrame's text and HTML)."""
    return "".join(o.get("text", "") if o.get("output_type") == "stream" and o.get("name") == stream else
                   "".join(str(v) for v in o.get("data", {}).values()) if stream == "stdout" else ""
                   for o in cell.outputs)


def test_the_example_notebook_runs_a_job_and_a_streaming_query_on_a_mini_cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("FUNKE_JOBMANAGER", raising=False)
    monkeypatch.setenv("FUNKE_CLUSTER_DIR", str(tmp_path / "no-cluster"))  # the kernel inherits the environment
    before = set(Path(tempfile.gettempdir()).glob("funke-minicluster-*"))
    nb = nbformat.read(REPO / "examples" / "notebook.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]

    expected = [x * x for x in range(1000) if x * x % 3 == 0]
    assert "started an embedded mini cluster" in outputs(code[0], "stderr")
    assert outputs(code[0]).strip() == f"FINISHED {len(expected)} {sum(expected)}"
    batches = re.search(r"batches \[(\d+), (\d+), (\d+)\] rows (\d+)", outputs(code[1]))
    assert batches is not None, outputs(code[1])
    ids = [int(batches.group(i)) for i in (1, 2, 3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert "mod7" in outputs(code[1])  # the last batch shown as a DataFrame
    assert outputs(code[2]).strip() == "FINISHED True"

    # The kernel has shut down: its mini cluster's processes stopped and its directory went.
    made = set(Path(tempfile.gettempdir()).glob("funke-minicluster-*")) - before
    wait_for("the kernel's mini cluster to be removed", lambda: not any(d.exists() for d in made), timeout=60)
    assert not os.environ.get("FUNKE_JOBMANAGER")
