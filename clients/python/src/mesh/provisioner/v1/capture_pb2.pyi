import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Capture(_message.Message):
    __slots__ = ("captured_at", "buckets")
    CAPTURED_AT_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    captured_at: _timestamp_pb2.Timestamp
    buckets: _containers.RepeatedCompositeFieldContainer[CapturedBucket]
    def __init__(self, captured_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., buckets: _Optional[_Iterable[_Union[CapturedBucket, _Mapping]]] = ...) -> None: ...

class CapturedBucket(_message.Message):
    __slots__ = ("bucket", "revision", "entries")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    revision: int
    entries: _containers.RepeatedCompositeFieldContainer[CapturedEntry]
    def __init__(self, bucket: _Optional[str] = ..., revision: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[CapturedEntry, _Mapping]]] = ...) -> None: ...

class CapturedEntry(_message.Message):
    __slots__ = ("key", "value", "revision")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    revision: int
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., revision: _Optional[int] = ...) -> None: ...
