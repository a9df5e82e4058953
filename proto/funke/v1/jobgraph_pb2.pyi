from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_TYPE_UNSPECIFIED: _ClassVar[JobType]
    JOB_TYPE_BATCH: _ClassVar[JobType]
    JOB_TYPE_STREAMING: _ClassVar[JobType]

class DistributionPattern(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISTRIBUTION_PATTERN_UNSPECIFIED: _ClassVar[DistributionPattern]
    DISTRIBUTION_PATTERN_POINTWISE: _ClassVar[DistributionPattern]
    DISTRIBUTION_PATTERN_ALL_TO_ALL: _ClassVar[DistributionPattern]

class Partitioner(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARTITIONER_UNSPECIFIED: _ClassVar[Partitioner]
    PARTITIONER_FORWARD: _ClassVar[Partitioner]
    PARTITIONER_HASH: _ClassVar[Partitioner]
    PARTITIONER_REBALANCE: _ClassVar[Partitioner]
    PARTITIONER_BROADCAST: _ClassVar[Partitioner]

class ResultPartitionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_PARTITION_TYPE_UNSPECIFIED: _ClassVar[ResultPartitionType]
    RESULT_PARTITION_TYPE_BLOCKING: _ClassVar[ResultPartitionType]
    RESULT_PARTITION_TYPE_PIPELINED: _ClassVar[ResultPartitionType]
JOB_TYPE_UNSPECIFIED: JobType
JOB_TYPE_BATCH: JobType
JOB_TYPE_STREAMING: JobType
DISTRIBUTION_PATTERN_UNSPECIFIED: DistributionPattern
DISTRIBUTION_PATTERN_POINTWISE: DistributionPattern
DISTRIBUTION_PATTERN_ALL_TO_ALL: DistributionPattern
PARTITIONER_UNSPECIFIED: Partitioner
PARTITIONER_FORWARD: Partitioner
PARTITIONER_HASH: Partitioner
PARTITIONER_REBALANCE: Partitioner
PARTITIONER_BROADCAST: Partitioner
RESULT_PARTITION_TYPE_UNSPECIFIED: ResultPartitionType
RESULT_PARTITION_TYPE_BLOCKING: ResultPartitionType
RESULT_PARTITION_TYPE_PIPELINED: ResultPartitionType

class OperatorSpec(_message.Message):
    __slots__ = ("kind", "name", "config_json", "function")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    config_json: str
    function: bytes
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., config_json: _Optional[str] = ..., function: _Optional[bytes] = ...) -> None: ...

class JobVertex(_message.Message):
    __slots__ = ("id", "name", "parallelism", "max_parallelism", "operators", "slot_sharing_group", "co_location_group")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    MAX_PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    SLOT_SHARING_GROUP_FIELD_NUMBER: _ClassVar[int]
    CO_LOCATION_GROUP_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    parallelism: int
    max_parallelism: int
    operators: _containers.RepeatedCompositeFieldContainer[OperatorSpec]
    slot_sharing_group: str
    co_location_group: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., parallelism: _Optional[int] = ..., max_parallelism: _Optional[int] = ..., operators: _Optional[_Iterable[_Union[OperatorSpec, _Mapping]]] = ..., slot_sharing_group: _Optional[str] = ..., co_location_group: _Optional[str] = ...) -> None: ...

class IntermediateDataSet(_message.Message):
    __slots__ = ("id", "producer_vertex_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    producer_vertex_id: str
    def __init__(self, id: _Optional[str] = ..., producer_vertex_id: _Optional[str] = ...) -> None: ...

class JobEdge(_message.Message):
    __slots__ = ("id", "data_set_id", "consumer_vertex_id", "distribution_pattern", "partitioner", "partition_keys", "result_partition_type", "input_index")
    ID_FIELD_NUMBER: _ClassVar[int]
    DATA_SET_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_PATTERN_FIELD_NUMBER: _ClassVar[int]
    PARTITIONER_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEYS_FIELD_NUMBER: _ClassVar[int]
    RESULT_PARTITION_TYPE_FIELD_NUMBER: _ClassVar[int]
    INPUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    id: str
    data_set_id: str
    consumer_vertex_id: str
    distribution_pattern: DistributionPattern
    partitioner: Partitioner
    partition_keys: _containers.RepeatedScalarFieldContainer[str]
    result_partition_type: ResultPartitionType
    input_index: int
    def __init__(self, id: _Optional[str] = ..., data_set_id: _Optional[str] = ..., consumer_vertex_id: _Optional[str] = ..., distribution_pattern: _Optional[_Union[DistributionPattern, str]] = ..., partitioner: _Optional[_Union[Partitioner, str]] = ..., partition_keys: _Optional[_Iterable[str]] = ..., result_partition_type: _Optional[_Union[ResultPartitionType, str]] = ..., input_index: _Optional[int] = ...) -> None: ...

class RestartStrategy(_message.Message):
    __slots__ = ("type", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    type: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, type: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class JobConfiguration(_message.Message):
    __slots__ = ("restart_strategy", "failover_strategy", "slot_request_timeout_seconds", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESTART_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    SLOT_REQUEST_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    restart_strategy: RestartStrategy
    failover_strategy: str
    slot_request_timeout_seconds: float
    options: _containers.ScalarMap[str, str]
    def __init__(self, restart_strategy: _Optional[_Union[RestartStrategy, _Mapping]] = ..., failover_strategy: _Optional[str] = ..., slot_request_timeout_seconds: _Optional[float] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Artifact(_message.Message):
    __slots__ = ("name", "content", "uri")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    name: str
    content: bytes
    uri: str
    def __init__(self, name: _Optional[str] = ..., content: _Optional[bytes] = ..., uri: _Optional[str] = ...) -> None: ...

class JobGraph(_message.Message):
    __slots__ = ("job_id", "name", "job_type", "vertices", "data_sets", "edges", "configuration", "artifacts")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERTICES_FIELD_NUMBER: _ClassVar[int]
    DATA_SETS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    job_type: JobType
    vertices: _containers.RepeatedCompositeFieldContainer[JobVertex]
    data_sets: _containers.RepeatedCompositeFieldContainer[IntermediateDataSet]
    edges: _containers.RepeatedCompositeFieldContainer[JobEdge]
    configuration: JobConfiguration
    artifacts: _containers.RepeatedCompositeFieldContainer[Artifact]
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., job_type: _Optional[_Union[JobType, str]] = ..., vertices: _Optional[_Iterable[_Union[JobVertex, _Mapping]]] = ..., data_sets: _Optional[_Iterable[_Union[IntermediateDataSet, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[JobEdge, _Mapping]]] = ..., configuration: _Optional[_Union[JobConfiguration, _Mapping]] = ..., artifacts: _Optional[_Iterable[_Union[Artifact, _Mapping]]] = ...) -> None: ...
