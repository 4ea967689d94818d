"""A node's watch of its plan on a nats-server whose authorization is what
`mesh-provisioner permissions` prints (the Go tool internal/e2e/authnats,
built by `make test-python`), with the service as its two identities: ace
watches its own plan, and nats-server refuses ace's watch of novox's. Twice:
in one account, and in the runs-as set-up (authnats -runs-as: the service in
its account PROVISIONER, the nodes in MESH, which imports the buckets'
subjects under RUNS_AS_API_PREFIX)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NATSTimeoutError
from nats.js.api import ConsumerConfig

from mesh.provisioner.v1.write_pb2 import PutRequest, Record, WriteResponse
from mesh_provisioner import (
    PLANS_BUCKET,
    RUNS_AS_API_PREFIX,
    Need,
    ProvisionerClient,
    ProvisionerError,
    What,
    error_of,
    inbox_prefix,
)
from server import authorized, serve

PLANS_STREAM = f"KV_{PLANS_BUCKET}"


@dataclass
class Ace:
    """ace's connection, where it reaches the provisioner's JetStream
    (api_prefix: None in one account), and the permission violations
    nats-server reported to it."""

    nc: NATS
    api_prefix: str | None
    violations: list[str] = field(default_factory=list)

    @property
    def api(self) -> str:
        """The provisioner's JetStream API as ace reaches it."""
        return self.api_prefix or "$JS.API"

    def key(self, subject: str) -> str:
        """A key's subject of the provisioner's buckets as ace reaches it."""
        return f"{self.api_prefix}.{subject}" if self.api_prefix else subject

    async def put_need(self, key: str, need: Need) -> int:
        """Puts ace's need through the service's put verb, the only way a
        node writes (it publishes nothing into JetStream); returns the
        revision written."""
        request = PutRequest(record=Record(what=What.WHAT_NEEDS, key=key, value=need.SerializeToString()))
        reply = await self.nc.request("mesh-provisioner.put.ace", request.SerializeToString(), timeout=5)
        assert error_of(reply.headers) is None, reply.headers
        answer = WriteResponse()
        answer.ParseFromString(reply.data)
        return answer.revision


@pytest.fixture(params=[False, True], ids=["one-account", "runs-as"])
async def ace(request: pytest.FixtureRequest) -> AsyncIterator[Ace]:
    """ace's connection, in one account or in the runs-as set-up."""
    runs_as: bool = request.param
    async with authorized(runs_as=runs_as) as urls:
        args = ["--nats-url", urls["mesh-provisioner"], "--writer-nats-url", urls["mesh-provisioner-writer"],
                "--log-format", "json", "--plans-interval", "10ms"]
        async with serve(args):
            violations: list[str] = []

            async def on_error(err: Exception) -> None:
                violations.append(str(err))

            nc = await nats.connect(urls["ace"], inbox_prefix=inbox_prefix("node", "ace"), error_cb=on_error)
            yield Ace(nc, RUNS_AS_API_PREFIX if runs_as else None, violations)
            await nc.close()


async def test_a_node_watches_its_own_plan_under_its_own_permissions_and_no_other(ace: Ace) -> None:
    violations = ace.violations
    await ace.put_need("ace.web.port.http", Need(placeholder="${port:http}"))
    client = ProvisionerClient(ace.nc, node="ace", api_prefix=ace.api_prefix)
    async with contextlib.aclosing(client.watch_plan("ace")) as plans:
        first = await asyncio.wait_for(anext(plans), 10)
        while not first.plans:  # asked before the need reached the service's copy
            first = await asyncio.wait_for(anext(plans), 10)
        rev = await ace.put_need("ace.web.port.admin", Need(placeholder="${port:admin}"))
        second = await asyncio.wait_for(anext(plans), 10)
        assert second.revisions.needs >= rev
        assert second.plan_digest != first.plan_digest
        assert len(second.plans[0].items) == 2
        assert violations == []

    # ace cannot watch novox's key: neither hear its writes nor compose
    # novox's plan. The subscription's refusal is only reported; the
    # composition is refused by the service.
    with pytest.raises(ProvisionerError) as refusal:
        async with contextlib.aclosing(client.watch_plan("novox", timeout=1)) as theirs:
            await asyncio.wait_for(anext(theirs), 10)
    assert refusal.value.code == 403
    novox = f"$KV.{PLANS_BUCKET}.novox"
    assert refused(violations, "subscription", ace.key(novox)), violations

    # A node publishes nothing into JetStream: not a put of its own need,
    # whose acknowledgement it could aim at any key, nor a direct get of its
    # own plan.
    own_need = ace.key("$KV.mesh-provisioner_needs.ace.web.port.http")
    with pytest.raises(NATSTimeoutError):
        await ace.nc.request(own_need, Need(placeholder="${port:http}").SerializeToString(), timeout=1)
    assert refused(violations, "publish", own_need), violations
    own_plan = f"{ace.api}.DIRECT.GET.{PLANS_STREAM}.$KV.{PLANS_BUCKET}.ace"
    with pytest.raises(NATSTimeoutError):
        await ace.nc.request(own_plan, b"", timeout=1)
    assert refused(violations, "publish", own_plan), violations

    # Nor make a consumer of the plans' stream, even of its own key: one it
    # may make is one more it may make (a durable outlives its connection),
    # until the stream holds no more and every node's watch fails. Nor read
    # a key named in a direct get's body.
    ace_key = f"$KV.{PLANS_BUCKET}.ace"
    jsm = ace.nc.jsm(prefix=ace.api, timeout=1)
    for config in (
        ConsumerConfig(name="greedy", durable_name="greedy", filter_subject=ace_key),  # CONSUMER.CREATE.<stream>.<name>.<filter>
        ConsumerConfig(name="greedy", filter_subject=ace_key, inactive_threshold=3600.0),
        ConsumerConfig(durable_name="greedy", filter_subject=ace_key),  # CONSUMER.DURABLE.CREATE.<stream>.<name>
    ):
        with pytest.raises(NATSTimeoutError):  # refused: no answer comes
            await jsm.add_consumer(PLANS_STREAM, config)
    assert refused(violations, "publish", f"{ace.api}.CONSUMER.CREATE.{PLANS_STREAM}.greedy.{ace_key}"), violations
    assert refused(violations, "publish", f"{ace.api}.CONSUMER.DURABLE.CREATE.{PLANS_STREAM}.greedy"), violations
    with pytest.raises(NATSTimeoutError):
        await ace.nc.request(f"{ace.api}.DIRECT.GET.{PLANS_STREAM}", json.dumps({"last_by_subj": novox}).encode(), timeout=1)
    assert refused(violations, "publish", f"{ace.api}.DIRECT.GET.{PLANS_STREAM}"), violations


def refused(violations: list[str], what: str, subject: str) -> bool:
    """Whether nats-server reported a permission violation of ace's for a
    publish to, or a subscription to, exactly subject."""
    # nats-py reports the server's -ERR in lower case.
    want = f"nats: permissions violation for {what} to {subject}".lower()
    return any(v.lower().replace('"', "").replace("'", "").strip() == want for v in violations)
