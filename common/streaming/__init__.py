"""The micro-batch model of a streaming query, below any graph: the coordinator that generates,
logs, runs and commits batches (`microbatch`), the checkpoint's offset and commit logs
(`checkpoint`), what each source offers a batch and which rows a range holds (`sources`: one module per
source plugin and their registry by operator kind),
and the receivers' rate estimate (`backpressure`)."""
