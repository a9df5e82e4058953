"""A job's story across leaders: what the store keeps of each run, and the next run it gives."""

from __future__ import annotations

from funke.common.graph.executiongraph import LeaderTransition
from funke.common.states import JobStatus, Transition
from funke.jobmanager.highavailability import (
    ATTEMPT_STRIDE,
    next_incarnation,
    read_story,
    run_record,
    transition_record,
)

J = JobStatus


def lt(a: JobStatus, b: JobStatus, at: float, epoch: int, jm: str = "h:1", cause: str = "") -> LeaderTransition:
    return LeaderTransition(Transition(a, b, at, cause, f"jm:{at}"), epoch, jm)


def test_transitions_and_runs_survive_the_store_unchanged():
    records = [transition_record(lt(J.CREATED, J.RUNNING, 10.0, 1)), run_record(2, "h:2", 1000, 20.0),
               transition_record(lt(J.CREATED, J.RUNNING, 21.0, 2, "h:2"))]
    story = read_story(records)
    assert [h.transition for h in story.transitions] == [Transition(J.CREATED, J.RUNNING, 10.0, "", "jm:10.0"),
                                                         Transition(J.CREATED, J.RUNNING, 21.0, "", "jm:21.0")]
    assert [h.leader_epoch for h in story.transitions] == [1, 2]
    assert story.runs == [run_record(2, "h:2", 1000, 20.0)]


def test_unreadable_records_are_skipped_not_fatal():
    story = read_story([{"from": "CREATED", "to": "NOT_A_STATE", "at": 1}, {"run_started": "x"}, {"junk": 1},
                        transition_record(lt(J.CREATED, J.RUNNING, 1.0, 1))])
    assert len(story.transitions) == 1 and story.runs == []


def test_a_run_whose_leader_died_is_suspended_on_that_leader_and_the_next_starts_attempts_higher():
    story = read_story([transition_record(lt(J.CREATED, J.RUNNING, 10.0, 1, "h:1"))])
    incarnation, run = next_incarnation(story, 2, "h:2", 30.0, None)
    assert incarnation.leader_epoch == 2 and incarnation.job_manager == "h:2"
    assert incarnation.first_attempt_number == ATTEMPT_STRIDE and run["attempt_base"] == ATTEMPT_STRIDE
    assert incarnation.created_at == 10.0
    last = incarnation.earlier_history[-1]
    assert (last.transition.from_state, last.transition.to_state, last.leader_epoch) == (J.RUNNING, J.SUSPENDED, 1)
    assert "h:1 (epoch 1) lost leadership; recovered by h:2 (epoch 2)" in last.transition.cause
    # A second recovery starts higher again, and a run that was SUSPENDED gracefully is not
    # suspended a second time.
    graceful = read_story([run, *[transition_record(h) for h in incarnation.earlier_history],
                           transition_record(lt(J.CREATED, J.RUNNING, 31.0, 2, "h:2")),
                           transition_record(lt(J.RUNNING, J.SUSPENDED, 40.0, 2, "h:2", "JobManager shut down"))])
    again, _ = next_incarnation(graceful, 3, "h:3", 50.0, None)
    assert again.first_attempt_number == 2 * ATTEMPT_STRIDE
    assert [h.transition.to_state for h in again.earlier_history] == [J.RUNNING, J.SUSPENDED, J.RUNNING, J.SUSPENDED]


def test_only_finished_subtasks_whose_output_is_still_there_are_taken_over(tmp_path):
    import dataclasses
    import os

    from funke.common import layout
    from funke.common.graph.jobgraph import ResultPartitionType
    from funke.common.scheduling.scheduler import FinishedSubtask
    from funke.jobmanager.highavailability import outputs_still_there, progress_record, read_progress
    from tests.conformance.graphs import seed_example_job

    job = dataclasses.replace(seed_example_job(ResultPartitionType.BLOCKING), job_id="job-1")
    data_set = next(d.id for d in job.data_sets if d.producer == "source")
    kept = FinishedSubtask("source", 0, 3, ((data_set, 0, "{}"),))
    gone = FinishedSubtask("source", 1, 0, ((data_set, 1, "{}"),))
    strangers = [FinishedSubtask("nope", 0, 0, ()), FinishedSubtask("source", 99, 0, ())]
    os.makedirs(layout.partition_dir(str(tmp_path), "job-1", data_set, 0, 3))
    records = [progress_record(f) for f in [kept, gone, *strangers]] + [{"vertex": "x"}]
    finished = read_progress(records)  # the unreadable record is skipped
    assert finished == [kept, gone, *strangers]
    assert outputs_still_there(str(tmp_path), job, finished) == [kept]
