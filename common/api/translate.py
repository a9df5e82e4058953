"""The translation of a job written with the DataStream DSL (`funke.common.api.dsl`) into a
`JobGraph`: which operators chain into one JobVertex, the vertices' ids and names, and how the
JobEdges between chains are wired (Flink's `StreamingJobGraphGenerator`, simplified).

Owns the logical graph the DSL records (one `Transformation` per operator the user called, as
Flink's Transformation; `Exchange` for an explicit partitioning), the options that steer the
translation (Flink's keys, so that a Flink user's configuration means the same here), and
`translate(plan)`. Pure: no I/O, no Spark; the DSL's handles are in environment.py, datastream.py,
streamreader.py and handles.py, its argument checks in arguments.py.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from funke.common.graph.jobgraph import (
    BATCH_SHUFFLE_MODE,
    DEFAULT_SLOT_SHARING_GROUP,
    Artifact,
    DistributionPattern,
    FailoverStrategyKind,
    IntermediateDataSet,
    JobConfiguration,
    JobEdge,
    JobGraph,
    JobType,
    JobVertex,
    OperatorSpec,
    PartitionerKind,
    RestartStrategyConfig,
    ResultPartitionType,
    chain_name,
    result_partition_type,
)
from funke.common.graph.operators import CATALOGUE, ELIDABLE_KINDS, ELIDED_EXCHANGE

__all__ = [
    "BATCH_SHUFFLE_MODE",
    "COMBINERS",
    "OPERATOR_CHAINING",
    "RECEIVERS_GROUP",
    "Chaining",
    "Exchange",
    "ExchangeKind",
    "Plan",
    "Transformation",
    "translate",
]

# Flink's option keys, so that a Flink user's configuration means the same here
# (BATCH_SHUFFLE_MODE, from jobgraph.py, too).
OPERATOR_CHAINING = "pipeline.operator-chaining.enabled"


# Keyed count()/reduce() pre-aggregate in the producer's chain before the exchange (Flink's
# combinable reduce; Spark's partial aggregation). "false" turns it off.
COMBINERS = "funke.combiners.enabled"


# The slot-sharing group of receiver sources (socket_text): slots of their own.
RECEIVERS_GROUP = "receivers"


# --------------------------------------------------------------------------------------------
# The logical graph: one Transformation per operator the user called (Flink's Transformation)
# --------------------------------------------------------------------------------------------


class Chaining(enum.Enum):
    """Flink's ChainingStrategy."""

    ALWAYS = "always"  # chain with predecessor and successor when the rules allow
    HEAD = "head"  # start_new_chain(): never chained to its predecessor
    NEVER = "never"  # disable_chaining(): chained to neither side


class ExchangeKind(enum.Enum):
    FORWARD = "forward"
    HASH = "hash"
    REBALANCE = "rebalance"
    RESCALE = "rescale"
    BROADCAST = "broadcast"


@dataclass(frozen=True, slots=True)
class Exchange:
    """An explicit partitioning between a stream and its next operator (key_by, rebalance, ...);
    a stream without one uses Flink's default: FORWARD when parallelisms match, else REBALANCE."""

    kind: ExchangeKind
    keys: tuple[str, ...] = ()


@dataclass(eq=False, slots=True)
class Transformation:
    """One operator of the logical graph. Mutable on purpose: the per-operator settings
    (`set_parallelism`, `name`, ...) are applied after the operator was created."""

    seq: int  # creation order, which is a topological order: inputs always exist first
    kind: str
    name: str
    config: dict[str, Any]
    function: bytes = b""
    inputs: tuple[tuple[Transformation, Exchange | None], ...] = ()
    parallelism: int | None = None  # None: the environment's default
    max_parallelism: int | None = None
    uid: str | None = None
    slot_sharing_group: str | None = None  # None: inherited from the inputs, as in Flink
    co_location_group: str | None = None
    chaining: Chaining = Chaining.ALWAYS
    id_base: str | None = None  # the kind the user asked for, when a rewrite changed `kind`

    @property
    def arity(self) -> int:
        return CATALOGUE[self.kind].arity


@dataclass(frozen=True, slots=True)
class Plan:
    """What an ExecutionEnvironment holds when it is built: its operators in creation order, the
    sinks, the uids users gave, and the job's configuration. `translate` reads nothing else."""

    name: str
    job_type: JobType
    parallelism: int
    transformations: tuple[Transformation, ...]
    sinks: tuple[Transformation, ...]
    uids: frozenset[str]
    options: Mapping[str, str]
    restart_strategy: RestartStrategyConfig | None
    failover_strategy: FailoverStrategyKind | None
    slot_request_timeout_s: float | None
    artifacts: tuple[Artifact, ...]


# --------------------------------------------------------------------------------------------
# Translation: operators -> chains -> JobVertices, JobEdges and IntermediateDataSets
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Chain:
    operators: list[Transformation] = field(default_factory=list)
    vertex_id: str = ""
    max_parallelism: int | None = None  # the one its operators set, if any

    @property
    def head(self) -> Transformation:
        return self.operators[0]


def _slot_sharing_groups(ordered: list[Transformation]) -> dict[int, str]:
    """Each operator's slot-sharing group: its own, else its inputs' when they agree, else the
    default."""
    group: dict[int, str] = {}
    for t in ordered:  # inputs come first, so their groups are known
        if t.slot_sharing_group is not None:
            group[t.seq] = t.slot_sharing_group
        else:
            # A receiver keeps its slot to itself (as Spark's receivers keep their cores): what
            # follows it does not inherit its group.
            input_groups = {group[i.seq] for i, _ in t.inputs} - {RECEIVERS_GROUP}
            group[t.seq] = input_groups.pop() if len(input_groups) == 1 else DEFAULT_SLOT_SHARING_GROUP
    return group


def _without_single_subtask_exchanges(plan: Plan, ordered: list[Transformation],
                                      consumers: Counter) -> list[Transformation]:
    """Chain each keyed per-batch count()/reduce()/aggregate() whose producer and itself run at
    parallelism 1 to that producer: a HASH exchange from one subtask to one subtask moves every
    record to where it already is, and costs a task, an exchange and a Spark job per batch
    (Spark plans no shuffle for a single partition either). The operator is marked
    (`ELIDED_EXCHANGE`), so that validation keeps its vertex at parallelism 1 and a rescale
    puts the exchange back. Only where the operator could chain were the exchange a forward
    one (same slot-sharing and co-location group, chaining allowed on both, no max parallelism
    of its own); `disable_chaining()` or `start_new_chain()` on it keeps the exchange. Works on
    copies: the plan is unchanged."""
    if plan.options.get(OPERATOR_CHAINING, "true").strip().lower() == "false":
        return ordered
    group = _slot_sharing_groups(ordered)
    replaced: dict[int, Transformation] = {}
    out: list[Transformation] = []
    for original in ordered:
        t = original
        inputs = tuple((replaced.get(i.seq, i), x) for i, x in t.inputs)
        if any(a is not b for (a, _), (b, _) in zip(inputs, t.inputs)):
            t = dataclasses.replace(t, inputs=inputs)
        if t.kind in ELIDABLE_KINDS and len(t.inputs) == 1:
            (producer, exchange), = t.inputs
            if (exchange is not None and exchange.kind is ExchangeKind.HASH
                    and (producer.parallelism or plan.parallelism) == 1 and (t.parallelism or plan.parallelism) == 1
                    and consumers[producer.seq] == 1 and group[producer.seq] == group[t.seq]
                    and producer.co_location_group == t.co_location_group and t.max_parallelism is None
                    and producer.chaining is not Chaining.NEVER and t.chaining is Chaining.ALWAYS):
                t = dataclasses.replace(t, inputs=((producer, None),), config={**t.config, ELIDED_EXCHANGE: True})
        if t is not original:
            replaced[original.seq] = t
        out.append(t)
    return out


def _with_combiners(plan: Plan, ordered: list[Transformation],
                    consumers: Counter) -> tuple[list[Transformation], Counter]:
    """Give each keyed count()/reduce()/aggregate() a combiner: the same operation, chained onto
    the producer, so that the exchange carries one record per key and subtask instead of every
    record (a word count's shuffle shrinks from every word to the distinct words). The count
    behind a combiner sums the partial counts; an aggregate's combiner (`combine`) decides on the
    TaskManager, once the schema is known, which SQL aggregates split (`funke.common.aggregates`).
    Only where the combiner can chain: the producer feeds nothing else and allows chaining.
    Works on copies: the plan is unchanged."""
    enabled = all(plan.options.get(key, "true").strip().lower() != "false" for key in (COMBINERS, OPERATOR_CHAINING))
    if not enabled:
        return ordered, consumers
    replaced: dict[int, Transformation] = {}
    out: list[Transformation] = []
    next_seq = len(plan.transformations)
    for original in ordered:
        t = original
        inputs = tuple((replaced.get(i.seq, i), x) for i, x in t.inputs)
        if any(a is not b for (a, _), (b, _) in zip(inputs, t.inputs)):
            t = dataclasses.replace(t, inputs=inputs)
        if t.kind in ("count", "reduce", "aggregate") and len(t.inputs) == 1:
            (producer, exchange), = t.inputs
            if (exchange is not None and exchange.kind is ExchangeKind.HASH and consumers[producer.seq] == 1
                    and producer.chaining is not Chaining.NEVER):
                kind = "combine" if t.kind == "aggregate" else t.kind
                combiner = Transformation(next_seq, kind, f"Combine ({t.name})", dict(t.config), t.function,
                                           ((producer, None),), parallelism=producer.parallelism,
                                           co_location_group=producer.co_location_group)
                next_seq += 1
                out.append(combiner)
                if t.kind == "count":
                    t = dataclasses.replace(t, kind="aggregate", id_base="count", inputs=((combiner, exchange),), config={
                        "keys": t.config["keys"], "aggregations": ["sum(`count`) as `count`"]})
                else:
                    t = dataclasses.replace(t, inputs=((combiner, exchange),))
        if t is not original:
            replaced[original.seq] = t
        out.append(t)
    return out, Counter(i.seq for t in out for i, _ in t.inputs)


def translate(plan: Plan) -> tuple[JobGraph, dict[int, str]]:
    """The JobGraph (not yet validated) and, per operator `seq`, the id of its vertex."""
    if not plan.sinks:
        raise ValueError(
            f"job {plan.name!r} has no sinks: end a pipeline with write_parquet/write_csv/"
            "write_json/write_text, print(), collect() or discard()"
        )
    # Only what some sink needs: an operator nobody consumes would compute and throw away.
    needed: set[int] = set()
    stack = list(plan.sinks)
    while stack:
        t = stack.pop()
        if t.seq not in needed:
            needed.add(t.seq)
            stack.extend(i for i, _ in t.inputs)
    ordered = [t for t in plan.transformations if t.seq in needed]
    consumers = Counter(i.seq for t in ordered for i, _ in t.inputs)
    ordered = _without_single_subtask_exchanges(plan, ordered, consumers)
    ordered, consumers = _with_combiners(plan, ordered, consumers)

    parallelism = {t.seq: t.parallelism or plan.parallelism for t in ordered}
    group = _slot_sharing_groups(ordered)

    for t in ordered:
        for i, exchange in t.inputs:
            if exchange is not None and exchange.kind is ExchangeKind.FORWARD and parallelism[i.seq] != parallelism[t.seq]:
                raise ValueError(
                    f"forward() cannot connect {i.name!r} (parallelism {parallelism[i.seq]}) to "
                    f"{t.name!r} (parallelism {parallelism[t.seq]}); use rebalance() or rescale() "
                    "to change parallelism"
                )

    chaining_enabled = plan.options.get(OPERATOR_CHAINING, "true").strip().lower() != "false"

    def chainable(t: Transformation) -> bool:
        # Flink's StreamingJobGraphGenerator.isChainable, plus equal co-location groups and
        # compatible max parallelism: a chain has one of each, and a value set on one operator
        # must not be silently dropped. An unset max parallelism goes with any.
        if not chaining_enabled or len(t.inputs) != 1 or t.arity != 1:
            return False
        (p, exchange), = t.inputs
        chain_max = chain_of[p.seq].max_parallelism
        return (
            consumers[p.seq] == 1
            and (exchange is None or exchange.kind is ExchangeKind.FORWARD)
            and parallelism[p.seq] == parallelism[t.seq]
            and group[p.seq] == group[t.seq]
            and p.co_location_group == t.co_location_group
            and (t.max_parallelism is None or chain_max is None or t.max_parallelism == chain_max)
            and p.chaining is not Chaining.NEVER
            and t.chaining is Chaining.ALWAYS
        )

    chains: list[_Chain] = []
    chain_of: dict[int, _Chain] = {}
    for t in ordered:
        if chainable(t):
            # The predecessor has no other consumer, so it is the tail of its chain.
            chain = chain_of[t.inputs[0][0].seq]
        else:
            chain = _Chain()
            chains.append(chain)
        chain.operators.append(t)
        chain.max_parallelism = chain.max_parallelism or t.max_parallelism
        chain_of[t.seq] = chain

    # uids first, so that no generated id takes one; generated ids come from the head's kind.
    taken = set(plan.uids)
    for chain in chains:
        if chain.head.uid is not None:
            chain.vertex_id = chain.head.uid
            continue
        base = (chain.head.id_base or chain.head.kind).replace(".", "-").replace("_", "-")
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            candidate = f"{base}-{n}"
        taken.add(candidate)
        chain.vertex_id = candidate

    partition_type = _result_partition_type(plan)
    vertices: list[JobVertex] = []
    data_sets: list[IntermediateDataSet] = []
    edges: list[JobEdge] = []
    produced: Counter[str] = Counter()
    edge_ids: set[str] = set()
    for chain in chains:
        head = chain.head
        vertices.append(JobVertex(
            id=chain.vertex_id,
            name=chain_name([t.name for t in chain.operators]),
            parallelism=parallelism[head.seq],
            operators=tuple(
                OperatorSpec(t.kind, t.name, copy.deepcopy(t.config), t.function) for t in chain.operators
            ),
            max_parallelism=chain.max_parallelism,
            slot_sharing_group=group[head.seq],
            co_location_group=head.co_location_group,
        ))
        for index, (p, exchange) in enumerate(head.inputs):
            producer = chain_of[p.seq].vertex_id
            data_set_id = f"{producer}.out{produced[producer]}"
            produced[producer] += 1
            data_sets.append(IntermediateDataSet(data_set_id, producer))
            pattern, partitioner, keys = _wiring(exchange, parallelism[p.seq] == parallelism[head.seq])
            edge_id = f"{producer}->{chain.vertex_id}"
            if edge_id in edge_ids:  # the same stream feeds one operator twice (self-join/union)
                edge_id = f"{edge_id}#{index}"
            edge_ids.add(edge_id)
            edges.append(JobEdge(
                id=edge_id,
                data_set=data_set_id,
                consumer=chain.vertex_id,
                distribution_pattern=pattern,
                partitioner=partitioner,
                partition_keys=keys,
                result_partition_type=partition_type,
                input_index=index,
            ))

    job = JobGraph(
        name=plan.name,
        vertices=tuple(vertices),
        data_sets=tuple(data_sets),
        edges=tuple(edges),
        job_type=plan.job_type,
        configuration=JobConfiguration(
            restart_strategy=plan.restart_strategy,
            failover_strategy=plan.failover_strategy,
            slot_request_timeout_s=plan.slot_request_timeout_s,
            options=dict(plan.options),
        ),
        artifacts=tuple(plan.artifacts),
    )
    return job, {seq: chain.vertex_id for seq, chain in chain_of.items()}


def _wiring(exchange: Exchange | None, same_parallelism: bool
            ) -> tuple[DistributionPattern, PartitionerKind, tuple[str, ...]]:
    if exchange is None:
        # Flink's default partitioner: forward when it can, rebalance when parallelism changes.
        if same_parallelism:
            return DistributionPattern.POINTWISE, PartitionerKind.FORWARD, ()
        return DistributionPattern.ALL_TO_ALL, PartitionerKind.REBALANCE, ()
    return _EXCHANGE_WIRING[exchange.kind][0], _EXCHANGE_WIRING[exchange.kind][1], exchange.keys


_EXCHANGE_WIRING: dict[ExchangeKind, tuple[DistributionPattern, PartitionerKind]] = {
    ExchangeKind.FORWARD: (DistributionPattern.POINTWISE, PartitionerKind.FORWARD),
    ExchangeKind.HASH: (DistributionPattern.ALL_TO_ALL, PartitionerKind.HASH),
    ExchangeKind.REBALANCE: (DistributionPattern.ALL_TO_ALL, PartitionerKind.REBALANCE),
    ExchangeKind.RESCALE: (DistributionPattern.POINTWISE, PartitionerKind.REBALANCE),
    ExchangeKind.BROADCAST: (DistributionPattern.ALL_TO_ALL, PartitionerKind.BROADCAST),
}


def _result_partition_type(plan: Plan) -> ResultPartitionType:
    return result_partition_type(plan.job_type, plan.options)
