"""The web dashboard in headless Chromium (Debian's package, driven over the DevTools protocol
by tests/chromium.py) against a live cluster: the login link, the overview, a running job whose
graph, subtask table and timeline fill and whose cancel button cancels it, a finished word count
drawn in FINISHED's colour, a failed job's traceback. Screenshots are saved as test artefacts
(`artifacts_dir("screenshots")`: $FUNKE_TEST_ARTIFACTS/screenshots, else in the temporary
directory)."""

from __future__ import annotations

import json
import time

import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy.jobfile import load_job_file
from tests.chromium import Browser, ChromiumMissing
from tests.integration.conftest import REPO, artifacts_dir, wait_for, wait_for_end

pytestmark = pytest.mark.cluster

SCREENSHOTS = artifacts_dir("screenshots")
WORDCOUNT = REPO / "examples" / "wordcount.py"


@pytest.fixture(scope="module")
def browser(spark_cluster):
    try:
        with Browser() as b:
            url = (spark_cluster.dir / "jobmanager.url").read_text().strip()
            token = (spark_cluster.dir / "security" / "client.token").read_text().strip()
            # the link `funke cluster start` tells users to open: it trades the token for a cookie
            b.open(f"{url}?token={token}")
            b.wait_for("document.body.dataset.route === 'overview' && document.body.dataset.ready === 'true'",
                       timeout=60, what="the overview after logging in by link")
            yield b, url.rstrip("/")
    except ChromiumMissing as exc:
        pytest.fail(str(exc), pytrace=False)


def show(b: Browser, url: str, route: str, expect: str, timeout: float = 60) -> None:
    b.open(f"{url}/#{route}")
    b.wait_for(f"document.body.dataset.route === '{expect}' && document.body.dataset.ready === 'true'",
               timeout=timeout, what=f"the {expect} page at #{route}")


def shot(b: Browser, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    b.screenshot(SCREENSHOTS / f"{name}.png")


def dag(b: Browser) -> dict[str, dict]:
    return b.evaluate("""Object.fromEntries([...document.querySelectorAll('#job-graph-svg g.dag-node')].map(g =>
        [g.dataset.vertexId, {state: g.dataset.state, fill: g.querySelector('rect').getAttribute('fill')}]))""")


def test_the_overview_shows_the_taskmanagers_and_slots(browser, spark_cluster):
    b, url = browser
    show(b, url, "/", "overview")
    rows = "[...document.querySelectorAll('#taskmanager-table tr[data-taskmanager-id]')]"
    # The overview polls: a draw made before the page last loaded its data may lag a poll behind
    # (seen once in a full run on a loaded machine: a table drawn with no TaskManager yet).
    b.wait_for(f"{rows}.length === 2", timeout=30, what="both TaskManagers in the overview's table")
    tms = b.evaluate(f"{rows}.map(r => r.dataset.taskmanagerId).sort()")
    assert tms == ["tm-1", "tm-2"]
    shot(b, "overview")
    assert not [m for m in b.console_messages() if m.startswith(("error", "exception"))]


def test_a_finished_word_count_is_drawn_in_finisheds_colour(browser, spark_cluster):
    b, url = browser
    client = spark_cluster.client
    job_id = client.submit(load_job_file(WORDCOUNT, ["--parallelism", "2"]))
    _, details = wait_for_end(client, job_id)
    show(b, url, f"/jobs/{job_id}", "job")
    colours = b.evaluate("window.funkeDashboard.STATE_COLOURS")
    drawn = wait_for("every vertex FINISHED", lambda: (d := dag(b)) and all(v["state"] == "FINISHED" for v in d.values()) and d)
    assert set(drawn) == {v.id for v in details.vertices}
    assert all(v["fill"] == colours["FINISHED"] for v in drawn.values())
    assert b.evaluate("document.querySelectorAll('#job-graph-svg g.dag-edge').length") == len(details.edges)
    rows = b.evaluate("[...document.querySelectorAll('tr[data-subtask]')].map(r => [r.dataset.subtask, r.dataset.state])")
    assert sorted(rows) == sorted([f"{v.id}/{i}", "FINISHED"] for v in details.vertices for i in range(2))
    bars = b.evaluate("[...document.querySelectorAll('#timeline-svg g.timeline-row')].map(g => g.dataset.attempt)")
    assert len(bars) == 4 and all(b_.count("/") == 2 for b_ in bars)
    assert b.evaluate("document.querySelectorAll('#timeline-svg rect.timeline-seg[data-state=FINISHED]').length") >= 4
    shot(b, "job-finished")
    # the job list has it among the completed jobs
    show(b, url, "/jobs", "jobs")
    assert b.evaluate(f"!!document.querySelector('#completed-jobs-table tr[data-jid=\"{job_id}\"]')")


def test_a_running_job_updates_live_and_its_cancel_button_cancels_it(browser, spark_cluster):
    b, url = browser
    env = ExecutionEnvironment("dashboard waits", parallelism=2)
    env.from_range(0, 4).map(lambda r: (time.sleep(120), r)[1:], schema="id bigint").collect()
    job_id = spark_cluster.client.submit(env.build())
    show(b, url, f"/jobs/{job_id}", "job")
    colours = b.evaluate("window.funkeDashboard.STATE_COLOURS")
    running = wait_for("a vertex drawn RUNNING", lambda: [v for v in dag(b).values() if v["state"] == "RUNNING"],
                       timeout=120)
    assert all(v["fill"] == colours["RUNNING"] for v in running)
    # A vertex is drawn RUNNING while its subtasks still initialize (Flink's aggregate state); its
    # rows say RUNNING once a subtask's TaskManager reports so (a cold one: seconds later).
    b.wait_for("document.querySelectorAll('tr[data-subtask][data-state=RUNNING]').length >= 1", timeout=60,
               what="a subtask row RUNNING")
    assert b.evaluate("document.querySelectorAll('#timeline-svg g.timeline-row').length") >= 2
    before = b.evaluate("window.funkeDashboard.renders")
    b.wait_for(f"window.funkeDashboard.renders > {before}", timeout=30, what="a live redraw while the job runs")
    shot(b, "job-running")
    b.click("#cancel-job")  # confirm() is accepted by the driver
    assert any("cancel" in message.lower() for _, message in b.dialogs())
    wait_for("the job CANCELED", lambda: spark_cluster.client.get_job(job_id).status == 6, timeout=120)
    b.wait_for("document.querySelector('body').innerText.includes('CANCELED')", timeout=30,
               what="the page showing CANCELED")
    drawn = dag(b)
    assert drawn and all(v["state"] in ("CANCELED", "CANCELING", "FINISHED") for v in drawn.values()), drawn
    shot(b, "job-canceled")


def test_a_failed_job_shows_its_traceback(browser, spark_cluster):
    b, url = browser
    env = ExecutionEnvironment("dashboard fails", parallelism=1)

    def reject(row):
        raise ValueError(f"row {row} is rejected by the dashboard test")

    env.from_range(0, 2).map(reject, schema="id bigint").collect()
    job_id = spark_cluster.client.submit(env.build())
    wait_for_end(spark_cluster.client, job_id)
    show(b, url, f"/jobs/{job_id}", "job")
    b.wait_for("document.querySelectorAll('pre.exception').length > 0", timeout=30, what="the exception history")
    text = b.evaluate("[...document.querySelectorAll('pre.exception')].map(p => p.textContent).join('\\n')")
    assert "ValueError" in text and "is rejected by the dashboard test" in text and "Traceback" in text
    colours = b.evaluate("window.funkeDashboard.STATE_COLOURS")
    assert any(v["fill"] == colours["FAILED"] for v in dag(b).values())
    shot(b, "job-failed")
    errors = [m for m in b.console_messages() if m.startswith(("error", "exception"))]
    assert not errors, json.dumps(errors)[:2000]


def test_a_streaming_query_charts_its_batches_and_its_stop_button_stops_it(browser, spark_cluster, tmp_path):
    b, url = browser
    env = ExecutionEnvironment("dashboard stream", parallelism=1)
    env.read_stream.rate(50).select("value").write_parquet(str(tmp_path / "out"))
    env.set_trigger("500 ms").set_checkpoint_location(str(tmp_path / "checkpoint"))
    client = spark_cluster.client
    job_id = client.submit(env.build())
    try:
        wait_for("three batches", lambda: len(client.progress(job_id)) >= 3, timeout=180)
        show(b, url, f"/jobs/{job_id}", "job")
        for chart in ("chart-input-rate", "chart-processing-rate", "chart-batch-duration"):
            b.wait_for(f"(document.querySelector('#{chart} polyline.chart-line')?.getAttribute('points') || '')"
                       ".trim().split(/\\s+/).length >= 2", timeout=30, what=f"{chart} with two points or more")
        shot(b, "job-streaming")
        b.click("#stop-job")
        wait_for("the query FINISHED", lambda: client.get_job(job_id).status == 7, timeout=120)  # JOB_STATUS_FINISHED
    finally:
        if client.get_job(job_id).status not in (6, 7):
            client.cancel(job_id)


def test_a_running_word_counts_keyed_vertex_shows_its_records_and_each_operators(browser, spark_cluster, tmp_path):
    b, url = browser
    client = spark_cluster.client
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    env = ExecutionEnvironment("dashboard running word count", parallelism=2)
    (env.read_stream.text(str(incoming)).flat_map(str.split, schema="word string").key_by("word").count()
        .write_parquet(str(tmp_path / "out")))
    env.set_output_mode("update").set_trigger("200 ms").set_checkpoint_location(str(tmp_path / "checkpoint"))
    job_id = client.submit(env.build())
    try:
        (tmp_path / "words.txt").write_text("a rose is a rose\nis a rose\n")  # 8 words, 3 distinct
        (tmp_path / "words.txt").rename(incoming / "words.txt")
        show(b, url, f"/jobs/{job_id}", "job")
        keyed = wait_for("the keyed vertex in the job", lambda: [v for v in client.get_job(job_id).vertices
                                                                 if v.name == "Count -> Sink: Parquet"], timeout=60)[0]
        cells = (f"['read-records', 'write-records'].map(m => document.querySelector("
                 f"'#vertex-table tr[data-vertex=\"{keyed.id}\"] td[data-metric=' + m + ']')?.dataset.value)")
        b.wait_for(f"JSON.stringify({cells}) === JSON.stringify(['8', '3'])", timeout=180,
                   what="the keyed vertex's records in and out: 8 words in, 3 counts out")
        operators = b.evaluate(f"""[...document.querySelectorAll('#operator-table tr[data-operator^="{keyed.id}/"]')]
            .map(r => [r.dataset.operator, r.dataset.recordsIn, r.dataset.recordsOut])""")
        assert operators == [[f"{keyed.id}/0", "8", "3"], [f"{keyed.id}/1", "3", "3"]]
        shot(b, "job-streaming-records")
    finally:
        client.cancel(job_id)
