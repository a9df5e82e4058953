from funke.v1 import jobgraph_pb2 as _jobgraph_pb2
from funke.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SlotStatus(_message.Message):
    __slots__ = ("index", "job_id", "running")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    index: int
    job_id: str
    running: _containers.RepeatedCompositeFieldContainer[_job_pb2.ExecutionAttemptId]
    def __init__(self, index: _Optional[int] = ..., job_id: _Optional[str] = ..., running: _Optional[_Iterable[_Union[_job_pb2.ExecutionAttemptId, _Mapping]]] = ...) -> None: ...

class SlotReport(_message.Message):
    __slots__ = ("slots",)
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[SlotStatus]
    def __init__(self, slots: _Optional[_Iterable[_Union[SlotStatus, _Mapping]]] = ...) -> None: ...

class RegisterTaskManagerRequest(_message.Message):
    __slots__ = ("task_manager_id", "address", "number_of_slots", "resources", "slot_report", "registration_token")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NUMBER_OF_SLOTS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    SLOT_REPORT_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_manager_id: str
    address: str
    number_of_slots: int
    resources: _containers.ScalarMap[str, str]
    slot_report: SlotReport
    registration_token: str
    def __init__(self, task_manager_id: _Optional[str] = ..., address: _Optional[str] = ..., number_of_slots: _Optional[int] = ..., resources: _Optional[_Mapping[str, str]] = ..., slot_report: _Optional[_Union[SlotReport, _Mapping]] = ..., registration_token: _Optional[str] = ...) -> None: ...

class RegisterTaskManagerResponse(_message.Message):
    __slots__ = ("registration_id", "heartbeat_interval_seconds", "heartbeat_timeout_seconds", "data_dir", "leader_epoch")
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    registration_id: str
    heartbeat_interval_seconds: float
    heartbeat_timeout_seconds: float
    data_dir: str
    leader_epoch: int
    def __init__(self, registration_id: _Optional[str] = ..., heartbeat_interval_seconds: _Optional[float] = ..., heartbeat_timeout_seconds: _Optional[float] = ..., data_dir: _Optional[str] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("task_manager_id", "registration_id", "slot_report")
    TASK_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_REPORT_FIELD_NUMBER: _ClassVar[int]
    task_manager_id: str
    registration_id: str
    slot_report: SlotReport
    def __init__(self, task_manager_id: _Optional[str] = ..., registration_id: _Optional[str] = ..., slot_report: _Optional[_Union[SlotReport, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("reregister",)
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    reregister: bool
    def __init__(self, reregister: _Optional[bool] = ...) -> None: ...

class ProducedPartition(_message.Message):
    __slots__ = ("data_set_id", "partition_index", "schema", "row_count")
    DATA_SET_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    data_set_id: str
    partition_index: int
    schema: str
    row_count: int
    def __init__(self, data_set_id: _Optional[str] = ..., partition_index: _Optional[int] = ..., schema: _Optional[str] = ..., row_count: _Optional[int] = ...) -> None: ...

class TaskExecutionState(_message.Message):
    __slots__ = ("job_id", "attempt", "state", "failure", "produced", "task_manager_id", "stimulus_id", "batch_id", "input_rows", "io")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    PRODUCED_FIELD_NUMBER: _ClassVar[int]
    TASK_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    STIMULUS_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_ROWS_FIELD_NUMBER: _ClassVar[int]
    IO_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: _job_pb2.ExecutionAttemptId
    state: _job_pb2.ExecutionState
    failure: _job_pb2.Failure
    produced: _containers.RepeatedCompositeFieldContainer[ProducedPartition]
    task_manager_id: str
    stimulus_id: str
    batch_id: int
    input_rows: int
    io: _job_pb2.TaskIo
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[_Union[_job_pb2.ExecutionAttemptId, _Mapping]] = ..., state: _Optional[_Union[_job_pb2.ExecutionState, str]] = ..., failure: _Optional[_Union[_job_pb2.Failure, _Mapping]] = ..., produced: _Optional[_Iterable[_Union[ProducedPartition, _Mapping]]] = ..., task_manager_id: _Optional[str] = ..., stimulus_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., input_rows: _Optional[int] = ..., io: _Optional[_Union[_job_pb2.TaskIo, _Mapping]] = ...) -> None: ...

class UpdateTaskExecutionStateRequest(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[TaskExecutionState]
    def __init__(self, updates: _Optional[_Iterable[_Union[TaskExecutionState, _Mapping]]] = ...) -> None: ...

class UpdateTaskExecutionStateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InputGateDeploymentDescriptor(_message.Message):
    __slots__ = ("input_index", "data_set_id", "partition_start", "partition_end", "subpartition", "producer_attempts", "uniform_attempt", "schema")
    INPUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_SET_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_START_FIELD_NUMBER: _ClassVar[int]
    PARTITION_END_FIELD_NUMBER: _ClassVar[int]
    SUBPARTITION_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    UNIFORM_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    input_index: int
    data_set_id: str
    partition_start: int
    partition_end: int
    subpartition: int
    producer_attempts: _containers.RepeatedScalarFieldContainer[int]
    uniform_attempt: int
    schema: str
    def __init__(self, input_index: _Optional[int] = ..., data_set_id: _Optional[str] = ..., partition_start: _Optional[int] = ..., partition_end: _Optional[int] = ..., subpartition: _Optional[int] = ..., producer_attempts: _Optional[_Iterable[int]] = ..., uniform_attempt: _Optional[int] = ..., schema: _Optional[str] = ...) -> None: ...

class ResultPartitionDeploymentDescriptor(_message.Message):
    __slots__ = ("data_set_id", "partition_index", "num_subpartitions", "partitioner", "partition_keys", "partition_type", "key_groups")
    DATA_SET_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_SUBPARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONER_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEYS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    data_set_id: str
    partition_index: int
    num_subpartitions: int
    partitioner: _jobgraph_pb2.Partitioner
    partition_keys: _containers.RepeatedScalarFieldContainer[str]
    partition_type: _jobgraph_pb2.ResultPartitionType
    key_groups: int
    def __init__(self, data_set_id: _Optional[str] = ..., partition_index: _Optional[int] = ..., num_subpartitions: _Optional[int] = ..., partitioner: _Optional[_Union[_jobgraph_pb2.Partitioner, str]] = ..., partition_keys: _Optional[_Iterable[str]] = ..., partition_type: _Optional[_Union[_jobgraph_pb2.ResultPartitionType, str]] = ..., key_groups: _Optional[int] = ...) -> None: ...

class TaskDeploymentDescriptor(_message.Message):
    __slots__ = ("job_id", "job_name", "attempt", "task_name", "parallelism", "slot_index", "vertex", "inputs", "outputs", "data_dir", "job_options", "artifacts", "stimulus_id", "streaming")
    class JobOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    SLOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    VERTEX_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    JOB_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    STIMULUS_ID_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job_name: str
    attempt: _job_pb2.ExecutionAttemptId
    task_name: str
    parallelism: int
    slot_index: int
    vertex: _jobgraph_pb2.JobVertex
    inputs: _containers.RepeatedCompositeFieldContainer[InputGateDeploymentDescriptor]
    outputs: _containers.RepeatedCompositeFieldContainer[ResultPartitionDeploymentDescriptor]
    data_dir: str
    job_options: _containers.ScalarMap[str, str]
    artifacts: _containers.RepeatedCompositeFieldContainer[_jobgraph_pb2.Artifact]
    stimulus_id: str
    streaming: bool
    def __init__(self, job_id: _Optional[str] = ..., job_name: _Optional[str] = ..., attempt: _Optional[_Union[_job_pb2.ExecutionAttemptId, _Mapping]] = ..., task_name: _Optional[str] = ..., parallelism: _Optional[int] = ..., slot_index: _Optional[int] = ..., vertex: _Optional[_Union[_jobgraph_pb2.JobVertex, _Mapping]] = ..., inputs: _Optional[_Iterable[_Union[InputGateDeploymentDescriptor, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[ResultPartitionDeploymentDescriptor, _Mapping]]] = ..., data_dir: _Optional[str] = ..., job_options: _Optional[_Mapping[str, str]] = ..., artifacts: _Optional[_Iterable[_Union[_jobgraph_pb2.Artifact, _Mapping]]] = ..., stimulus_id: _Optional[str] = ..., streaming: _Optional[bool] = ...) -> None: ...

class SubmitTasksRequest(_message.Message):
    __slots__ = ("tasks", "registration_id")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskDeploymentDescriptor]
    registration_id: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskDeploymentDescriptor, _Mapping]]] = ..., registration_id: _Optional[str] = ...) -> None: ...

class TaskSubmissionResult(_message.Message):
    __slots__ = ("attempt", "accepted", "error")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    attempt: _job_pb2.ExecutionAttemptId
    accepted: bool
    error: str
    def __init__(self, attempt: _Optional[_Union[_job_pb2.ExecutionAttemptId, _Mapping]] = ..., accepted: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class SubmitTasksResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TaskSubmissionResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TaskSubmissionResult, _Mapping]]] = ...) -> None: ...

class CancelTasksRequest(_message.Message):
    __slots__ = ("job_id", "attempts", "stimulus_id", "registration_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    STIMULUS_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempts: _containers.RepeatedCompositeFieldContainer[_job_pb2.ExecutionAttemptId]
    stimulus_id: str
    registration_id: str
    def __init__(self, job_id: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[_job_pb2.ExecutionAttemptId, _Mapping]]] = ..., stimulus_id: _Optional[str] = ..., registration_id: _Optional[str] = ...) -> None: ...

class CancelTasksResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PartitionInfoUpdate(_message.Message):
    __slots__ = ("data_set_id", "partition_index", "producer_attempt", "schema")
    DATA_SET_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    data_set_id: str
    partition_index: int
    producer_attempt: int
    schema: str
    def __init__(self, data_set_id: _Optional[str] = ..., partition_index: _Optional[int] = ..., producer_attempt: _Optional[int] = ..., schema: _Optional[str] = ...) -> None: ...

class UpdatePartitionInfoRequest(_message.Message):
    __slots__ = ("job_id", "updates", "registration_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    updates: _containers.RepeatedCompositeFieldContainer[PartitionInfoUpdate]
    registration_id: str
    def __init__(self, job_id: _Optional[str] = ..., updates: _Optional[_Iterable[_Union[PartitionInfoUpdate, _Mapping]]] = ..., registration_id: _Optional[str] = ...) -> None: ...

class UpdatePartitionInfoResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FreeSlotsRequest(_message.Message):
    __slots__ = ("slot_indexes", "job_id", "cause", "registration_id")
    SLOT_INDEXES_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    slot_indexes: _containers.RepeatedScalarFieldContainer[int]
    job_id: str
    cause: str
    registration_id: str
    def __init__(self, slot_indexes: _Optional[_Iterable[int]] = ..., job_id: _Optional[str] = ..., cause: _Optional[str] = ..., registration_id: _Optional[str] = ...) -> None: ...

class FreeSlotsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResultPartitionRef(_message.Message):
    __slots__ = ("data_set_id", "partition_index", "producer_attempt")
    DATA_SET_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_set_id: str
    partition_index: int
    producer_attempt: int
    def __init__(self, data_set_id: _Optional[str] = ..., partition_index: _Optional[int] = ..., producer_attempt: _Optional[int] = ...) -> None: ...

class ReleasePartitionsRequest(_message.Message):
    __slots__ = ("job_id", "partitions", "whole_job", "registration_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    WHOLE_JOB_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[ResultPartitionRef]
    whole_job: bool
    registration_id: str
    def __init__(self, job_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ResultPartitionRef, _Mapping]]] = ..., whole_job: _Optional[bool] = ..., registration_id: _Optional[str] = ...) -> None: ...

class ReleasePartitionsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BatchGate(_message.Message):
    __slots__ = ("input_index", "producer_attempts", "schema")
    INPUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    input_index: int
    producer_attempts: _containers.RepeatedScalarFieldContainer[int]
    schema: str
    def __init__(self, input_index: _Optional[int] = ..., producer_attempts: _Optional[_Iterable[int]] = ..., schema: _Optional[str] = ...) -> None: ...

class BatchTask(_message.Message):
    __slots__ = ("attempt", "gates")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GATES_FIELD_NUMBER: _ClassVar[int]
    attempt: _job_pb2.ExecutionAttemptId
    gates: _containers.RepeatedCompositeFieldContainer[BatchGate]
    def __init__(self, attempt: _Optional[_Union[_job_pb2.ExecutionAttemptId, _Mapping]] = ..., gates: _Optional[_Iterable[_Union[BatchGate, _Mapping]]] = ...) -> None: ...

class SourceFiles(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class RunBatchesRequest(_message.Message):
    __slots__ = ("job_id", "registration_id", "batch_id", "batch_time_ms", "ranges_json", "files", "tasks", "released_batches", "rate_limits", "watermark_ms", "state_lineage_json")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SourceFiles
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SourceFiles, _Mapping]] = ...) -> None: ...
    class RateLimitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    RANGES_JSON_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_LINEAGE_JSON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    registration_id: str
    batch_id: int
    batch_time_ms: int
    ranges_json: str
    files: _containers.MessageMap[str, SourceFiles]
    tasks: _containers.RepeatedCompositeFieldContainer[BatchTask]
    released_batches: _containers.RepeatedScalarFieldContainer[int]
    rate_limits: _containers.ScalarMap[str, float]
    watermark_ms: int
    state_lineage_json: str
    def __init__(self, job_id: _Optional[str] = ..., registration_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., batch_time_ms: _Optional[int] = ..., ranges_json: _Optional[str] = ..., files: _Optional[_Mapping[str, SourceFiles]] = ..., tasks: _Optional[_Iterable[_Union[BatchTask, _Mapping]]] = ..., released_batches: _Optional[_Iterable[int]] = ..., rate_limits: _Optional[_Mapping[str, float]] = ..., watermark_ms: _Optional[int] = ..., state_lineage_json: _Optional[str] = ...) -> None: ...

class RunBatchesResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TaskSubmissionResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TaskSubmissionResult, _Mapping]]] = ...) -> None: ...

class FinishTasksRequest(_message.Message):
    __slots__ = ("job_id", "registration_id", "attempts")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    registration_id: str
    attempts: _containers.RepeatedCompositeFieldContainer[_job_pb2.ExecutionAttemptId]
    def __init__(self, job_id: _Optional[str] = ..., registration_id: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[_job_pb2.ExecutionAttemptId, _Mapping]]] = ...) -> None: ...

class FinishTasksResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TaskRateLimit(_message.Message):
    __slots__ = ("attempt", "records_per_second")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECORDS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    attempt: _job_pb2.ExecutionAttemptId
    records_per_second: float
    def __init__(self, attempt: _Optional[_Union[_job_pb2.ExecutionAttemptId, _Mapping]] = ..., records_per_second: _Optional[float] = ...) -> None: ...

class SetRateLimitsRequest(_message.Message):
    __slots__ = ("job_id", "registration_id", "tasks")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    registration_id: str
    tasks: _containers.RepeatedCompositeFieldContainer[TaskRateLimit]
    def __init__(self, job_id: _Optional[str] = ..., registration_id: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskRateLimit, _Mapping]]] = ...) -> None: ...

class SetRateLimitsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
