import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from funke.v1 import jobgraph_pb2 as _jobgraph_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_CREATED: _ClassVar[JobStatus]
    JOB_STATUS_RUNNING: _ClassVar[JobStatus]
    JOB_STATUS_FAILING: _ClassVar[JobStatus]
    JOB_STATUS_FAILED: _ClassVar[JobStatus]
    JOB_STATUS_CANCELLING: _ClassVar[JobStatus]
    JOB_STATUS_CANCELED: _ClassVar[JobStatus]
    JOB_STATUS_FINISHED: _ClassVar[JobStatus]
    JOB_STATUS_RESTARTING: _ClassVar[JobStatus]
    JOB_STATUS_SUSPENDED: _ClassVar[JobStatus]

class ExecutionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXECUTION_STATE_UNSPECIFIED: _ClassVar[ExecutionState]
    EXECUTION_STATE_CREATED: _ClassVar[ExecutionState]
    EXECUTION_STATE_SCHEDULED: _ClassVar[ExecutionState]
    EXECUTION_STATE_DEPLOYING: _ClassVar[ExecutionState]
    EXECUTION_STATE_INITIALIZING: _ClassVar[ExecutionState]
    EXECUTION_STATE_RUNNING: _ClassVar[ExecutionState]
    EXECUTION_STATE_FINISHED: _ClassVar[ExecutionState]
    EXECUTION_STATE_CANCELING: _ClassVar[ExecutionState]
    EXECUTION_STATE_CANCELED: _ClassVar[ExecutionState]
    EXECUTION_STATE_FAILED: _ClassVar[ExecutionState]

class RescaleState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESCALE_STATE_UNSPECIFIED: _ClassVar[RescaleState]
    RESCALE_STATE_REQUESTED: _ClassVar[RescaleState]
    RESCALE_STATE_STOPPING: _ClassVar[RescaleState]
    RESCALE_STATE_SUSPENDED: _ClassVar[RescaleState]
    RESCALE_STATE_STARTING: _ClassVar[RescaleState]
    RESCALE_STATE_RUNNING: _ClassVar[RescaleState]
    RESCALE_STATE_FAILED: _ClassVar[RescaleState]
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_CREATED: JobStatus
JOB_STATUS_RUNNING: JobStatus
JOB_STATUS_FAILING: JobStatus
JOB_STATUS_FAILED: JobStatus
JOB_STATUS_CANCELLING: JobStatus
JOB_STATUS_CANCELED: JobStatus
JOB_STATUS_FINISHED: JobStatus
JOB_STATUS_RESTARTING: JobStatus
JOB_STATUS_SUSPENDED: JobStatus
EXECUTION_STATE_UNSPECIFIED: ExecutionState
EXECUTION_STATE_CREATED: ExecutionState
EXECUTION_STATE_SCHEDULED: ExecutionState
EXECUTION_STATE_DEPLOYING: ExecutionState
EXECUTION_STATE_INITIALIZING: ExecutionState
EXECUTION_STATE_RUNNING: ExecutionState
EXECUTION_STATE_FINISHED: ExecutionState
EXECUTION_STATE_CANCELING: ExecutionState
EXECUTION_STATE_CANCELED: ExecutionState
EXECUTION_STATE_FAILED: ExecutionState
RESCALE_STATE_UNSPECIFIED: RescaleState
RESCALE_STATE_REQUESTED: RescaleState
RESCALE_STATE_STOPPING: RescaleState
RESCALE_STATE_SUSPENDED: RescaleState
RESCALE_STATE_STARTING: RescaleState
RESCALE_STATE_RUNNING: RescaleState
RESCALE_STATE_FAILED: RescaleState

class ExecutionAttemptId(_message.Message):
    __slots__ = ("vertex_id", "subtask_index", "attempt_number")
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    SUBTASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    vertex_id: str
    subtask_index: int
    attempt_number: int
    def __init__(self, vertex_id: _Optional[str] = ..., subtask_index: _Optional[int] = ..., attempt_number: _Optional[int] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("exception_type", "message", "traceback")
    EXCEPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    exception_type: str
    message: str
    traceback: str
    def __init__(self, exception_type: _Optional[str] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class JobStatusTransition(_message.Message):
    __slots__ = ("from_status", "to_status", "timestamp", "cause", "stimulus_id", "leader_epoch", "job_manager")
    FROM_STATUS_FIELD_NUMBER: _ClassVar[int]
    TO_STATUS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    STIMULUS_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    JOB_MANAGER_FIELD_NUMBER: _ClassVar[int]
    from_status: JobStatus
    to_status: JobStatus
    timestamp: _timestamp_pb2.Timestamp
    cause: str
    stimulus_id: str
    leader_epoch: int
    job_manager: str
    def __init__(self, from_status: _Optional[_Union[JobStatus, str]] = ..., to_status: _Optional[_Union[JobStatus, str]] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cause: _Optional[str] = ..., stimulus_id: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., job_manager: _Optional[str] = ...) -> None: ...

class ExecutionStateTransition(_message.Message):
    __slots__ = ("from_state", "to_state", "timestamp", "cause", "stimulus_id")
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    STIMULUS_ID_FIELD_NUMBER: _ClassVar[int]
    from_state: ExecutionState
    to_state: ExecutionState
    timestamp: _timestamp_pb2.Timestamp
    cause: str
    stimulus_id: str
    def __init__(self, from_state: _Optional[_Union[ExecutionState, str]] = ..., to_state: _Optional[_Union[ExecutionState, str]] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cause: _Optional[str] = ..., stimulus_id: _Optional[str] = ...) -> None: ...

class TaskIo(_message.Message):
    __slots__ = ("records_in", "records_out", "bytes_in", "bytes_out", "seconds", "state", "event_time", "late_rows", "operators")
    class EventTimeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: EventTimeStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[EventTimeStats, _Mapping]] = ...) -> None: ...
    RECORDS_IN_FIELD_NUMBER: _ClassVar[int]
    RECORDS_OUT_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    LATE_ROWS_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    seconds: float
    state: StateMetrics
    event_time: _containers.MessageMap[str, EventTimeStats]
    late_rows: int
    operators: _containers.RepeatedCompositeFieldContainer[OperatorIo]
    def __init__(self, records_in: _Optional[int] = ..., records_out: _Optional[int] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., seconds: _Optional[float] = ..., state: _Optional[_Union[StateMetrics, _Mapping]] = ..., event_time: _Optional[_Mapping[str, EventTimeStats]] = ..., late_rows: _Optional[int] = ..., operators: _Optional[_Iterable[_Union[OperatorIo, _Mapping]]] = ...) -> None: ...

class OperatorIo(_message.Message):
    __slots__ = ("records_in", "records_out")
    RECORDS_IN_FIELD_NUMBER: _ClassVar[int]
    RECORDS_OUT_FIELD_NUMBER: _ClassVar[int]
    records_in: int
    records_out: int
    def __init__(self, records_in: _Optional[int] = ..., records_out: _Optional[int] = ...) -> None: ...

class EventTimeStats(_message.Message):
    __slots__ = ("min_ms", "max_ms", "sum_ms", "count")
    MIN_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    SUM_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    min_ms: int
    max_ms: int
    sum_ms: float
    count: int
    def __init__(self, min_ms: _Optional[int] = ..., max_ms: _Optional[int] = ..., sum_ms: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class StateMetrics(_message.Message):
    __slots__ = ("rows_total", "rows_updated", "rows_removed", "bytes_written", "bytes_on_disk", "update_ms", "memory_bytes", "commit_ms")
    ROWS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ROWS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    ROWS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_ON_DISK_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_MS_FIELD_NUMBER: _ClassVar[int]
    rows_total: int
    rows_updated: int
    rows_removed: int
    bytes_written: int
    bytes_on_disk: int
    update_ms: float
    memory_bytes: int
    commit_ms: float
    def __init__(self, rows_total: _Optional[int] = ..., rows_updated: _Optional[int] = ..., rows_removed: _Optional[int] = ..., bytes_written: _Optional[int] = ..., bytes_on_disk: _Optional[int] = ..., update_ms: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., commit_ms: _Optional[float] = ...) -> None: ...

class Execution(_message.Message):
    __slots__ = ("id", "state", "created_at", "history", "task_manager_id", "slot_index", "failure", "io")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    TASK_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    IO_FIELD_NUMBER: _ClassVar[int]
    id: ExecutionAttemptId
    state: ExecutionState
    created_at: _timestamp_pb2.Timestamp
    history: _containers.RepeatedCompositeFieldContainer[ExecutionStateTransition]
    task_manager_id: str
    slot_index: int
    failure: Failure
    io: TaskIo
    def __init__(self, id: _Optional[_Union[ExecutionAttemptId, _Mapping]] = ..., state: _Optional[_Union[ExecutionState, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history: _Optional[_Iterable[_Union[ExecutionStateTransition, _Mapping]]] = ..., task_manager_id: _Optional[str] = ..., slot_index: _Optional[int] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., io: _Optional[_Union[TaskIo, _Mapping]] = ...) -> None: ...

class Subtask(_message.Message):
    __slots__ = ("subtask_index", "name", "current", "prior_attempts")
    SUBTASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    PRIOR_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    subtask_index: int
    name: str
    current: Execution
    prior_attempts: _containers.RepeatedCompositeFieldContainer[Execution]
    def __init__(self, subtask_index: _Optional[int] = ..., name: _Optional[str] = ..., current: _Optional[_Union[Execution, _Mapping]] = ..., prior_attempts: _Optional[_Iterable[_Union[Execution, _Mapping]]] = ...) -> None: ...

class Vertex(_message.Message):
    __slots__ = ("id", "name", "parallelism", "slot_sharing_group", "co_location_group", "subtasks_per_state", "subtasks", "operators")
    class SubtasksPerStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    SLOT_SHARING_GROUP_FIELD_NUMBER: _ClassVar[int]
    CO_LOCATION_GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBTASKS_PER_STATE_FIELD_NUMBER: _ClassVar[int]
    SUBTASKS_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    parallelism: int
    slot_sharing_group: str
    co_location_group: str
    subtasks_per_state: _containers.ScalarMap[str, int]
    subtasks: _containers.RepeatedCompositeFieldContainer[Subtask]
    operators: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., parallelism: _Optional[int] = ..., slot_sharing_group: _Optional[str] = ..., co_location_group: _Optional[str] = ..., subtasks_per_state: _Optional[_Mapping[str, int]] = ..., subtasks: _Optional[_Iterable[_Union[Subtask, _Mapping]]] = ..., operators: _Optional[_Iterable[str]] = ...) -> None: ...

class ExceptionHistoryEntry(_message.Message):
    __slots__ = ("timestamp", "task_name", "attempt", "task_manager_id", "failure")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TASK_MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    timestamp: _timestamp_pb2.Timestamp
    task_name: str
    attempt: ExecutionAttemptId
    task_manager_id: str
    failure: Failure
    def __init__(self, timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., task_name: _Optional[str] = ..., attempt: _Optional[_Union[ExecutionAttemptId, _Mapping]] = ..., task_manager_id: _Optional[str] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...

class RescaleTransition(_message.Message):
    __slots__ = ("from_state", "to_state", "timestamp", "cause", "stimulus_id")
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    STIMULUS_ID_FIELD_NUMBER: _ClassVar[int]
    from_state: RescaleState
    to_state: RescaleState
    timestamp: _timestamp_pb2.Timestamp
    cause: str
    stimulus_id: str
    def __init__(self, from_state: _Optional[_Union[RescaleState, str]] = ..., to_state: _Optional[_Union[RescaleState, str]] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cause: _Optional[str] = ..., stimulus_id: _Optional[str] = ...) -> None: ...

class Rescale(_message.Message):
    __slots__ = ("state", "requested_at", "cause", "parallelism", "last_batch_id", "history", "failure")
    class ParallelismEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    LAST_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    state: RescaleState
    requested_at: _timestamp_pb2.Timestamp
    cause: str
    parallelism: _containers.ScalarMap[str, int]
    last_batch_id: int
    history: _containers.RepeatedCompositeFieldContainer[RescaleTransition]
    failure: str
    def __init__(self, state: _Optional[_Union[RescaleState, str]] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cause: _Optional[str] = ..., parallelism: _Optional[_Mapping[str, int]] = ..., last_batch_id: _Optional[int] = ..., history: _Optional[_Iterable[_Union[RescaleTransition, _Mapping]]] = ..., failure: _Optional[str] = ...) -> None: ...

class JobDetails(_message.Message):
    __slots__ = ("job_id", "name", "job_type", "status", "created_at", "status_history", "vertices", "exceptions", "failure", "waiting_for_resources", "required_slots", "restart_strategy", "failover_strategy", "latest_progress_json", "data_sets", "edges", "num_restarts", "rescales")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STATUS_HISTORY_FIELD_NUMBER: _ClassVar[int]
    VERTICES_FIELD_NUMBER: _ClassVar[int]
    EXCEPTIONS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    RESTART_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    LATEST_PROGRESS_JSON_FIELD_NUMBER: _ClassVar[int]
    DATA_SETS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    NUM_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RESCALES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    job_type: _jobgraph_pb2.JobType
    status: JobStatus
    created_at: _timestamp_pb2.Timestamp
    status_history: _containers.RepeatedCompositeFieldContainer[JobStatusTransition]
    vertices: _containers.RepeatedCompositeFieldContainer[Vertex]
    exceptions: _containers.RepeatedCompositeFieldContainer[ExceptionHistoryEntry]
    failure: Failure
    waiting_for_resources: str
    required_slots: int
    restart_strategy: str
    failover_strategy: str
    latest_progress_json: str
    data_sets: _containers.RepeatedCompositeFieldContainer[_jobgraph_pb2.IntermediateDataSet]
    edges: _containers.RepeatedCompositeFieldContainer[_jobgraph_pb2.JobEdge]
    num_restarts: int
    rescales: _containers.RepeatedCompositeFieldContainer[Rescale]
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., job_type: _Optional[_Union[_jobgraph_pb2.JobType, str]] = ..., status: _Optional[_Union[JobStatus, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., status_history: _Optional[_Iterable[_Union[JobStatusTransition, _Mapping]]] = ..., vertices: _Optional[_Iterable[_Union[Vertex, _Mapping]]] = ..., exceptions: _Optional[_Iterable[_Union[ExceptionHistoryEntry, _Mapping]]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., waiting_for_resources: _Optional[str] = ..., required_slots: _Optional[int] = ..., restart_strategy: _Optional[str] = ..., failover_strategy: _Optional[str] = ..., latest_progress_json: _Optional[str] = ..., data_sets: _Optional[_Iterable[_Union[_jobgraph_pb2.IntermediateDataSet, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[_jobgraph_pb2.JobEdge, _Mapping]]] = ..., num_restarts: _Optional[int] = ..., rescales: _Optional[_Iterable[_Union[Rescale, _Mapping]]] = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = ("job_id", "name", "job_type", "status", "created_at", "ended_at", "duration_seconds", "tasks_per_state", "total_tasks")
    class TasksPerStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TASKS_PER_STATE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TASKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    job_type: _jobgraph_pb2.JobType
    status: JobStatus
    created_at: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    duration_seconds: float
    tasks_per_state: _containers.ScalarMap[str, int]
    total_tasks: int
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., job_type: _Optional[_Union[_jobgraph_pb2.JobType, str]] = ..., status: _Optional[_Union[JobStatus, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., duration_seconds: _Optional[float] = ..., tasks_per_state: _Optional[_Mapping[str, int]] = ..., total_tasks: _Optional[int] = ...) -> None: ...
