import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from mesh.provisioner.v1 import registry_pb2 as _registry_pb2
from mesh.provisioner.v1 import state_pb2 as _state_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RefusalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_REASON_UNSPECIFIED: _ClassVar[RefusalReason]
    REFUSAL_REASON_NO_DOMAIN: _ClassVar[RefusalReason]
    REFUSAL_REASON_UNFILLABLE_KEY_SHAPE: _ClassVar[RefusalReason]
    REFUSAL_REASON_MALFORMED_NEED: _ClassVar[RefusalReason]
    REFUSAL_REASON_NOT_OFFERED: _ClassVar[RefusalReason]
    REFUSAL_REASON_NO_MANIFEST: _ClassVar[RefusalReason]
REFUSAL_REASON_UNSPECIFIED: RefusalReason
REFUSAL_REASON_NO_DOMAIN: RefusalReason
REFUSAL_REASON_UNFILLABLE_KEY_SHAPE: RefusalReason
REFUSAL_REASON_MALFORMED_NEED: RefusalReason
REFUSAL_REASON_NOT_OFFERED: RefusalReason
REFUSAL_REASON_NO_MANIFEST: RefusalReason

class Revisions(_message.Message):
    __slots__ = ("registry", "needs", "applied", "collect", "manifests", "bound")
    class BoundEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    NEEDS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    COLLECT_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    registry: int
    needs: int
    applied: int
    collect: int
    manifests: int
    bound: _containers.ScalarMap[str, int]
    def __init__(self, registry: _Optional[int] = ..., needs: _Optional[int] = ..., applied: _Optional[int] = ..., collect: _Optional[int] = ..., manifests: _Optional[int] = ..., bound: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ComposeRequest(_message.Message):
    __slots__ = ("node", "module", "min_revisions", "page_size", "page_token")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    MIN_REVISIONS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node: str
    module: str
    min_revisions: Revisions
    page_size: int
    page_token: str
    def __init__(self, node: _Optional[str] = ..., module: _Optional[str] = ..., min_revisions: _Optional[_Union[Revisions, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ComposeResponse(_message.Message):
    __slots__ = ("node", "module", "plans", "provisions", "refusals", "phases", "revisions", "next_page_token", "behind", "plan_digest")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    PROVISIONS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    node: str
    module: str
    plans: _containers.RepeatedCompositeFieldContainer[ModulePlan]
    provisions: _containers.RepeatedCompositeFieldContainer[Provision]
    refusals: _containers.RepeatedCompositeFieldContainer[Refusal]
    phases: _containers.RepeatedCompositeFieldContainer[Phase]
    revisions: Revisions
    next_page_token: str
    behind: _containers.RepeatedScalarFieldContainer[str]
    plan_digest: str
    def __init__(self, node: _Optional[str] = ..., module: _Optional[str] = ..., plans: _Optional[_Iterable[_Union[ModulePlan, _Mapping]]] = ..., provisions: _Optional[_Iterable[_Union[Provision, _Mapping]]] = ..., refusals: _Optional[_Iterable[_Union[Refusal, _Mapping]]] = ..., phases: _Optional[_Iterable[_Union[Phase, _Mapping]]] = ..., revisions: _Optional[_Union[Revisions, _Mapping]] = ..., next_page_token: _Optional[str] = ..., behind: _Optional[_Iterable[str]] = ..., plan_digest: _Optional[str] = ...) -> None: ...

class PlanDigest(_message.Message):
    __slots__ = ("digest", "revisions")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    digest: str
    revisions: Revisions
    def __init__(self, digest: _Optional[str] = ..., revisions: _Optional[_Union[Revisions, _Mapping]] = ...) -> None: ...

class ModulePlan(_message.Message):
    __slots__ = ("module", "items", "wanted_build", "newest_build")
    MODULE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    WANTED_BUILD_FIELD_NUMBER: _ClassVar[int]
    NEWEST_BUILD_FIELD_NUMBER: _ClassVar[int]
    module: str
    items: _containers.RepeatedCompositeFieldContainer[PlanItem]
    wanted_build: str
    newest_build: str
    def __init__(self, module: _Optional[str] = ..., items: _Optional[_Iterable[_Union[PlanItem, _Mapping]]] = ..., wanted_build: _Optional[str] = ..., newest_build: _Optional[str] = ...) -> None: ...

class PlanItem(_message.Message):
    __slots__ = ("kind", "name", "placeholder", "owner", "bucket", "verb", "collection", "items", "revision", "builds")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    VERB_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    BUILDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    placeholder: str
    owner: str
    bucket: BucketKey
    verb: _registry_pb2.VerbSource
    collection: str
    items: _containers.RepeatedCompositeFieldContainer[CollectedItem]
    revision: int
    builds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., placeholder: _Optional[str] = ..., owner: _Optional[str] = ..., bucket: _Optional[_Union[BucketKey, _Mapping]] = ..., verb: _Optional[_Union[_registry_pb2.VerbSource, _Mapping]] = ..., collection: _Optional[str] = ..., items: _Optional[_Iterable[_Union[CollectedItem, _Mapping]]] = ..., revision: _Optional[int] = ..., builds: _Optional[_Iterable[str]] = ...) -> None: ...

class CollectedItem(_message.Message):
    __slots__ = ("contributor", "item", "revision")
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    contributor: str
    item: _state_pb2.CollectItem
    revision: int
    def __init__(self, contributor: _Optional[str] = ..., item: _Optional[_Union[_state_pb2.CollectItem, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class BucketKey(_message.Message):
    __slots__ = ("bucket", "key")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    key: str
    def __init__(self, bucket: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class Provision(_message.Message):
    __slots__ = ("provider", "bucket", "key", "module", "provision", "local", "name", "node", "builds", "bound_revision", "manifest_digest")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    PROVISION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    BUILDS_FIELD_NUMBER: _ClassVar[int]
    BOUND_REVISION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    provider: str
    bucket: str
    key: str
    module: str
    provision: str
    local: str
    name: str
    node: str
    builds: _containers.RepeatedScalarFieldContainer[str]
    bound_revision: int
    manifest_digest: str
    def __init__(self, provider: _Optional[str] = ..., bucket: _Optional[str] = ..., key: _Optional[str] = ..., module: _Optional[str] = ..., provision: _Optional[str] = ..., local: _Optional[str] = ..., name: _Optional[str] = ..., node: _Optional[str] = ..., builds: _Optional[_Iterable[str]] = ..., bound_revision: _Optional[int] = ..., manifest_digest: _Optional[str] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("key", "module", "kind", "name", "reason", "detail", "builds")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    BUILDS_FIELD_NUMBER: _ClassVar[int]
    key: str
    module: str
    kind: str
    name: str
    reason: RefusalReason
    detail: str
    builds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., module: _Optional[str] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., reason: _Optional[_Union[RefusalReason, str]] = ..., detail: _Optional[str] = ..., builds: _Optional[_Iterable[str]] = ...) -> None: ...

class Phase(_message.Message):
    __slots__ = ("name", "duration")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    duration: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
