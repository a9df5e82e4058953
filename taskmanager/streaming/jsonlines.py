"""The JSON-lines source's TaskManager side: reads exactly this subtask's files of a batch's
range (`JsonLinesSource.slices_of`: byte ranges of whole lines), one row per non-blank line,
parsed by the operator's schema (Spark's from_json: a malformed line gives nulls)."""

from __future__ import annotations

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from funke.common.graph.jobgraph import OperatorSpec
from funke.common.graph.streamingjob import local_path
from funke.common.streaming.sources.jsonlines import JsonLinesSource
from funke.taskmanager.operators.context import RuntimeContext, parse_schema
from funke.taskmanager.operators.sources import batch_range


def read(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    _, source_range = batch_range(ctx, spec)
    schema = parse_schema(str(spec.config["schema"]), f"{spec.display_name}: config 'schema'")
    directory = local_path(str(spec.config["path"]))
    lines: list[tuple[str]] = []
    read_bytes = 0
    for piece in JsonLinesSource.slices_of(source_range, ctx.subtask_index, ctx.parallelism):
        with open(os.path.join(directory, piece.name), "rb") as f:
            f.seek(piece.begin)
            data = f.read(piece.end - piece.begin)
        if len(data) != piece.end - piece.begin:
            raise ValueError(f"{spec.display_name}: {piece.name} holds {piece.begin + len(data)} bytes, the batch's "
                             f"range ends at {piece.end} (the file was truncated or replaced)")
        read_bytes += len(data)
        lines += [(line,) for line in data.decode("utf-8").split("\n") if line.strip()]
    if ctx.meter is not None:
        ctx.meter.rows += len(lines)
        ctx.meter.bytes += read_bytes
    if not lines:
        return ctx.spark.createDataFrame([], schema)
    raw = ctx.spark.createDataFrame(lines, "value string")
    return raw.select(F.from_json("value", schema).alias("r")).select("r.*")
