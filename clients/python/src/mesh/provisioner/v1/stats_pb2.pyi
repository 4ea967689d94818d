from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EndpointStatsData(_message.Message):
    __slots__ = ("answered", "answer_errors", "shed", "queue_full", "slow_consumer", "refused_replies", "loading", "behind", "over_budget", "answer_cache", "seat", "seat_since", "seat_holder", "buckets", "large_shed", "refused", "plans", "answered_early", "asker_full", "dropped", "dropped_by_asker", "shut_out", "relayed", "held", "partition_seats")
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    ANSWER_ERRORS_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FULL_FIELD_NUMBER: _ClassVar[int]
    SLOW_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    REFUSED_REPLIES_FIELD_NUMBER: _ClassVar[int]
    LOADING_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    OVER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    ANSWER_CACHE_FIELD_NUMBER: _ClassVar[int]
    SEAT_FIELD_NUMBER: _ClassVar[int]
    SEAT_SINCE_FIELD_NUMBER: _ClassVar[int]
    SEAT_HOLDER_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    LARGE_SHED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_EARLY_FIELD_NUMBER: _ClassVar[int]
    ASKER_FULL_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BY_ASKER_FIELD_NUMBER: _ClassVar[int]
    SHUT_OUT_FIELD_NUMBER: _ClassVar[int]
    RELAYED_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PARTITION_SEATS_FIELD_NUMBER: _ClassVar[int]
    answered: int
    answer_errors: int
    shed: int
    queue_full: int
    slow_consumer: int
    refused_replies: int
    loading: _containers.RepeatedScalarFieldContainer[str]
    behind: _containers.RepeatedScalarFieldContainer[str]
    over_budget: _containers.RepeatedCompositeFieldContainer[OverBudget]
    answer_cache: AnswerCacheStats
    seat: str
    seat_since: str
    seat_holder: str
    buckets: _containers.RepeatedCompositeFieldContainer[BucketStats]
    large_shed: int
    refused: int
    plans: PlansStats
    answered_early: int
    asker_full: int
    dropped: int
    dropped_by_asker: _containers.RepeatedCompositeFieldContainer[AskerDrops]
    shut_out: _containers.RepeatedCompositeFieldContainer[PartitionShutOut]
    relayed: int
    held: _containers.RepeatedScalarFieldContainer[int]
    partition_seats: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, answered: _Optional[int] = ..., answer_errors: _Optional[int] = ..., shed: _Optional[int] = ..., queue_full: _Optional[int] = ..., slow_consumer: _Optional[int] = ..., refused_replies: _Optional[int] = ..., loading: _Optional[_Iterable[str]] = ..., behind: _Optional[_Iterable[str]] = ..., over_budget: _Optional[_Iterable[_Union[OverBudget, _Mapping]]] = ..., answer_cache: _Optional[_Union[AnswerCacheStats, _Mapping]] = ..., seat: _Optional[str] = ..., seat_since: _Optional[str] = ..., seat_holder: _Optional[str] = ..., buckets: _Optional[_Iterable[_Union[BucketStats, _Mapping]]] = ..., large_shed: _Optional[int] = ..., refused: _Optional[int] = ..., plans: _Optional[_Union[PlansStats, _Mapping]] = ..., answered_early: _Optional[int] = ..., asker_full: _Optional[int] = ..., dropped: _Optional[int] = ..., dropped_by_asker: _Optional[_Iterable[_Union[AskerDrops, _Mapping]]] = ..., shut_out: _Optional[_Iterable[_Union[PartitionShutOut, _Mapping]]] = ..., relayed: _Optional[int] = ..., held: _Optional[_Iterable[int]] = ..., partition_seats: _Optional[_Iterable[int]] = ...) -> None: ...

class PartitionShutOut(_message.Message):
    __slots__ = ("partition", "asker", "times", "until")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ASKER_FIELD_NUMBER: _ClassVar[int]
    TIMES_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    partition: int
    asker: str
    times: int
    until: str
    def __init__(self, partition: _Optional[int] = ..., asker: _Optional[str] = ..., times: _Optional[int] = ..., until: _Optional[str] = ...) -> None: ...

class AskerDrops(_message.Message):
    __slots__ = ("role", "name", "dropped")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    role: str
    name: str
    dropped: int
    def __init__(self, role: _Optional[str] = ..., name: _Optional[str] = ..., dropped: _Optional[int] = ...) -> None: ...

class PlansStats(_message.Message):
    __slots__ = ("written", "composed", "last_written", "pending", "last_pass_ms", "failed", "deferred")
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    COMPOSED_FIELD_NUMBER: _ClassVar[int]
    LAST_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    LAST_PASS_MS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    written: int
    composed: int
    last_written: str
    pending: int
    last_pass_ms: int
    failed: int
    deferred: int
    def __init__(self, written: _Optional[int] = ..., composed: _Optional[int] = ..., last_written: _Optional[str] = ..., pending: _Optional[int] = ..., last_pass_ms: _Optional[int] = ..., failed: _Optional[int] = ..., deferred: _Optional[int] = ...) -> None: ...

class OverBudget(_message.Message):
    __slots__ = ("bucket", "node", "keys", "bytes", "refused")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    node: str
    keys: int
    bytes: int
    refused: int
    def __init__(self, bucket: _Optional[str] = ..., node: _Optional[str] = ..., keys: _Optional[int] = ..., bytes: _Optional[int] = ..., refused: _Optional[int] = ...) -> None: ...

class AnswerCacheStats(_message.Message):
    __slots__ = ("entries", "bytes", "limit", "hits", "misses")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    entries: int
    bytes: int
    limit: int
    hits: int
    misses: int
    def __init__(self, entries: _Optional[int] = ..., bytes: _Optional[int] = ..., limit: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ...) -> None: ...

class BucketStats(_message.Message):
    __slots__ = ("bucket", "revision", "records", "malformed", "nodes")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    MALFORMED_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    revision: int
    records: int
    malformed: int
    nodes: int
    def __init__(self, bucket: _Optional[str] = ..., revision: _Optional[int] = ..., records: _Optional[int] = ..., malformed: _Optional[int] = ..., nodes: _Optional[int] = ...) -> None: ...
