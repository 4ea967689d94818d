"""An asyncio client of the mesh-provisioner NATS micro service, on nats-py.

The wire contract is docs/protocol.md in the repository.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal, TypedDict, TypeVar

from google.protobuf.message import Message
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError

from mesh.provisioner.v1.compose_pb2 import ComposeRequest, ComposeResponse
from mesh.provisioner.v1.provisioning_pb2 import ProvisioningRequest, ProvisioningResponse

SERVICE_NAME = "mesh-provisioner"
"""The micro service's name, as discovery shows it."""
PROVISIONING_SUBJECT = f"{SERVICE_NAME}.provisioning"
"""The subject of the verb that reads the registry and the state buckets."""
COMPOSE_SUBJECT = f"{SERVICE_NAME}.compose"
"""The subject of the verb that composes a node."""
CONTENT_TYPE_PROTOBUF = "application/protobuf"

# The NATS service API headers of a refused request.
_ERROR_HEADER = "Nats-Service-Error"
_ERROR_CODE_HEADER = "Nats-Service-Error-Code"
# Once one instance has answered a discovery request, discovery ends when no
# other answers within this many seconds.
_DISCOVERY_STALL = 0.3

_Answer = TypeVar("_Answer", ProvisioningResponse, ComposeResponse)


class ProvisionerError(Exception):
    """A request the service refused, with its code and its sentence.

    code is 400 (bad request: do not retry as is), 503 (not ready: the
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


class EndpointStatsData(TypedDict):
    answered: int
    answer_errors: int
    loading: list[str]


class EndpointStats(TypedDict, total=False):
    name: str
    subject: str
    queue_group: str
    num_requests: int
    num_errors: int
    last_error: str
    processing_time: int
    average_processing_time: int
    data: EndpointStatsData


class StatsResponse(ServiceIdentity):
    started: str
    endpoints: list[EndpointStats]


class ProvisionerClient:
    """Asks the mesh-provisioner service over a connection the caller opened
    (with its credentials) and owns.

    timeout, in seconds, bounds each request: 10 by default, more than the
    5 s a server waits for the revisions a request asks for, so that its 503
    arrives before the client gives up.
    """

    def __init__(
        self,
        nc: NATS,
        *,
        subject: str = PROVISIONING_SUBJECT,
        compose_subject: str = COMPOSE_SUBJECT,
        timeout: float = 10.0,
    ) -> None:
        self._nc = nc
        self._subject = subject
        self._compose_subject = compose_subject
        self._timeout = timeout

    async def provisioning(
        self, request: ProvisioningRequest | None = None, *, timeout: float | None = None
    ) -> ProvisioningResponse:
        """Asks the provisioning verb once: one page of the answer. An empty
        request asks for the registry.

        Raises ProvisionerError when the service refuses the request, and
        nats-py's errors otherwise (NoRespondersError when no instance runs,
        TimeoutError).
        """
        return await self._call(self._subject, request or ProvisioningRequest(), ProvisioningResponse(), timeout)

    async def compose(self, request: ComposeRequest, *, timeout: float | None = None) -> ComposeResponse:
        """Asks the compose verb once for the composition of a node (node is
        required): one page of it. Raises as provisioning does."""
        return await self._call(self._compose_subject, request, ComposeResponse(), timeout)

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

    async def _call(self, subject: str, request: Message, answer: _Answer, timeout: float | None) -> _Answer:
        reply = await self._nc.request(
            subject,
            request.SerializeToString(deterministic=True),
            timeout=self._timeout if timeout is None else timeout,
            headers={"Content-Type": CONTENT_TYPE_PROTOBUF},
        )
        refusal = error_of(reply.headers)
        if refusal is not None:
            raise refusal
        answer.ParseFromString(reply.data)
        return answer

    async def ping(self, *, id: str | None = None, max_wait: float = 2.0) -> list[ServiceIdentity]:
        """The running instances of the service, each as it answers PING."""
        return await self._discover("PING", "io.nats.micro.v1.ping_response", id, max_wait)  # type: ignore[return-value]

    async def info(self, *, id: str | None = None, max_wait: float = 2.0) -> list[InfoResponse]:
        """Each running instance's description: its endpoints, their subjects and metadata."""
        return await self._discover("INFO", "io.nats.micro.v1.info_response", id, max_wait)  # type: ignore[return-value]

    async def stats(self, *, id: str | None = None, max_wait: float = 2.0) -> list[StatsResponse]:
        """Each running instance's request counts and the service's own statistics."""
        return await self._discover("STATS", "io.nats.micro.v1.stats_response", id, max_wait)  # type: ignore[return-value]

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
        _join(whole, page, ("registry", "needs", "applied", "collect", "malformed"))
        whole.what, whole.revision = page.what, page.revision
    return whole


def join_compose_pages(pages: list[ComposeResponse]) -> ComposeResponse:
    """Joins the pages of a composition, in order, into one: plans,
    provisions and refusals concatenated, a plan that continues the previous
    page's last module merged into it; phases are the first page's,
    revisions the last page's."""
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
    return whole


def _join(whole: Message, page: Message, fields: tuple[str, ...]) -> None:
    for field in fields:
        getattr(whole, field).extend(getattr(page, field))
    behind = getattr(whole, "behind")
    behind.extend(b for b in getattr(page, "behind") if b not in behind)
