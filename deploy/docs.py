"""The state machines the documentation draws: each section name a page asks for
(`<!-- generated: diagram:<section> -->`, rendered by `funke.deploy.sitedocs`) and the
transition table of `funke.common.states` it is drawn from, so the documentation cannot drift
from the code (a conformance test checks it)."""

from __future__ import annotations

from funke.common.states import (
    BATCH_PHASE_TRANSITIONS,
    CONNECTION_STATE_TRANSITIONS,
    EXECUTION_STATE_TRANSITIONS,
    JOB_STATUS_TRANSITIONS,
    QUERY_MODE_TRANSITIONS,
    QUERY_STATE_TRANSITIONS,
    RESCALE_STATE_TRANSITIONS,
)

SECTIONS = {
    "job-status-diagram": JOB_STATUS_TRANSITIONS,
    "execution-state-diagram": EXECUTION_STATE_TRANSITIONS,
    "connection-state-diagram": CONNECTION_STATE_TRANSITIONS,
    "query-mode-diagram": QUERY_MODE_TRANSITIONS,
    "query-state-diagram": QUERY_STATE_TRANSITIONS,
    "batch-phase-diagram": BATCH_PHASE_TRANSITIONS,
    "rescale-state-diagram": RESCALE_STATE_TRANSITIONS,
}
