"""An asyncio client of the mesh-provisioner NATS micro service, on nats-py.

The wire contract is docs/protocol.md in the repository.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator
from typing import Any, Literal, NamedTuple, TypedDict, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import ConnectionReconnectingError, NoRespondersError, OutboundBufferLimitError
from nats.nuid import NUID

from mesh.provisioner.v1.compose_pb2 import (
    ComposeRequest,
    ComposeResponse,
    ModulePlan,
    PlanDigest,
    PlanItem,
    Provision,
    Revisions,
)
from mesh.provisioner.v1.provisioning_pb2 import ProvisioningRequest, ProvisioningResponse, What
from mesh.provisioner.v1.provisions_pb2 import ProvisionsRequest, ProvisionsResponse
from mesh.provisioner.v1.state_pb2 import Applied, CollectItem, Manifest, Need
from mesh.provisioner.v1.stats_pb2 import EndpointStatsData
from mesh.provisioner.v1.write_pb2 import (
    ApplyRequest,
    ApplyResponse,
    BindRequest,
    DeclareRequest,
    DeleteRequest,
    PutRequest,
    Record,
    WriteResponse,
)

SERVICE_NAME = "mesh-provisioner"
"""The micro service's name, as discovery shows it."""
PROVISIONING_SUBJECT = f"{SERVICE_NAME}.provisioning"
"""The subject of the verb that reads the registry and the state buckets."""
COMPOSE_SUBJECT = f"{SERVICE_NAME}.compose"
"""The subject of the verb that composes a node."""
PROVISIONS_SUBJECT = f"{SERVICE_NAME}.provisions"
"""The provisions verb's subject before the provider's token: a provider asks
provider_subject(provider), mesh-provisioner.provisions.<provider>."""
PUT_SUBJECT = f"{SERVICE_NAME}.put"
"""The put verb's subject before the node's token: a node writes one record
on mesh-provisioner.put.<node>."""
DELETE_SUBJECT = f"{SERVICE_NAME}.delete"
"""The delete verb's subject before the node's token: mesh-provisioner.delete.<node>."""
APPLY_SUBJECT = f"{SERVICE_NAME}.apply"
"""The apply verb's subject before the node's token, which replaces the whole
set of a module's needs: mesh-provisioner.apply.<node>."""
DECLARE_SUBJECT = f"{SERVICE_NAME}.declare"
"""The declare verb's subject before the node's and the provider's tokens:
declare_subject(node, provider), mesh-provisioner.declare.<node>.<provider>."""
BIND_SUBJECT = f"{SERVICE_NAME}.bind"
"""The bind verb's subject before the provider's token: bind_subject(provider),
mesh-provisioner.bind.<provider>, where a provider writes its bucket
<provider>_bound."""
PLANS_BUCKET = f"{SERVICE_NAME}_plans"
"""The bucket where the seat's holder keeps each node's plan digest: key
<node>, value a PlanDigest. watch_plan hears the writes of a node's key (it
reads nothing of the bucket)."""
RUNS_AS_API_PREFIX = "$PROVISIONER.API"
"""Where a node hears the writes of its plan's key when the server runs in an
account of its own (runs-as: mesh-provisioner permissions --runs-as), which
each node's account imports under this prefix: the Go wire.RunsAsAPIPrefix.
Give it to ProvisionerClient(api_prefix=...) for watch_plan. The verbs,
writes included, are imported at their own subjects."""
CONTENT_TYPE_PROTOBUF = "application/protobuf"
INBOX_ROOT = "_INBOX_MESH"
"""Starts every inbox prefix of the mesh's identities; not nats-py's default
_INBOX, which no generated permission set grants."""

Role = Literal["node", "provider", "operator"]
"""What an identity on the mesh is: its inbox prefix and its permissions
follow from it (mesh-provisioner permissions --node, --provider, --operator)."""

# The most bytes a name may take: a node's, a provider's, or any other a
# request gives (the Go keys.MaxNameLen); the service refuses a longer one.
_MAX_NAME_LEN = 256
# The most characters of a name an error echoes (the Go keys.MaxEchoed).
_MAX_ECHOED = 64


def _echo(name: str) -> str:
    """name as an error echoes it: its first 64 characters and "…" when
    longer (the Go keys.Echo)."""
    return name if len(name) <= _MAX_ECHOED else name[:_MAX_ECHOED] + "…"


def _name_error(name: str) -> str | None:
    """Why name cannot be the name of a node, a provider or any identity of
    the mesh, or None when it can: it must be a key's token (not empty, and
    only the bytes A-Z a-z 0-9 - _ = /) of at most 256 bytes, the rule of
    docs/protocol.md ("Buckets and keys") that the Go keys.NodeFilter checks
    and the service holds every name to."""
    data = name.encode(errors="surrogatepass")
    if len(data) > _MAX_NAME_LEN:
        return f"is {len(data)} bytes, more than the {_MAX_NAME_LEN} a name may take: shorten it"
    if not data:
        return "is empty"
    for i, b in enumerate(data):
        if not _token_byte(b, False):
            shown = repr(chr(b)) if 0x20 < b < 0x7F else f"byte 0x{b:02x}"
            return f"holds {shown} at byte {i}; a token holds only A-Z a-z 0-9 - _ = /"
    return None


def _check_name(what: str, name: str) -> None:
    """Raises ValueError when name cannot be the name of what ("node",
    "provider", "a node's name"...): see _name_error."""
    why = _name_error(name)
    if why is not None:
        raise ValueError(f"{what} {_echo(name)!r} {why}")


def inbox_prefix(role: Role, name: str) -> str:
    """The inbox prefix of a mesh identity, _INBOX_MESH.<role>.<name>: the one
    its permissions let it subscribe to. Give it to nats-py when you connect,
    or no answer can reach you::

        nc = await nats.connect(url, inbox_prefix=inbox_prefix("node", "ace"), ...)

    The service answers a request on a node's (or provider's) own subject
    only to that identity's inbox (or an operator's, or nats-py's default
    _INBOX): a node asking with another node's prefix gets no answer.

    Raises ValueError if name is not an identity's name: a key's token (not
    empty, only A-Z a-z 0-9 - _ = /) of at most 256 bytes, as the
    permissions (mesh-provisioner permissions) and the service hold it.
    """
    _check_name(f"a {role}'s name", name)
    return f"{INBOX_ROOT}.{role}.{name}"


def node_subject(verb_subject: str, node: str) -> str:
    """A verb's node-addressed subject: node_subject(COMPOSE_SUBJECT, "ace")
    is "mesh-provisioner.compose.ace". A node's permissions grant its own, and
    the service answers there only what is the node's (and the registry); it
    refuses the rest with a 403."""
    return f"{verb_subject}.{node}"


def provider_subject(provider: str) -> str:
    """The provisions verb's subject of a provider: mesh-provisioner.provisions.<provider>."""
    return f"{PROVISIONS_SUBJECT}.{provider}"


def declare_subject(node: str, provider: str) -> str:
    """The declare verb's subject of node's manifest of a provider it runs:
    mesh-provisioner.declare.<node>.<provider>, which only the nodes that
    the provider's grant names may publish to."""
    return f"{DECLARE_SUBJECT}.{node}.{provider}"


def bind_subject(provider: str) -> str:
    """The bind verb's subject of a provider: mesh-provisioner.bind.<provider>."""
    return f"{BIND_SUBJECT}.{provider}"


def _token_byte(b: int, escaped: bool) -> bool:
    """Whether byte b may stand in a key's token as itself, as the Go keys
    package says: A-Z a-z 0-9 - _ /, and '=' unless escaped (in an escaped
    token '=' starts an escape)."""
    return (
        0x41 <= b <= 0x5A
        or 0x61 <= b <= 0x7A
        or 0x30 <= b <= 0x39
        or b in (0x2D, 0x5F, 0x2F)
        or (b == 0x3D and not escaped)
    )


def escape_name(name: str) -> str:
    """The token that stands for a need's or a collection's readable name in
    a key, as the Go keys.Escape writes it: every byte of the name's UTF-8
    outside A-Z a-z 0-9 - _ / (so also '.', ':' and '=') is written '=' and
    two upper-case hex digits. escape_name("zsh:normal") is "zsh=3Anormal"."""
    return "".join(chr(b) if _token_byte(b, True) else f"={b:02X}" for b in name.encode())


def _key_of(*parts: tuple[str, str]) -> str:
    """Joins the parts of a key, each checked as the Go keys.CheckToken does:
    not empty, and only A-Z a-z 0-9 - _ = /. Raises ValueError naming the
    first part that is not a token."""
    for what, value in parts:
        if not value:
            raise ValueError(f"invalid key part: {what} {value!r} is empty")
        for i, b in enumerate(value.encode()):
            if not _token_byte(b, False):
                raise ValueError(
                    f"invalid key part: {what} {value!r} holds {chr(b)!r} at byte {i}; "
                    "a token holds only A-Z a-z 0-9 - _ = /"
                )
    return ".".join(value for _, value in parts)


def need_key(node: str, module: str, kind: str, name: str) -> str:
    """The key of a need in the needs bucket, as the Go keys.NeedKey builds
    it: <node>.<module>.<kind>.<name>, the name (the placeholder's readable
    name, "zsh:normal" of ${shell:zsh:normal}) escaped by escape_name.

    Raises ValueError when name is empty or another part is not a token."""
    if not name:
        raise ValueError("invalid key part: name is empty")
    return _key_of(("node", node), ("module", module), ("kind", kind), ("name", escape_name(name)))


def applied_key(node: str, module: str) -> str:
    """The key of a module's applied record: <node>.<module>. Raises
    ValueError when a part is not a token."""
    return _key_of(("node", node), ("module", module))


def collect_key(node: str, collection: str, contributor: str) -> str:
    """The key of a contributor's item of a collection:
    <node>.<collection>.<contributor>, the collection's readable name
    escaped by escape_name. Raises ValueError when the collection is empty
    or another part is not a token."""
    if not collection:
        raise ValueError("invalid key part: collection is empty")
    return _key_of(("node", node), ("collection", escape_name(collection)), ("contributor", contributor))


def manifest_key(node: str, provider: str) -> str:
    """The key of a node's manifest of a provider it runs: <node>.<provider>.
    Raises ValueError when a part is not a token."""
    return _key_of(("node", node), ("provider", provider))


def manifest_digest(manifest: bytes) -> str:
    """The digest of a manifest as stored (its binary encoding):
    "sha256:<hex>", as the Go wire.ManifestDigest computes it and as
    compositions name it in Provision.manifest_digest."""
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def _encode(value: Message) -> bytes:
    """A record's value in protobuf binary, deterministically (map entries by
    key, as Go's Deterministic encoding writes them): the same record is the
    same bytes, which an apply finds unchanged and a manifest's digest names."""
    return value.SerializeToString(deterministic=True)


class ModuleNeed(NamedTuple):
    """One need of a module's whole set (ProvisionerClient.apply_needs): the
    placeholder ${kind:name} and what the module needs for it."""

    kind: str
    """The placeholder's kind: port of ${port:http}."""
    name: str
    """The placeholder's readable name, escaped in the key: zsh:normal of ${shell:zsh:normal}."""
    need: Need
    """What the module needs."""


class DeclaredManifest(NamedTuple):
    """Where ProvisionerClient.put_manifest stored a manifest."""

    digest: str
    """"sha256:<hex>" of the manifest's bytes as stored: what compositions
    name in Provision.manifest_digest."""
    revision: int
    """The revision of the manifests bucket it was written at."""

# The NATS service API headers of a refused request.
_ERROR_HEADER = "Nats-Service-Error"
_ERROR_CODE_HEADER = "Nats-Service-Error-Code"
# Once one instance has answered a discovery request, discovery ends when no
# other answers within this many seconds.
_DISCOVERY_STALL = 0.3

# How long the client waits, in seconds, each the Go client's
# (conformance/clients/timeouts.json holds the three clients to them).
DEFAULT_READ_TIMEOUT = 10.0
"""Seconds a read (provisioning, compose, provisions) waits for its answer
when neither the call nor the client sets a timeout: more than the time a
server waits for the revisions a request asks for (5 s by default, its
--revision-wait), so that its 503 arrives before the client gives up. The Go
client's reads take their bound from their context."""
DEFAULT_WRITE_TIMEOUT = 5.0
"""Seconds a write (a node's put, delete, apply, declare; a provider's bind)
waits for its answer when neither the call nor the client sets a timeout:
the Go nodeclient.DefaultTimeout."""
WATCH_COMPOSE_TIMEOUT = 30.0
"""Seconds one composition that watch_plan asks may take, every page of it,
unless its timeout argument says otherwise: one lost with its connection, or
with the instance that took it, is asked again, not waited for as long as the
watch lasts. The Go client's watchComposeTimeout."""
WATCH_FLUSH_TIMEOUT = 5.0
"""Seconds watch_plan waits for its subscription to be in place at the NATS
server (the round trip of a flush) before its first composition. The Go
client's watchFlushTimeout."""
WATCH_RETRY_MIN = 0.1
"""Seconds watch_plan pauses first before it asks a composition again, after a
503 or no answer; each pause doubles the one before, up to WATCH_RETRY_MAX
(docs/protocol.md: "backing off from 100 ms to 2 s"). The Go client's
watchRetryMin."""
WATCH_RETRY_MAX = 2.0
"""The longest pause of watch_plan between two asks of a composition, in
seconds. The Go client's watchRetryMax."""
# How long watch_plan waits for a write of the node's key before it looks
# whether the connection reconnected, in seconds.
_WATCH_RECONNECT_CHECK = 0.25
_Answer = TypeVar(
    "_Answer", ProvisioningResponse, ComposeResponse, ProvisionsResponse, WriteResponse, ApplyResponse
)


class ProvisionerError(Exception):
    """A request the service refused, with its code and its sentence.

    code is 400 (bad request: do not retry as is; for a write, a malformed
    key, a value that does not decode, a record of the wrong bucket, or a
    need of another module in an apply), 403 (forbidden: a request on a
    node's or a provider's own subject asked for what is not its own:
    another node's records or plan, or every node's, or a write of another
    node's key), 413 (too large: a write's value over the bucket's largest,
    64 KiB by default, or over the node's budget of keys or bytes), 503 (not ready: the
    server's copy is loading, did not reach the revisions asked for in time,
    or the server is stopping; ask again shortly) or 500 (internal, such as an
    answer too large for NATS: narrow the request); 0 if the reply's code is
    not a number. description is the service's sentence: what is wrong and
    what to do.
    """

    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{SERVICE_NAME}: {code}: {description}")
        self.code = code
        self.description = description

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProvisionerError) and (self.code, self.description) == (other.code, other.description)

    def __hash__(self) -> int:
        return hash((self.code, self.description))


class WatchStoppedError(Exception):
    """The connection of watch_plan closed while it watched a node's key of
    the plans bucket."""

    def __init__(self, node: str) -> None:
        super().__init__(f"{SERVICE_NAME}: the watcher of {node}'s plan (key {node} of {PLANS_BUCKET}) stopped")
        self.node = node


def _unanswered(err: Exception) -> bool:
    """Whether a request got no answer, and may get one if asked again: no
    instance served its subject (one starting or restarting, or the node
    started before the service: NoRespondersError), it timed out (lost with
    its connection, or with the instance that took it: nats-py's
    TimeoutError, an asyncio.TimeoutError, which is the builtin
    TimeoutError), or the connection was down when it was sent
    (OutboundBufferLimitError: nats-py buffers nothing more while it
    reconnects; ConnectionReconnectingError). A closed connection
    (ConnectionClosedError) answers nothing again: it is not one."""
    return isinstance(err, (NoRespondersError, TimeoutError, OutboundBufferLimitError, ConnectionReconnectingError))


def _plan_subject(node: str) -> str:
    """The subject of node's key of PLANS_BUCKET, on which each write of it is a message."""
    return f"$KV.{PLANS_BUCKET}.{node}"


def _own_write(msg: Msg, subject: str) -> bool:
    """Whether msg is a write of the key whose subject is subject, as the
    stream publishes it: not an answer of JetStream's aimed there (a direct
    get's carries Nats-Stream; a publish's acknowledgement is JSON, which
    decodes as no digest), nor a message of another key's (another
    Nats-Subject). A reply subject does not tell: the service's own write
    carries one, where JetStream acknowledges it to the service (as the Go
    client's watch, this hears it)."""
    if msg.subject != subject:
        return False
    headers = msg.headers or {}
    if headers.get("Nats-Stream"):
        return False
    other = headers.get("Nats-Subject")
    return not other or other == subject


def _plan_digest_of(msg: Msg) -> PlanDigest | None:
    """The digest a write heard of node's key carries: None for a removal (a delete or purge marker, or
    the server's marker of a key removed; the plan is what it was) and for
    a value that is not a digest (the next write will be)."""
    headers = msg.headers or {}
    if headers.get("KV-Operation") in ("DEL", "PURGE") or headers.get("Nats-Marker-Reason") in (
        "MaxAge",
        "Purge",
        "Remove",
    ):
        return None
    digest = PlanDigest()
    try:
        digest.ParseFromString(msg.data)
    except DecodeError:
        return None
    return digest if digest.digest else None


def error_of(headers: dict[str, str] | None) -> ProvisionerError | None:
    """Returns the refusal a reply's headers carry, or None for an answer."""
    headers = headers or {}
    description = headers.get(_ERROR_HEADER, "")
    code = headers.get(_ERROR_CODE_HEADER, "")
    if not description and not code:
        return None
    try:
        number = int(code)
    except ValueError:
        number = 0
    return ProvisionerError(number, description)


class ServiceIdentity(TypedDict):
    """What every discovery answer says of the instance that sent it."""

    name: str
    id: str
    version: str
    metadata: dict[str, str] | None
    type: str


class EndpointInfo(TypedDict):
    name: str
    subject: str
    queue_group: str
    metadata: dict[str, str] | None


class InfoResponse(ServiceIdentity):
    description: str
    endpoints: list[EndpointInfo]


class EndpointStats(TypedDict, total=False):
    name: str
    subject: str
    queue_group: str
    num_requests: int
    num_errors: int
    last_error: str
    processing_time: int
    average_processing_time: int
    # The service's own counts of the endpoint and the state of the
    # instance's copy: the JSON "data" decoded as an EndpointStatsData,
    # skipping fields the message does not define (a newer instance's).
    data: EndpointStatsData


class StatsResponse(ServiceIdentity):
    started: str
    endpoints: list[EndpointStats]


class ProvisionerClient:
    """Asks the mesh-provisioner service over a connection the caller opened
    (with its credentials and its inbox prefix: see inbox_prefix) and owns.

    node, if set, is the node the client asks as: provisioning and compose go
    to the node's own subjects, mesh-provisioner.provisioning.<node> and
    mesh-provisioner.compose.<node>, which is all a node's permissions grant.
    The service answers there only the node's own records, its own
    composition and the registry, and refuses the rest with a
    ProvisionerError of code 403; requests still name the node. Unset (an
    operator), the unscoped subjects.

    subject, compose_subject and provisions_subject are the verbs' subjects
    (before the node's or provider's token), for a service behind a subject
    mapping or an account import.

    node is also the node the client writes for: put_need, apply_needs,
    put_applied, put_collect_item, put_manifest and their deletes go to the
    write verbs on the node's own subjects (mesh-provisioner.put.<node>,
    .delete.<node>, .apply.<node>, .declare.<node>.<provider>). The service
    is the only writer of the buckets: a node needs, and its permissions
    grant, no JetStream publish at all.

    provider, if set, is the provider the client binds as: bind and unbind
    go to mesh-provisioner.bind.<provider>, all of the write verbs a
    provider's permissions grant.

    api_prefix is where the plans' key subjects are reached, for
    watch_plan: RUNS_AS_API_PREFIX when the server runs in an account of its
    own (runs-as), where each node's account imports its plan key's subject
    under ($PROVISIONER.API.$KV.<bucket>.<node>). None, the default: in the
    connection's own account ($KV.<bucket>.<node>). The verbs, writes
    included, are imported at their own subjects, whatever api_prefix.

    timeout, in seconds, bounds each request this client makes, reads and
    writes alike; a call's own timeout takes precedence. None, the default: a
    read waits DEFAULT_READ_TIMEOUT (10 s, more than the 5 s a server waits for
    the revisions a request asks for, so that its 503 arrives before the
    client gives up) and a write DEFAULT_WRITE_TIMEOUT (5 s), as the Go
    client's. It does not bound watch_plan's compositions
    (WATCH_COMPOSE_TIMEOUT).
    """

    def __init__(
        self,
        nc: NATS,
        *,
        node: str | None = None,
        subject: str = PROVISIONING_SUBJECT,
        compose_subject: str = COMPOSE_SUBJECT,
        provisions_subject: str = PROVISIONS_SUBJECT,
        provider: str | None = None,
        api_prefix: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if node is not None:
            _check_name("node", node)
            subject, compose_subject = node_subject(subject, node), node_subject(compose_subject, node)
        if provider is not None:
            _check_name("provider", provider)
        self._nc = nc
        self._node = node
        self._provider = provider
        self._subject = subject
        self._compose_subject = compose_subject
        self._provisions_subject = provisions_subject
        self._api_prefix = api_prefix or None
        self._timeout = timeout
        # By module, the revision of the last write of its needs this client
        # was answered: an apply names it (min_revision), and the service
        # compares the set with its copy once the copy holds it, rather than
        # first asking the bucket.
        self._written: dict[str, int] = {}

    @property
    def node(self) -> str | None:
        """The node the client asks as, or None."""
        return self._node

    @property
    def provider(self) -> str | None:
        """The provider the client binds as, or None."""
        return self._provider

    @property
    def subject(self) -> str:
        """The subject the client asks the provisioning verb on: the node's own with node."""
        return self._subject

    @property
    def compose_subject(self) -> str:
        """The subject the client asks the compose verb on: the node's own with node."""
        return self._compose_subject

    async def provisioning(
        self, request: ProvisioningRequest | None = None, *, timeout: float | None = None
    ) -> ProvisioningResponse:
        """Asks the provisioning verb once: one page of the answer. An empty
        request asks for the registry.

        Raises ProvisionerError when the service refuses the request, and
        nats-py's errors otherwise (NoRespondersError when no instance runs,
        TimeoutError).
        """
        return await self._call(self._subject, request or ProvisioningRequest(), ProvisioningResponse(), timeout, self._as_node())

    async def compose(self, request: ComposeRequest, *, timeout: float | None = None) -> ComposeResponse:
        """Asks the compose verb once for the composition of a node (node is
        required): one page of it. Raises as provisioning does.

        To read your writes, min_revisions names a revision per bucket
        (registry, needs, applied, collect, manifests) and, in its map bound,
        per provider's bucket: Revisions(bound={"postgres_bound": 7}) once
        the provider bound a key at revision 7. The answer's revisions says
        the same of the copy it read. A module of builds answers its plan at
        each (plan_at); a provision's state is is_bound, and those not bound yet are pending."""
        return await self._call(self._compose_subject, request, ComposeResponse(), timeout, self._as_node())

    async def provisions(self, request: ProvisionsRequest, *, timeout: float | None = None) -> ProvisionsResponse:
        """Asks the provisions verb of a provider, on
        mesh-provisioner.provisions.<provider> (request.provider, required),
        for one page of what it must provision across the mesh: every
        provision that any node's bound needs ask of it, in key order, each
        with its node.

        Raises ValueError when the request names no provider (it names the
        subject asked), and otherwise as provisioning does."""
        if not request.provider:
            raise ValueError("provisions: request.provider is required: it names the subject asked")
        return await self._call(
            f"{self._provisions_subject}.{request.provider}", request, ProvisionsResponse(), timeout,
            ("provider", request.provider),
        )

    async def provisions_pages(
        self, request: ProvisionsRequest, *, timeout: float | None = None
    ) -> AsyncIterator[ProvisionsResponse]:
        """Yields every page of a provider's provisions, asking for the next
        one with the previous page's token until a page has none."""
        page_request = ProvisionsRequest()
        page_request.CopyFrom(request)
        while True:
            page = await self.provisions(page_request, timeout=timeout)
            yield page
            if not page.next_page_token:
                return
            page_request.page_token = page.next_page_token

    async def provisions_all(self, request: ProvisionsRequest, *, timeout: float | None = None) -> ProvisionsResponse:
        """Returns every provision of a provider, its pages joined (see join_provisions_pages)."""
        return join_provisions_pages([page async for page in self.provisions_pages(request, timeout=timeout)])

    async def provisioning_pages(
        self, request: ProvisioningRequest | None = None, *, timeout: float | None = None
    ) -> AsyncIterator[ProvisioningResponse]:
        """Yields every page of a provisioning answer, asking for the next
        one with the previous page's token until a page has none."""
        page_request = ProvisioningRequest()
        page_request.CopyFrom(request or ProvisioningRequest())
        while True:
            page = await self.provisioning(page_request, timeout=timeout)
            yield page
            if not page.next_page_token:
                return
            page_request.page_token = page.next_page_token

    async def compose_pages(
        self, request: ComposeRequest, *, timeout: float | None = None
    ) -> AsyncIterator[ComposeResponse]:
        """Yields every page of a composition. A module's plan may continue on
        the next page: compose_all joins them."""
        page_request = ComposeRequest()
        page_request.CopyFrom(request)
        while True:
            page = await self.compose(page_request, timeout=timeout)
            yield page
            if not page.next_page_token:
                return
            page_request.page_token = page.next_page_token

    async def provisioning_all(
        self, request: ProvisioningRequest | None = None, *, timeout: float | None = None
    ) -> ProvisioningResponse:
        """Returns the whole provisioning answer, its pages joined in order."""
        return join_provisioning_pages([page async for page in self.provisioning_pages(request, timeout=timeout)])

    async def compose_all(self, request: ComposeRequest, *, timeout: float | None = None) -> ComposeResponse:
        """Returns the whole composition, its pages joined (see join_compose_pages)."""
        return join_compose_pages([page async for page in self.compose_pages(request, timeout=timeout)])

    async def watch_plan(
        self, node: str, *, timeout: float | None = None
    ) -> AsyncGenerator[ComposeResponse, None]:
        """Yields the composition of a node, whole (its pages joined, as
        compose_all returns it), then a new one each time the node's plan
        changes: each yielded composition's plan_digest differs from the one
        before. The seat's holder keeps every node's digest in the bucket
        PLANS_BUCKET (key <node>, a PlanDigest with the revisions it was
        composed at), and composing with min_revisions set to a digest's
        revisions is at least as new as the digest. Nothing changed costs no
        request::

            async with contextlib.aclosing(client.watch_plan("ace")) as plans:
                async for plan in plans:
                    await apply(plan)

        Each write of the node's key is a message on the key's subject,
        $KV.<bucket>.<node>, to which this subscribes (core NATS: the latest
        write heard is kept, a burst of writes is one change); the
        composition asked first, and again after each reconnect, covers what
        the subscription cannot have heard. A subscription is all a node's
        permissions grant of the bucket (docs/security.md): no consumer, no
        direct get, nothing published into JetStream. Only a write of the
        node's own key is heard: a message that JetStream answered on that
        subject for someone else (it carries Nats-Stream, or another key's
        Nats-Subject) is not. With api_prefix (a runs-as mesh), the subject
        is <api_prefix>.$KV.<bucket>.<node>.

        Stop it by leaving the loop (aclosing closes the generator at once;
        without it, the event loop does when the generator is collected) or
        by cancelling the task that iterates; either way it unsubscribes. A
        503 (the server's copy loading, or behind the digest's revisions) is
        asked again, backing off from 0.1 s to 2 s, and so is a composition
        that got no answer: no instance serving yet (a node started before
        the service, or every instance restarting: NoRespondersError), a
        request that timed out (lost with its connection, or with the
        instance that took it: each composition, every page of it, is bounded
        by timeout, WATCH_COMPOSE_TIMEOUT (30 s) by default whatever the
        client's own timeout), or one the connection could not send while
        reconnecting. The first pause is WATCH_RETRY_MIN, the longest
        WATCH_RETRY_MAX.

        Raises ValueError when node is not a node's name (a key's token of at
        most 256 bytes), nats-py's FlushTimeoutError when the subscription is
        not in place at the server within WATCH_FLUSH_TIMEOUT (5 s),
        ProvisionerError when a
        composition is refused otherwise than with a 503 (400, 403, 500),
        WatchStoppedError when the connection closes, and protobuf's errors
        when a composition fails otherwise than unanswered (a DecodeError of
        its answer)."""
        _check_name("node", node)
        wait = WATCH_COMPOSE_TIMEOUT if timeout is None else timeout
        latest: list[Msg] = []  # the last write heard, if not handled yet
        heard = asyncio.Event()

        subject = self._plan_key_subject(node)

        async def on_write(msg: Msg) -> None:
            if not _own_write(msg, subject):
                return
            latest[:] = [msg]
            heard.set()

        # A reconnect is seen as the connection's count of them changing,
        # looked at while waiting for a write: nats-py takes a single
        # reconnected_cb, set at connect by whoever opened the connection
        # (the caller, not this client), and no listener besides. Counted
        # before the first read, so that a reconnect during it reads again.
        # nats-py counts a reconnect before it subscribes again, but within
        # one step: a read asked once the count changed follows the
        # subscription at the server.
        reconnects = self._nc.stats["reconnects"]
        sub = await self._nc.subscribe(subject, cb=on_write)
        try:
            # The subscription in place at the server before the key is
            # read: a write after the read is heard.
            await self._nc.flush(timeout=math.ceil(WATCH_FLUSH_TIMEOUT))
            composition = await self._compose_at(node, None, wait)
            last = composition.plan_digest
            yield composition
            while True:
                if self._nc.is_closed:
                    raise WatchStoppedError(node)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(heard.wait(), _WATCH_RECONNECT_CHECK)
                record = None
                if heard.is_set():
                    heard.clear()
                    record = _plan_digest_of(latest.pop()) if latest else None
                if self._nc.stats["reconnects"] != reconnects:
                    # Reconnected: what was written meanwhile was not heard;
                    # a composition now is newer than any write heard before.
                    reconnects = self._nc.stats["reconnects"]
                    composition = await self._compose_at(node, None, wait)
                elif record is None or record.digest == last:
                    continue
                else:
                    composition = await self._compose_at(node, record.revisions, wait)
                if composition.plan_digest == last:
                    continue
                last = composition.plan_digest
                yield composition
        finally:
            if not self._nc.is_closed:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    def _plan_key_subject(self, node: str) -> str:
        """The subject on which the client hears the writes of node's key of
        PLANS_BUCKET: the key's own, under api_prefix if set."""
        if self._api_prefix is None:
            return _plan_subject(node)
        return f"{self._api_prefix}.{_plan_subject(node)}"

    async def _compose_at(self, node: str, least: Revisions | None, timeout: float) -> ComposeResponse:
        """The whole composition of node, at least as new as least, for
        watch_plan: a 503, and a request that got no answer (see
        _unanswered), is asked again, backing off, each ask bounded by
        timeout (_compose_within); raises WatchStoppedError once the
        connection is closed, and any other error as is."""
        request = ComposeRequest(node=node)
        if least is not None:
            request.min_revisions.CopyFrom(least)
        retry = WATCH_RETRY_MIN
        while True:
            if self._nc.is_closed:
                raise WatchStoppedError(node)
            try:
                return await self._compose_within(request, timeout)
            except Exception as err:
                if self._nc.is_closed:
                    raise WatchStoppedError(node) from None
                if not (isinstance(err, ProvisionerError) and err.code == 503) and not _unanswered(err):
                    raise
            await asyncio.sleep(retry)
            retry = min(2 * retry, WATCH_RETRY_MAX)

    async def _compose_within(self, request: ComposeRequest, timeout: float) -> ComposeResponse:
        """The whole composition, its pages joined, every page asked within
        timeout seconds of the first ask: the watch's bound on one
        composition, which spans its pages as the Go client's context does.
        Raises TimeoutError when the composition is not whole by then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        page_request = ComposeRequest()
        page_request.CopyFrom(request)
        pages = []
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"the composition of {request.node} was not whole within {timeout} s")
            page = await self.compose(page_request, timeout=left)
            pages.append(page)
            if not page.next_page_token:
                return join_compose_pages(pages)
            page_request.page_token = page.next_page_token

    async def put_need(
        self, module: str, kind: str, name: str, need: Need, *, timeout: float | None = None
    ) -> int:
        """Writes what module needs for the placeholder ${kind:name} through
        the put verb, mesh-provisioner.put.<node> (the client's node,
        required), and returns the revision it was written at: ask a verb
        with it (ProvisioningRequest.min_revision, or
        Revisions(needs=revision)) to read your write. The key is
        need_key(node, module, kind, name); the value, need encoded
        deterministically.

        Raises ValueError when the client has no node or a part of the key
        is not a token; ProvisionerError when the service refuses the write:
        400 (a malformed key, a value that does not decode), 403 (another
        node's key), 413 (a value over the bucket's largest, or over the
        node's budget of keys or bytes), 503 (ask again); and nats-py's
        errors otherwise (TimeoutError, NoRespondersError)."""
        node = self._writer("put_need")
        with self._forget_on_error(module):
            revision = await self._put(What.WHAT_NEEDS, need_key(node, module, kind, name), need, timeout)
        self._wrote(module, revision)
        return revision

    async def delete_need(self, module: str, kind: str, name: str, *, timeout: float | None = None) -> int:
        """Deletes a need through the delete verb,
        mesh-provisioner.delete.<node>, and returns the revision of its
        delete marker. Raises as put_need does."""
        node = self._writer("delete_need")
        with self._forget_on_error(module):
            revision = await self._delete(What.WHAT_NEEDS, need_key(node, module, kind, name), timeout)
        self._wrote(module, revision)
        return revision

    async def apply_needs(
        self, module: str, needs: Iterable[ModuleNeed], *, timeout: float | None = None
    ) -> ApplyResponse:
        """Makes needs the whole set of module's needs, through the apply
        verb, mesh-provisioner.apply.<node>: the service writes each need
        that differs from the one stored, deletes each of the module's that
        the set does not hold, and leaves the others as they are. An empty
        set deletes every need of the module. The answer says what changed
        (written, deleted, unchanged) and at which revision of the needs
        bucket (revision: ask with it to read the set back). Each value is
        encoded deterministically, so that a need applied again as it was is
        unchanged. Raises as put_need does."""
        node = self._writer("apply_needs")
        request = ApplyRequest(module=module, min_revision=self._written.get(module, 0))
        for kind, name, need in needs:
            request.needs.append(Record(what=What.WHAT_NEEDS, key=need_key(node, module, kind, name), value=_encode(need)))
        with self._forget_on_error(module):
            out = await self._call(node_subject(APPLY_SUBJECT, node), request, ApplyResponse(), timeout, ("node", node), DEFAULT_WRITE_TIMEOUT)
        if out.written + out.deleted > 0:
            # Else the revision is the copy's, which may be past the module's
            # last write: another instance's copy need not wait for it.
            self._wrote(module, out.revision)
        return out

    @contextlib.contextmanager
    def _forget_on_error(self, module: str) -> Iterator[None]:
        """A write of module's needs that fails may have been stored all the
        same (its answer lost, or an apply stored in part): the module's last
        write is then unknown, and the next apply has the service read it."""
        try:
            yield
        except BaseException:
            self._written.pop(module, None)
            raise

    def _wrote(self, module: str, revision: int) -> None:
        """Keeps revision as module's last write of needs, if it is newer."""
        if revision > self._written.get(module, 0):
            self._written[module] = revision

    async def put_applied(self, module: str, applied: Applied, *, timeout: float | None = None) -> int:
        """Writes what is applied of module (key <node>.<module>) through the
        put verb, and returns the revision it was written at. Raises as
        put_need does."""
        node = self._writer("put_applied")
        return await self._put(What.WHAT_APPLIED, applied_key(node, module), applied, timeout)

    async def delete_applied(self, module: str, *, timeout: float | None = None) -> int:
        """Deletes what is applied of module through the delete verb, and
        returns the revision of its delete marker. Raises as put_need does."""
        node = self._writer("delete_applied")
        return await self._delete(What.WHAT_APPLIED, applied_key(node, module), timeout)

    async def put_collect_item(
        self, collection: str, contributor: str, item: CollectItem, *, timeout: float | None = None
    ) -> int:
        """Writes contributor's item of a collection, by its readable name
        such as "shell:zsh:normal" (escaped in the key,
        collect_key(node, collection, contributor)), through the put verb,
        and returns the revision it was written at. Raises as put_need
        does."""
        node = self._writer("put_collect_item")
        return await self._put(What.WHAT_COLLECT, collect_key(node, collection, contributor), item, timeout)

    async def delete_collect_item(self, collection: str, contributor: str, *, timeout: float | None = None) -> int:
        """Deletes contributor's item of a collection through the delete verb,
        and returns the revision of its delete marker. Raises as put_need
        does."""
        node = self._writer("delete_collect_item")
        return await self._delete(What.WHAT_COLLECT, collect_key(node, collection, contributor), timeout)

    async def put_manifest(
        self, provider: str, manifest: Manifest, *, timeout: float | None = None
    ) -> DeclaredManifest:
        """Declares the manifest of provider, a module this node runs, through
        the declare verb, mesh-provisioner.declare.<node>.<provider>, which
        only a node whose permissions name the provider may publish to
        (mesh-provisioner permissions --node <node> --providers <provider>).
        It is stored at <node>.<provider> of the manifests bucket, encoded
        deterministically; returns its digest (manifest_digest of the bytes
        stored) and revision.

        Raises as put_need does; a declare the node's permissions do not
        grant is refused by nats-server, so it gets no answer (nats-py's
        TimeoutError) and a permission violation on the connection."""
        node = self._writer("put_manifest")
        manifest_key(node, provider)  # a ValueError for a provider no key may name
        request = DeclareRequest(manifest=_encode(manifest))
        answer = await self._call(declare_subject(node, provider), request, WriteResponse(), timeout, ("node", node), DEFAULT_WRITE_TIMEOUT)
        return DeclaredManifest(answer.digest, answer.revision)

    async def delete_manifest(self, provider: str, *, timeout: float | None = None) -> int:
        """Withdraws the node's manifest of provider through the declare verb,
        and returns the revision of its delete marker. Raises as put_manifest
        does."""
        node = self._writer("delete_manifest")
        manifest_key(node, provider)
        request = DeclareRequest(withdraw=True)
        return (await self._call(declare_subject(node, provider), request, WriteResponse(), timeout, ("node", node), DEFAULT_WRITE_TIMEOUT)).revision

    async def bind(self, key: str, value: bytes, *, timeout: float | None = None) -> int:
        """Writes key of the provider's bucket <provider>_bound through the
        bind verb, mesh-provisioner.bind.<provider> (the client's provider,
        required), and returns the revision it was written at: compose with
        Revisions(bound={"<provider>_bound": revision}) to see the provision
        bound. The key is <node>.<module>.<provision>[.<local>], as a
        Provision's key names it; the value is opaque to the service, which
        stores it as given and keeps no copy.

        Raises ValueError when the client has no provider; ProvisionerError
        when the service refuses the write: 400 (a malformed key), 413 (a
        value over the bucket's largest), 503; nats-py's errors otherwise."""
        provider = self._binder("bind")
        request = BindRequest(key=key, value=value)
        return (await self._call(bind_subject(provider), request, WriteResponse(), timeout, ("provider", provider), DEFAULT_WRITE_TIMEOUT)).revision

    async def unbind(self, key: str, *, timeout: float | None = None) -> int:
        """Removes key of the provider's bucket through the bind verb (kept as
        a delete marker), and returns the revision of the marker. Raises as
        bind does."""
        provider = self._binder("unbind")
        request = BindRequest(key=key, unbind=True)
        return (await self._call(bind_subject(provider), request, WriteResponse(), timeout, ("provider", provider), DEFAULT_WRITE_TIMEOUT)).revision

    def _writer(self, method: str) -> str:
        """The node a write is for; a ValueError naming method when the client has none."""
        if self._node is None:
            raise ValueError(
                f"{method}: the client has no node: a node writes its own records (ProvisionerClient(nc, node=...))"
            )
        return self._node

    def _binder(self, method: str) -> str:
        """The provider a bind is for; a ValueError naming method when the client has none."""
        if self._provider is None:
            raise ValueError(
                f"{method}: the client has no provider: a provider writes its own bucket "
                "(ProvisionerClient(nc, provider=...))"
            )
        return self._provider

    async def _put(self, what: What, key: str, value: Message, timeout: float | None) -> int:
        node = self._writer("put")
        request = PutRequest(record=Record(what=what, key=key, value=_encode(value)))
        return (await self._call(node_subject(PUT_SUBJECT, node), request, WriteResponse(), timeout, ("node", node), DEFAULT_WRITE_TIMEOUT)).revision

    async def _delete(self, what: What, key: str, timeout: float | None) -> int:
        node = self._writer("delete")
        request = DeleteRequest(what=what, key=key)
        return (await self._call(node_subject(DELETE_SUBJECT, node), request, WriteResponse(), timeout, ("node", node), DEFAULT_WRITE_TIMEOUT)).revision

    def _as_node(self) -> tuple[Role, str] | None:
        """The identity a read verb asks as: the client's node, whose own
        subjects it asks, or none (the verbs' bare subjects)."""
        return None if self._node is None else ("node", self._node)

    async def _call(
        self,
        subject: str,
        request: Message,
        answer: _Answer,
        timeout: float | None,
        asker: tuple[Role, str] | None = None,
        default: float = DEFAULT_READ_TIMEOUT,
    ) -> _Answer:
        """Sends request in protobuf binary and decodes the answer into
        answer, waiting timeout, else the client's timeout, else default (a
        read's or a write's). A request on an identity's own subject (asker:
        a node's or a provider's) is answered only on that identity's inbox,
        so its reply is one of inbox_prefix(*asker), whatever the
        connection's own prefix (a test's or a simulation's connection asks
        for many)."""
        data = request.SerializeToString(deterministic=True)
        headers = {"Content-Type": CONTENT_TYPE_PROTOBUF}
        wait = timeout if timeout is not None else self._timeout if self._timeout is not None else default
        if asker is None:
            reply = await self._nc.request(subject, data, timeout=wait, headers=headers)
        else:
            reply = await self._request_as(asker, subject, data, wait, headers)
        refusal = error_of(reply.headers)
        if refusal is not None:
            raise refusal
        answer.ParseFromString(reply.data)
        return answer

    async def _request_as(
        self, asker: tuple[Role, str], subject: str, data: bytes, timeout: float, headers: dict[str, str]
    ) -> Msg:
        """A request answered on an inbox of asker's: a subscription to it
        for this request alone, as nats-py's old-style request does with the
        connection's own prefix."""
        inbox = f"{inbox_prefix(*asker)}.{NUID().next().decode()}"
        sub = await self._nc.subscribe(inbox, max_msgs=1)
        try:
            await self._nc.publish(subject, data, reply=inbox, headers=headers)
            reply = await sub.next_msg(timeout=timeout)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        # As nats-py's request: a 503 status without a body is nats-server
        # saying no one subscribes to the subject.
        if not reply.data and (reply.headers or {}).get("Status") == "503":
            raise NoRespondersError
        return reply

    async def ping(self, *, id: str | None = None, max_wait: float = 2.0) -> list[ServiceIdentity]:
        """The running instances of the service, each as it answers PING."""
        return await self._discover("PING", "io.nats.micro.v1.ping_response", id, max_wait)  # type: ignore[return-value]

    async def info(self, *, id: str | None = None, max_wait: float = 2.0) -> list[InfoResponse]:
        """Each running instance's description: its endpoints, their subjects and metadata."""
        return await self._discover("INFO", "io.nats.micro.v1.info_response", id, max_wait)  # type: ignore[return-value]

    async def stats(self, *, id: str | None = None, max_wait: float = 2.0) -> list[StatsResponse]:
        """Each running instance's request counts and the service's own
        statistics, each endpoint's data as an EndpointStatsData."""
        answers = await self._discover("STATS", "io.nats.micro.v1.stats_response", id, max_wait)
        for answer in answers:
            for endpoint in answer.get("endpoints") or []:
                if endpoint.get("data") is not None:
                    # A newer instance may report statistics this client does
                    # not know: during a rolling upgrade every reader reads
                    # every instance's.
                    endpoint["data"] = json_format.ParseDict(endpoint["data"], EndpointStatsData(), ignore_unknown_fields=True)
        return answers  # type: ignore[return-value]

    async def _discover(
        self, verb: Literal["PING", "INFO", "STATS"], answer_type: str, id: str | None, max_wait: float
    ) -> list[dict[str, Any]]:
        """Asks $SRV.<verb>.mesh-provisioner[.<id>] and gathers every
        instance's answer (not queue grouped: each instance replies), waiting
        max_wait for the first and stopping once none comes for a moment."""
        subject = ".".join(t for t in ("$SRV", verb, SERVICE_NAME, id) if t)
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        answers: list[dict[str, Any]] = []
        try:
            await self._nc.publish(subject, b"", reply=inbox)
            wait = max_wait
            while True:
                try:
                    msg = await sub.next_msg(timeout=wait)
                except (TimeoutError, NoRespondersError):  # nats-py's TimeoutError is one too
                    break
                if not msg.data:  # a no-responders status: nobody runs
                    break
                answer = json.loads(msg.data)
                if answer.get("type") != answer_type:
                    raise ValueError(f"{subject}: an answer of type {answer.get('type')!r}, want {answer_type}")
                answers.append(answer)
                if id is not None:
                    break
                wait = _DISCOVERY_STALL
        finally:
            await sub.unsubscribe()
        return answers


def join_provisioning_pages(pages: list[ProvisioningResponse]) -> ProvisioningResponse:
    """Joins the pages of a provisioning answer, in order, into one answer."""
    whole = ProvisioningResponse()
    for page in pages:
        _join(whole, page, ("registry", "needs", "applied", "collect", "manifests", "malformed"))
        whole.what, whole.revision = page.what, page.revision
    return whole


def join_compose_pages(pages: list[ComposeResponse]) -> ComposeResponse:
    """Joins the pages of a composition, in order, into one: plans,
    provisions and refusals concatenated, a plan that continues the previous
    page's last module merged into it (its wanted_build and newest_build
    those of the page it starts on); phases are the first page's, revisions
    and plan_digest the last page's (every page carries the whole
    composition's digest). The pages are left as they came."""
    whole = ComposeResponse()
    for page in pages:
        plans = list(page.plans)
        if plans and whole.plans and whole.plans[-1].module == plans[0].module:
            whole.plans[-1].items.extend(plans.pop(0).items)
        whole.plans.extend(plans)
        _join(whole, page, ("provisions", "refusals"))
        if not whole.phases:  # each page times its own composition: keep the first's
            whole.phases.extend(page.phases)
        whole.node, whole.module = page.node, page.module
        whole.revisions.CopyFrom(page.revisions)
        whole.plan_digest = page.plan_digest  # every page's is the whole composition's
    return whole


def join_provisions_pages(pages: list[ProvisionsResponse]) -> ProvisionsResponse:
    """Joins the pages of a provider's provisions, in order, into one answer:
    provisions concatenated; the provider and revisions are the last page's."""
    whole = ProvisionsResponse()
    for page in pages:
        _join(whole, page, ("provisions",))
        whole.provider = page.provider
        whole.revisions.CopyFrom(page.revisions)
    return whole


def plan_at(plan: ModulePlan, build: str) -> list[PlanItem]:
    """The items of a module's plan at a build: the plan that the module at
    build applies (docs/protocol.md, "Builds").

    A plan that names no build (its module's applied record names none:
    wanted_build and newest_build empty, and no item has builds) is the same
    at every build: every item, whatever build is. Otherwise, the items whose
    builds name build; a build that is neither the plan's wanted_build nor
    its newest_build holds none, nor does the empty build: the composition
    did not resolve the module at it.

    Items keep their order (key order), in a new list of the plan's own
    items. Join a paged composition first (join_compose_pages): a plan split
    across pages holds only part of its items on each::

        whole = await client.compose_all(ComposeRequest(node="ace", module="web"))
        for plan in whole.plans:
            now = plan_at(plan, plan.wanted_build)    # what the node runs, or is moving to
            later = plan_at(plan, plan.newest_build)  # what its newest build will need
    """
    if not plan.wanted_build and not plan.newest_build:
        return list(plan.items)
    return [item for item in plan.items if build in item.builds]


def is_bound(provision: Provision) -> bool:
    """Whether a provider has bound a provision: its bound_revision, the
    revision of its key in the provider's bucket (<provider>_bound), is set.
    Zero is pending: the key, or the bucket, does not exist yet. A node that
    saw the provider bind at revision R reads its own write back with
    ComposeRequest(min_revisions=Revisions(bound={provision.bucket: R}))."""
    return provision.bound_revision > 0


def pending(composition: ComposeResponse) -> list[Provision]:
    """The provisions of a composition that their providers have not bound
    yet (is_bound false), in the composition's order: the composition's own,
    in a new list. The Go client.Pending::

        waiting = pending(await client.compose_all(ComposeRequest(node="ace")))
    """
    return [provision for provision in composition.provisions if not is_bound(provision)]


def _join(whole: Message, page: Message, fields: tuple[str, ...]) -> None:
    for field in fields:
        getattr(whole, field).extend(getattr(page, field))
    behind = getattr(whole, "behind")
    behind.extend(b for b in getattr(page, "behind") if b not in behind)
