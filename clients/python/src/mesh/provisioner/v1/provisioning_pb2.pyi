from mesh.provisioner.v1 import compose_pb2 as _compose_pb2
from mesh.provisioner.v1 import registry_pb2 as _registry_pb2
from mesh.provisioner.v1 import state_pb2 as _state_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class What(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WHAT_UNSPECIFIED: _ClassVar[What]
    WHAT_REGISTRY: _ClassVar[What]
    WHAT_NEEDS: _ClassVar[What]
    WHAT_APPLIED: _ClassVar[What]
    WHAT_COLLECT: _ClassVar[What]
    WHAT_MANIFESTS: _ClassVar[What]
WHAT_UNSPECIFIED: What
WHAT_REGISTRY: What
WHAT_NEEDS: What
WHAT_APPLIED: What
WHAT_COLLECT: What
WHAT_MANIFESTS: What

class ProvisioningRequest(_message.Message):
    __slots__ = ("what", "node", "module", "contributor", "collection", "min_revision", "page_size", "page_token")
    WHAT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    MIN_REVISION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    what: What
    node: str
    module: str
    contributor: str
    collection: str
    min_revision: int
    page_size: int
    page_token: str
    def __init__(self, what: _Optional[_Union[What, str]] = ..., node: _Optional[str] = ..., module: _Optional[str] = ..., contributor: _Optional[str] = ..., collection: _Optional[str] = ..., min_revision: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ProvisioningResponse(_message.Message):
    __slots__ = ("what", "revision", "registry", "needs", "applied", "collect", "manifests", "malformed", "next_page_token", "behind")
    WHAT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    NEEDS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    COLLECT_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    MALFORMED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    what: What
    revision: int
    registry: _containers.RepeatedCompositeFieldContainer[RegistryRecord]
    needs: _containers.RepeatedCompositeFieldContainer[NeedRecord]
    applied: _containers.RepeatedCompositeFieldContainer[AppliedRecord]
    collect: _containers.RepeatedCompositeFieldContainer[CollectRecord]
    manifests: _containers.RepeatedCompositeFieldContainer[ManifestRecord]
    malformed: _containers.RepeatedCompositeFieldContainer[MalformedKey]
    next_page_token: str
    behind: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, what: _Optional[_Union[What, str]] = ..., revision: _Optional[int] = ..., registry: _Optional[_Iterable[_Union[RegistryRecord, _Mapping]]] = ..., needs: _Optional[_Iterable[_Union[NeedRecord, _Mapping]]] = ..., applied: _Optional[_Iterable[_Union[AppliedRecord, _Mapping]]] = ..., collect: _Optional[_Iterable[_Union[CollectRecord, _Mapping]]] = ..., manifests: _Optional[_Iterable[_Union[ManifestRecord, _Mapping]]] = ..., malformed: _Optional[_Iterable[_Union[MalformedKey, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., behind: _Optional[_Iterable[str]] = ...) -> None: ...

class RegistryRecord(_message.Message):
    __slots__ = ("kind", "entry", "revision")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    entry: _registry_pb2.RegistryEntry
    revision: int
    def __init__(self, kind: _Optional[str] = ..., entry: _Optional[_Union[_registry_pb2.RegistryEntry, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class NeedRecord(_message.Message):
    __slots__ = ("node", "module", "kind", "name", "need", "revision")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    node: str
    module: str
    kind: str
    name: str
    need: _state_pb2.Need
    revision: int
    def __init__(self, node: _Optional[str] = ..., module: _Optional[str] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., need: _Optional[_Union[_state_pb2.Need, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class AppliedRecord(_message.Message):
    __slots__ = ("node", "module", "applied", "revision")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    node: str
    module: str
    applied: _state_pb2.Applied
    revision: int
    def __init__(self, node: _Optional[str] = ..., module: _Optional[str] = ..., applied: _Optional[_Union[_state_pb2.Applied, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class CollectRecord(_message.Message):
    __slots__ = ("node", "collection", "contributor", "item", "revision")
    NODE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    node: str
    collection: str
    contributor: str
    item: _state_pb2.CollectItem
    revision: int
    def __init__(self, node: _Optional[str] = ..., collection: _Optional[str] = ..., contributor: _Optional[str] = ..., item: _Optional[_Union[_state_pb2.CollectItem, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class ManifestRecord(_message.Message):
    __slots__ = ("node", "provider", "manifest", "digest", "revision")
    NODE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    node: str
    provider: str
    manifest: _state_pb2.Manifest
    digest: str
    revision: int
    def __init__(self, node: _Optional[str] = ..., provider: _Optional[str] = ..., manifest: _Optional[_Union[_state_pb2.Manifest, _Mapping]] = ..., digest: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class MalformedKey(_message.Message):
    __slots__ = ("bucket", "key", "reason", "revision")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    key: str
    reason: str
    revision: int
    def __init__(self, bucket: _Optional[str] = ..., key: _Optional[str] = ..., reason: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...
