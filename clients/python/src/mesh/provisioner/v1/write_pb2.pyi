from mesh.provisioner.v1 import provisioning_pb2 as _provisioning_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Record(_message.Message):
    __slots__ = ("what", "key", "value")
    WHAT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    what: _provisioning_pb2.What
    key: str
    value: bytes
    def __init__(self, what: _Optional[_Union[_provisioning_pb2.What, str]] = ..., key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: Record
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("what", "key")
    WHAT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    what: _provisioning_pb2.What
    key: str
    def __init__(self, what: _Optional[_Union[_provisioning_pb2.What, str]] = ..., key: _Optional[str] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("module", "needs", "min_revision")
    MODULE_FIELD_NUMBER: _ClassVar[int]
    NEEDS_FIELD_NUMBER: _ClassVar[int]
    MIN_REVISION_FIELD_NUMBER: _ClassVar[int]
    module: str
    needs: _containers.RepeatedCompositeFieldContainer[Record]
    min_revision: int
    def __init__(self, module: _Optional[str] = ..., needs: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., min_revision: _Optional[int] = ...) -> None: ...

class DeclareRequest(_message.Message):
    __slots__ = ("manifest", "withdraw")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    manifest: bytes
    withdraw: bool
    def __init__(self, manifest: _Optional[bytes] = ..., withdraw: _Optional[bool] = ...) -> None: ...

class BindRequest(_message.Message):
    __slots__ = ("key", "value", "unbind")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UNBIND_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    unbind: bool
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., unbind: _Optional[bool] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("bucket", "key", "revision", "digest")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    key: str
    revision: int
    digest: str
    def __init__(self, bucket: _Optional[str] = ..., key: _Optional[str] = ..., revision: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ("revision", "written", "deleted", "unchanged")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    revision: int
    written: int
    deleted: int
    unchanged: int
    def __init__(self, revision: _Optional[int] = ..., written: _Optional[int] = ..., deleted: _Optional[int] = ..., unchanged: _Optional[int] = ...) -> None: ...
