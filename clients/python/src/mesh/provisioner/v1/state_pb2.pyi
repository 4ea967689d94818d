import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Need(_message.Message):
    __slots__ = ("placeholder", "provider", "provision", "local", "required", "builds")
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVISION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    BUILDS_FIELD_NUMBER: _ClassVar[int]
    placeholder: str
    provider: str
    provision: str
    local: str
    required: bool
    builds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, placeholder: _Optional[str] = ..., provider: _Optional[str] = ..., provision: _Optional[str] = ..., local: _Optional[str] = ..., required: _Optional[bool] = ..., builds: _Optional[_Iterable[str]] = ...) -> None: ...

class Applied(_message.Message):
    __slots__ = ("plan_digest", "applied_at", "placeholders", "wanted_build", "newest_build")
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    APPLIED_AT_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDERS_FIELD_NUMBER: _ClassVar[int]
    WANTED_BUILD_FIELD_NUMBER: _ClassVar[int]
    NEWEST_BUILD_FIELD_NUMBER: _ClassVar[int]
    plan_digest: str
    applied_at: _timestamp_pb2.Timestamp
    placeholders: _containers.RepeatedScalarFieldContainer[str]
    wanted_build: str
    newest_build: str
    def __init__(self, plan_digest: _Optional[str] = ..., applied_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., placeholders: _Optional[_Iterable[str]] = ..., wanted_build: _Optional[str] = ..., newest_build: _Optional[str] = ...) -> None: ...

class CollectItem(_message.Message):
    __slots__ = ("value", "order", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    value: str
    order: int
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, value: _Optional[str] = ..., order: _Optional[int] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("offers", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    offers: _containers.RepeatedCompositeFieldContainer[Offer]
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, offers: _Optional[_Iterable[_Union[Offer, _Mapping]]] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Offer(_message.Message):
    __slots__ = ("provision", "description", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROVISION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    provision: str
    description: str
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, provision: _Optional[str] = ..., description: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...
