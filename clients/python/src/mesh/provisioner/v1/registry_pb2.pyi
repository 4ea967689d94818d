from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegistryEntry(_message.Message):
    __slots__ = ("kind", "owner", "bucket", "verb", "description")
    KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    VERB_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    owner: str
    bucket: BucketSource
    verb: VerbSource
    description: str
    def __init__(self, kind: _Optional[str] = ..., owner: _Optional[str] = ..., bucket: _Optional[_Union[BucketSource, _Mapping]] = ..., verb: _Optional[_Union[VerbSource, _Mapping]] = ..., description: _Optional[str] = ...) -> None: ...

class BucketSource(_message.Message):
    __slots__ = ("bucket", "key_shape", "collection")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_SHAPE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    key_shape: str
    collection: str
    def __init__(self, bucket: _Optional[str] = ..., key_shape: _Optional[str] = ..., collection: _Optional[str] = ...) -> None: ...

class VerbSource(_message.Message):
    __slots__ = ("seat", "subject")
    SEAT_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    seat: str
    subject: str
    def __init__(self, seat: _Optional[str] = ..., subject: _Optional[str] = ...) -> None: ...
