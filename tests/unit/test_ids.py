"""The one rule for ids, and the layout that applies it to every path it builds."""

from __future__ import annotations

import pytest

from funke.common import ids, layout

HOSTILE = ["..", ".", "../..", "a/b", "a\\b", "/abs", "a\x00b", "new\nline", "tab\tbed", " lead", "-opt",
           ".hidden", "", "x" * 201, "ünïcode", "a b", "a#b", "a?b", "a:b"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_path_ids_are_refused(value):
    assert ids.path_id_problem(value, "vertex id") is not None
    assert not ids.is_path_id(value)
    with pytest.raises(ValueError):
        ids.require_path_id(value, "vertex id")


@pytest.mark.parametrize("value", ["a", "source-text", "src.out0", "9cf2692f", "A_b-c.d", "x" * 200])
def test_plain_path_ids_are_accepted(value):
    assert ids.path_id_problem(value, "vertex id") is None


def test_job_ids_are_at_most_64_characters():
    assert ids.job_id_problem("j" * 64) is None
    assert "longer than 64" in ids.job_id_problem("j" * 65)


def test_labels_take_printable_text_but_no_control_characters():
    assert ids.label_problem("map->sink#1", "edge id") is None
    assert ids.label_problem("slot group (a)", "group") is None
    for bad in ["a\nb", "a\x00", "\t", " padded ", "", "x" * 301, "right\u202eto left", "zero\u200bwidth",
                "line\u2028sep"]:
        assert ids.label_problem(bad, "edge id") is not None, bad
    for fine in ["Umsatz\u00a02024", "\u5e74\u3000\u5ea6", "\U0001f600 party"]:  # spaces of other scripts
        assert ids.label_problem(fine, "group") is None, fine
    assert "must be a string" in ids.label_problem(7, "edge id")


def test_echo_quotes_a_short_form_of_what_the_client_sent():
    huge = "x" * (1 << 20)
    shown = ids.echo(huge)
    assert len(shown) < 120 and "1,048,576 characters" in shown
    assert ids.echo("ok") == "'ok'"
    assert "longer than" in ids.path_id_problem(huge, "job id") and len(ids.path_id_problem(huge, "job id")) < 200


@pytest.mark.parametrize("job_id", ["..", "../..", "a/../..", "", "/", "x\x00"])
def test_layout_refuses_ids_that_are_not_one_plain_path_component(tmp_path, job_id):
    data = str(tmp_path / "data")
    for build in (lambda: layout.job_dir(data, job_id),
                  lambda: layout.partition_dir(data, job_id, "d", 0, 0),
                  lambda: layout.collect_dir(data, job_id, "v"),
                  lambda: layout.staging_root("/out/x", job_id)):
        with pytest.raises(ValueError):
            build()
    with pytest.raises(ValueError):
        layout.partition_dir(data, "job", job_id or "..", 0, 0)
    with pytest.raises(ValueError):
        layout.collect_dir(data, "job", job_id or "..")


def test_layout_refuses_negative_indexes_and_sink_targets_without_a_name():
    with pytest.raises(ValueError):
        layout.partition_dir("/d", "job", "ds", -1, 0)
    with pytest.raises(ValueError):
        layout.sink_staging_dir("/out/x", "job", 0, -2)
    for target in ("/", "", "/out/..", "/out/."):
        with pytest.raises(ValueError):
            layout.staging_root(target, "job")


def test_paths_built_from_valid_ids_stay_under_their_root(tmp_path):
    data = str(tmp_path / "data")
    jobs = layout.jobs_dir(data)
    for path in (layout.job_dir(data, "j1"), layout.partition_dir(data, "j1", "src.out0", 3, 2),
                 layout.collect_dir(data, "j1", "sink-collect")):
        assert layout.is_within(jobs, path) and not layout.is_within(path, jobs)


def test_is_within_compares_normalised_paths():
    assert layout.is_within("/data/jobs", "/data/jobs/a")
    assert not layout.is_within("/data/jobs", "/data/jobs/a/../..")
    assert not layout.is_within("/data/jobs", "/data/jobsX")
    assert layout.is_within("hdfs://nn/data", "hdfs://nn/data/jobs/x")
    assert not layout.is_within("hdfs://nn/data", "hdfs://other/data/jobs/x")
    assert layout.is_within("/data", "file:///data/jobs")


def test_a_status_message_is_cut_to_what_grpc_metadata_carries_once_percent_encoded():
    from urllib.parse import quote

    for text in ("\U0001f600" * 10_000, "é" * 50_000, "x" * 100_000, "100%" * 5000):
        cut = ids.status_message(text)
        encoded = quote(cut.encode(), safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
        assert len(encoded) <= ids.MAX_STATUS_MESSAGE_BYTES, (text[:5], len(encoded))
        assert "cut: the whole message has" in cut
    assert ids.status_message("short and plain") == "short and plain"


def test_the_python_api_page_states_the_id_limits_the_code_applies():
    import re
    from pathlib import Path

    from funke.common.api.dsl import UID_MAX_LENGTH

    page = Path(__file__).resolve().parents[2] / "docs" / "api" / "python.md"
    text = " ".join(page.read_text().split())
    stated = re.search(r"artifact names are 1–(\d+) characters \(job ids: (\d+); a `uid` in the DSL: (\d+),"
                       r".*?at most (\d+) characters", text)
    assert stated is not None, "the paragraph on ids of docs/api/python.md is gone"
    assert tuple(map(int, stated.groups())) == (ids.MAX_PATH_ID_LENGTH, ids.MAX_JOB_ID_LENGTH, UID_MAX_LENGTH,
                                                ids.MAX_LABEL_LENGTH)
    assert ids.is_path_id("a" * ids.MAX_PATH_ID_LENGTH) and not ids.is_path_id("a" * (ids.MAX_PATH_ID_LENGTH + 1))
    assert ids.label_problem("g" * ids.MAX_LABEL_LENGTH, "group") is None
    assert ids.label_problem("g" * (ids.MAX_LABEL_LENGTH + 1), "group") is not None


def test_a_restart_strategy_type_is_read_as_flink_reads_it_case_insensitive_and_trimmed():
    from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy, RestartStrategyConfig, \
        restart_strategy_from_config

    for written in ("fixed-delay", "FIXED-DELAY ", " FixedDelay"):
        strategy = restart_strategy_from_config(RestartStrategyConfig(written, {"attempts": 2}))
        assert isinstance(strategy, FixedDelayRestartBackoffTimeStrategy), written
