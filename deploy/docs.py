"""Regenerates the README's state diagrams from the transition tables in `funke.common.states`,
so the documentation cannot drift from the code (a conformance test checks it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from funke.common.states import (
    BATCH_PHASE_TRANSITIONS,
    CONNECTION_STATE_TRANSITIONS,
    EXECUTION_STATE_TRANSITIONS,
    JOB_STATUS_TRANSITIONS,
    QUERY_MODE_TRANSITIONS,
    QUERY_STATE_TRANSITIONS,
    render_mermaid,
)

SECTIONS = {
    "job-status-diagram": JOB_STATUS_TRANSITIONS,
    "execution-state-diagram": EXECUTION_STATE_TRANSITIONS,
    "connection-state-diagram": CONNECTION_STATE_TRANSITIONS,
    "query-mode-diagram": QUERY_MODE_TRANSITIONS,
    "query-state-diagram": QUERY_STATE_TRANSITIONS,
    "batch-phase-diagram": BATCH_PHASE_TRANSITIONS,
}


def regenerate(text: str) -> str:
    for name, table in SECTIONS.items():
        block = f"<!-- {name}:begin -->\n```mermaid\n{render_mermaid(table)}\n```\n<!-- {name}:end -->"
        pattern = re.compile(rf"<!-- {name}:begin -->.*?<!-- {name}:end -->", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README has no <!-- {name}:begin/end --> markers")
        text = pattern.sub(lambda _: block, text)
    return text


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else Path("README.md")
    old = path.read_text()
    new = regenerate(old)
    if new != old:
        path.write_text(new)
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
