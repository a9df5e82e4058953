"""How many records each operator of a task's chain received and emitted in one run of the chain
(a bounded task's run, or one micro-batch of a streaming task): Flink's numRecordsIn and
numRecordsOut per operator, and the vertex's, which are its head's records in and its tail's
records out.

Spark runs a whole chain as one plan, so nothing sees records pass from one operator to the
next, and counting them must not cost a Spark job of its own. Each operator's records out are
taken from the first of these that applies (`plan`, a pure function of the chain's kinds):

  PRODUCED  the chain's tail, into an exchange: the rows of its result partitions (the Arrow
            table written in memory, or the count Spark's writer observes anyway);
  WRITTEN   a sink: the records it wrote, which it counts itself (the rows it staged in memory or
            printed, or an observation of Spark's write: `operators.sinks`);
  NEXT      the operator before a sink that writes every record it receives: what that sink wrote;
  SAME      an operator that emits each record it receives and nothing else (map, with_watermark,
            union, noop): its records in;
  AHEAD     an operator followed by such operators, the last of which is counted as PRODUCED or
            NEXT: what that last one emitted (they all passed the same records on);
  PROJECTED a select: its records in when Spark's plan of it is a projection (one row out per row
            in: no generator such as explode, no aggregate), looked up once for a streaming
            task; otherwise as the next rule says;
  SOURCE    a stream source: its batch's count (`InputMeter`: the rate source's range, the lines a
            receiver stored, the entries read from Redis, or the rows a file source's observation
            counted as the batch read them);
  FILES     a bounded Parquet or Delta source whose records a where filters next: the rows of its
            files, from their footers. An observation between the two would keep Spark from
            pushing the where's filter into the scan (no partitions pruned, no row groups
            skipped); a CSV, JSON or text source followed by a where is NONE for the same reason;
  OBSERVED  otherwise, an observation on its output (`DataFrame.observe` of count(1), filled by
            the chain's own action: `operators.classic.observe_rows`);
  NONE      not measured.

A source's records in are the records it read, i.e. its records out (Flink shows 0 records in for
a source; what it read is the useful number, and makes a source vertex's records in mean
something). A head that reads result partitions received their rows: a streaming task counts
them as it reads them (an Arrow table's num_rows, other files' footers), a bounded task from the
footers once it finished (`iometrics`). Every other operator received what the one before it
emitted; a sink that writes every record it receives received what it wrote.

An observation is only placed, and read, when the chain's action runs every record: its outputs
are written, or its sink writes every record it receives. A chain ending in a streaming query's
print (the first rows of each batch), foreach_batch (what runs is the user's function's) or
noop (nothing runs) keeps only the counts known without one; the rest are NONE. So are the
operators before a transform: the user's function may leave its input out of what it returns,
and an observation no action runs is never filled.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence

from pyspark.sql import DataFrame

from funke.common.graph.executiongraph import OperatorIo
from funke.common.graph.operators import CATALOGUE, OperatorRole
from funke.taskmanager import iometrics
from funke.taskmanager.operators.classic import RowsObserved, is_projection, observe_rows
from funke.taskmanager.operators.context import RuntimeContext

__all__ = ["ChainCounter", "Count", "every_record_runs", "observable", "plan", "writes_every_record"]

log = logging.getLogger(__name__)


class Count(enum.Enum):
    """How an operator's records out are known once a run of its chain ended (see the module)."""

    PRODUCED = "produced"
    WRITTEN = "written"
    NEXT = "next"
    SAME = "same"
    AHEAD = "ahead"
    PROJECTED = "projected"
    SOURCE = "source"
    FILES = "files"
    OBSERVED = "observed"
    NONE = "none"


# Operators that emit each record they receive, and nothing else.
SAME_KINDS = frozenset({"map", "watermark", "union", "noop"})
# Sinks that write every record they receive (a bounded job's print too: it prints them all).
_WRITE_EVERY_RECORD = frozenset({"sink.parquet", "sink.csv", "sink.json", "sink.text", "sink.collect", "sink.delta",
                                 "sink.discard", "sink.redis", "sink.kafka"})
# Bounded sources reading files, whose scan Spark gives a following where's filter; of those, the
# ones whose files tell their rows.
_FILE_SOURCES = frozenset({"source.parquet", "source.delta", "source.csv", "source.json", "source.text"})
_FILES_COUNTED = frozenset({"source.parquet", "source.delta"})


def writes_every_record(kind: str, streaming: bool) -> bool:
    return kind in _WRITE_EVERY_RECORD or (kind == "sink.print" and not streaming)


def _role(kind: str) -> OperatorRole:
    return CATALOGUE[kind].role


def every_record_runs(kinds: Sequence[str], *, streaming: bool, has_outputs: bool) -> bool:
    """Whether the action a run of this chain ends with runs every record of every operator:
    its outputs are written, or its sink writes every record it receives."""
    if kinds and _role(kinds[-1]) is OperatorRole.SINK:
        return writes_every_record(kinds[-1], streaming)
    return has_outputs


def plan(kinds: Sequence[str], *, streaming: bool, has_outputs: bool) -> tuple[Count, ...]:
    """How each operator's records out are known after a run of a chain of these kinds (a
    streaming task's batch, or a bounded task), the chain writing result partitions or not."""
    last = len(kinds) - 1
    out: list[Count | None] = []
    for i, kind in enumerate(kinds):
        role = _role(kind)
        after = kinds[i + 1] if i < last else None
        how: Count | None = None
        if role is OperatorRole.SINK:
            how = Count.WRITTEN
        elif i == last:
            how = Count.PRODUCED if has_outputs else Count.NONE
        elif after is not None and _role(after) is OperatorRole.SINK and writes_every_record(after, streaming):
            how = Count.NEXT
        elif kind in SAME_KINDS:
            how = Count.SAME
        elif role is OperatorRole.SOURCE and streaming:
            how = Count.SOURCE
        elif role is OperatorRole.SOURCE and kind in _FILE_SOURCES and after == "where":
            how = Count.FILES if kind in _FILES_COUNTED else Count.NONE
        out.append(how)
    runs = every_record_runs(kinds, streaming=streaming, has_outputs=has_outputs)
    for i, how in enumerate(out):
        if how is not None:
            continue
        if _ahead(kinds, out, i) is not None:
            out[i] = Count.AHEAD
        elif kinds[i] == "select":
            out[i] = Count.PROJECTED
        else:
            out[i] = Count.OBSERVED if observable(kinds, i, runs) else Count.NONE
    return tuple(how for how in out if how is not None)


def observable(kinds: Sequence[str], index: int, runs: bool) -> bool:
    """Whether an observation of operator `index`'s output is filled once a run of the chain
    ended: the run's action runs every record (`runs`), and no transform comes after it (its
    function may leave its input out of what it returns)."""
    return runs and "transform" not in kinds[index + 1:]


def _ahead(kinds: Sequence[str], plan: Sequence[Count | None], index: int) -> int | None:
    """The operator after `index` whose records out are `index`'s (AHEAD): past operators that
    pass every record on, the first of them counted on its own (PRODUCED, NEXT); None: none."""
    for j in range(index + 1, len(kinds)):
        if kinds[j] not in SAME_KINDS:
            return None
        if plan[j] in (Count.PRODUCED, Count.NEXT):
            return j
    return None


class ChainCounter:
    """Counts one run of one chain: the task makes one per run, hands it each operator's output
    as the chain is built (`emitted`), and once the chain's action ended asks for the counts
    (`operators`) with what it knows itself: the rows its head read from result partitions, and
    the rows its tail wrote into them."""

    def __init__(self, ctx: RuntimeContext, kinds: Sequence[str], has_outputs: bool) -> None:
        self.ctx = ctx
        self.kinds = tuple(kinds)
        self.streaming = ctx.batch is not None
        self.plan = list(plan(self.kinds, streaming=self.streaming, has_outputs=has_outputs))
        self.every_record_runs = every_record_runs(self.kinds, streaming=self.streaming, has_outputs=has_outputs)
        self._observed: dict[int, RowsObserved] = {}
        self._files: dict[int, DataFrame] = {}
        self._previous: DataFrame | None = None  # the latest operator's output

    def reads(self, inputs: Sequence[DataFrame]) -> None:
        """What the chain's head reads (a select at the head of a chain with one input is a
        projection of that input, or not)."""
        self._previous = inputs[0] if len(inputs) == 1 else None

    def emitted(self, index: int, df: DataFrame) -> DataFrame:
        """Operator `index`'s output, as the chain goes on with it: observed when that is how
        its records are counted."""
        how = self.plan[index]
        if how is Count.PROJECTED:  # decided now that Spark has planned it
            if self._previous is not None and self._projection(index, df, self._previous):
                how = self.plan[index] = Count.SAME
            else:
                how = self.plan[index] = (Count.OBSERVED if observable(self.kinds, index, self.every_record_runs)
                                          else Count.NONE)
        if how is Count.OBSERVED:
            df, self._observed[index] = observe_rows(self.ctx, df)
        elif how is Count.FILES:
            self._files[index] = df
        self._previous = df
        return df

    def _projection(self, index: int, df: DataFrame, of: DataFrame) -> bool:
        """Whether operator `index`'s output is a projection of its input `of`, one row per row:
        for a streaming task looked up in its first batch (its operators and input stay the same)."""
        memo = self.ctx.memo
        key = ("projection", self.ctx.vertex_id, index)
        if memo is not None and key in memo:
            return bool(memo[key])
        found = is_projection(df, of)
        if memo is not None:
            memo[key] = found
        return found

    def operators(self, head_in: int | None, produced: int | None) -> tuple[OperatorIo, ...]:
        """Per operator its records in and out, once the chain's action ended (`head_in`: what
        a head that reads result partitions read; `produced`: the rows of the tail's result
        partitions, None without outputs). Blocks on no Spark job: the observations read were
        filled by the action that ended."""
        written = self.ctx.written
        sink_rows: int | None = None
        if written is not None:
            sink_rows = written.rows if written.observed is None else written.observed.rows()
        counts: list[OperatorIo] = []
        previous: int | None = head_in
        for i, (kind, how) in enumerate(zip(self.kinds, self.plan)):
            role = _role(kind)
            received = previous
            if how is Count.SAME:
                emitted = received
            elif how in (Count.NEXT, Count.WRITTEN):
                emitted = sink_rows
            elif how is Count.AHEAD:
                ahead = _ahead(self.kinds, self.plan, i)
                emitted = produced if ahead is not None and self.plan[ahead] is Count.PRODUCED else sink_rows
            elif how is Count.PRODUCED:
                emitted = produced
            elif how is Count.SOURCE:
                emitted = self._source_rows()
            elif how is Count.FILES:
                emitted = self._file_rows(self._files[i])
            elif how is Count.OBSERVED:
                emitted = self._observed[i].rows()
            else:
                emitted = None
            if role is OperatorRole.SOURCE:
                received = emitted  # the records it read
            elif role is OperatorRole.SINK and received is None and writes_every_record(kind, self.streaming):
                received = emitted
            counts.append(OperatorIo(received, emitted))
            previous = emitted
        return tuple(counts)

    def _source_rows(self) -> int | None:
        """A stream source's count: its rows known before running, and those its observations
        counted (read only when they were filled: every record ran)."""
        meter = self.ctx.meter
        if meter is None or (meter.observed and not observable(self.kinds, 0, self.every_record_runs)):
            return None
        return meter.counted_rows()

    def _file_rows(self, df: DataFrame) -> int | None:
        try:
            files = df.inputFiles()
        except Exception as exc:  # not a file scan after all: not worth failing a task that ran
            log.debug("could not list the files of %s: %s", self.kinds[0], exc)
            return None
        return iometrics.file_rows(files)
