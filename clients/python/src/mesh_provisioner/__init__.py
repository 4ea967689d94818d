"""The Python client of the mesh-provisioner NATS micro service.

ProvisionerClient asks both verbs (provisioning and compose) over a nats-py
connection; ProvisionerError is a refusal, with its code and sentence. The
contract's messages (package mesh.provisioner.v1) are generated from proto/
into the package mesh.provisioner.v1 and re-exported here.
"""

from mesh.provisioner.v1.compose_pb2 import (
    BucketKey,
    CollectedItem,
    ComposeRequest,
    ComposeResponse,
    ModulePlan,
    Phase,
    PlanItem,
    Provision,
    Refusal,
    RefusalReason,
    Revisions,
)
from mesh.provisioner.v1.provisioning_pb2 import (
    WHAT_APPLIED,
    WHAT_COLLECT,
    WHAT_NEEDS,
    WHAT_REGISTRY,
    WHAT_UNSPECIFIED,
    AppliedRecord,
    CollectRecord,
    MalformedKey,
    NeedRecord,
    ProvisioningRequest,
    ProvisioningResponse,
    RegistryRecord,
    What,
)
from mesh.provisioner.v1.registry_pb2 import BucketSource, RegistryEntry, VerbSource
from mesh.provisioner.v1.state_pb2 import Applied, CollectItem, Need

from .client import (
    COMPOSE_SUBJECT,
    CONTENT_TYPE_PROTOBUF,
    PROVISIONING_SUBJECT,
    SERVICE_NAME,
    EndpointInfo,
    EndpointStats,
    EndpointStatsData,
    InfoResponse,
    ProvisionerClient,
    ProvisionerError,
    ServiceIdentity,
    StatsResponse,
    error_of,
    join_compose_pages,
    join_provisioning_pages,
)

__all__ = [
    "COMPOSE_SUBJECT",
    "CONTENT_TYPE_PROTOBUF",
    "PROVISIONING_SUBJECT",
    "SERVICE_NAME",
    "WHAT_APPLIED",
    "WHAT_COLLECT",
    "WHAT_NEEDS",
    "WHAT_REGISTRY",
    "WHAT_UNSPECIFIED",
    "Applied",
    "AppliedRecord",
    "BucketKey",
    "BucketSource",
    "CollectItem",
    "CollectRecord",
    "CollectedItem",
    "ComposeRequest",
    "ComposeResponse",
    "EndpointInfo",
    "EndpointStats",
    "EndpointStatsData",
    "InfoResponse",
    "MalformedKey",
    "ModulePlan",
    "Need",
    "NeedRecord",
    "Phase",
    "PlanItem",
    "Provision",
    "ProvisionerClient",
    "ProvisionerError",
    "ProvisioningRequest",
    "ProvisioningResponse",
    "Refusal",
    "RefusalReason",
    "RegistryEntry",
    "RegistryRecord",
    "Revisions",
    "ServiceIdentity",
    "StatsResponse",
    "VerbSource",
    "What",
    "error_of",
    "join_compose_pages",
    "join_provisioning_pages",
]
