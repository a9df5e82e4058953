"""The Delta stream source's TaskManager side: reads exactly this subtask's data files of a
batch's range (the snapshot at its end version for the query's first batch, else the files its
commits added: `runtime.deltalog.range_files`), with the table's schema."""

from __future__ import annotations

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from funke.common.graph.jobgraph import OperatorSpec
from funke.common.streaming.sources.delta import share
from funke.runtime import deltalog
from funke.taskmanager.operators.context import RuntimeContext, config_value
from funke.taskmanager.operators.delta import read_files
from funke.taskmanager.operators.sources import batch_range


def read(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    _, source_range = batch_range(ctx, spec)
    path = str(config_value(spec, "path"))
    files, schema, partitions = deltalog.range_files(path, source_range)
    mine = share(files, ctx.subtask_index, ctx.parallelism)
    if source_range.end is None:  # the query's first batch found no table: its schema is unknown
        raise ValueError(f"the Delta table {path} does not exist (any more)")
    df = read_files(ctx, deltalog.table_dir(path), mine, schema, partitions)
    if ctx.meter is None or not mine:
        return df
    ctx.meter.bytes += sum(f.size for f in mine)
    rows = Observation()  # counted while the batch's own work reads them
    ctx.meter.observed.append(rows)
    return df.observe(rows, F.count(F.lit(1)).alias("rows"))
