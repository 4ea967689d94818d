from mesh.provisioner.v1 import compose_pb2 as _compose_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProvisionsRequest(_message.Message):
    __slots__ = ("provider", "min_revisions", "page_size", "page_token")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MIN_REVISIONS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    provider: str
    min_revisions: _compose_pb2.Revisions
    page_size: int
    page_token: str
    def __init__(self, provider: _Optional[str] = ..., min_revisions: _Optional[_Union[_compose_pb2.Revisions, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ProvisionsResponse(_message.Message):
    __slots__ = ("provider", "provisions", "revisions", "next_page_token", "behind")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVISIONS_FIELD_NUMBER: _ClassVar[int]
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    provider: str
    provisions: _containers.RepeatedCompositeFieldContainer[_compose_pb2.Provision]
    revisions: _compose_pb2.Revisions
    next_page_token: str
    behind: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, provider: _Optional[str] = ..., provisions: _Optional[_Iterable[_Union[_compose_pb2.Provision, _Mapping]]] = ..., revisions: _Optional[_Union[_compose_pb2.Revisions, _Mapping]] = ..., next_page_token: _Optional[str] = ..., behind: _Optional[_Iterable[str]] = ...) -> None: ...
