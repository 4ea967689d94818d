"""A node's watch of its plan on a nats-server whose authorization is what
`mesh-provisioner permissions` prints (the Go tool internal/e2e/authnats,
built by `make test-python`), with the service as its two identities: ace
watches its own plan, and nats-server refuses ace's watch of novox's."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NATSTimeoutError
from nats.js.api import ConsumerConfig

from mesh_provisioner import PLANS_BUCKET, Need, ProvisionerClient, inbox_prefix
from server import authorized, serve

PLANS_STREAM = f"KV_{PLANS_BUCKET}"


@pytest.fixture
async def ace() -> AsyncIterator[tuple[NATS, list[str]]]:
    """ace's connection, with the permission violations nats-server reported to it."""
    async with authorized() as urls:
        args = ["--nats-url", urls["mesh-provisioner"], "--writer-nats-url", urls["mesh-provisioner-writer"],
                "--log-format", "json", "--plans-interval", "10ms"]
        async with serve(args):
            violations: list[str] = []

            async def refused(err: Exception) -> None:
                violations.append(str(err))

            nc = await nats.connect(urls["ace"], inbox_prefix=inbox_prefix("node", "ace"), error_cb=refused)
            yield nc, violations
            await nc.close()


async def test_a_node_watches_its_own_plan_under_its_own_permissions_and_no_other(
    ace: tuple[NATS, list[str]],
) -> None:
    nc, violations = ace
    needs = await nc.jetstream().key_value("mesh-provisioner_needs")
    await needs.put("ace.web.port.http", Need(placeholder="${port:http}").SerializeToString())
    client = ProvisionerClient(nc, node="ace")
    async with contextlib.aclosing(client.watch_plan("ace")) as plans:
        first = await asyncio.wait_for(anext(plans), 10)
        while not first.plans:  # asked before the need reached the service's copy
            first = await asyncio.wait_for(anext(plans), 10)
        rev = await needs.put("ace.web.port.admin", Need(placeholder="${port:admin}").SerializeToString())
        second = await asyncio.wait_for(anext(plans), 10)
        assert second.revisions.needs >= rev
        assert second.plan_digest != first.plan_digest
        assert len(second.plans[0].items) == 2
        assert violations == []

    # ace cannot watch novox's key: neither hear its writes nor read it. The
    # subscription's refusal is only reported; the read's is a request
    # answered by nobody.
    with pytest.raises(NATSTimeoutError):
        async with contextlib.aclosing(client.watch_plan("novox", timeout=1)) as theirs:
            await asyncio.wait_for(anext(theirs), 10)
    novox = f"$KV.{PLANS_BUCKET}.novox"
    assert refused(violations, "subscription", novox), violations
    assert refused(violations, "publish", f"$JS.API.DIRECT.GET.{PLANS_STREAM}.{novox}"), violations

    # Nor make a consumer of the plans' stream, even of its own key: one it
    # may make is one more it may make (a durable outlives its connection),
    # until the stream holds no more and every node's watch fails. Nor read
    # a key named in a direct get's body.
    ace_key = f"$KV.{PLANS_BUCKET}.ace"
    jsm = nc.jsm(timeout=1)
    for config in (
        ConsumerConfig(name="greedy", durable_name="greedy", filter_subject=ace_key),  # CONSUMER.CREATE.<stream>.<name>.<filter>
        ConsumerConfig(name="greedy", filter_subject=ace_key, inactive_threshold=3600.0),
        ConsumerConfig(durable_name="greedy", filter_subject=ace_key),  # CONSUMER.DURABLE.CREATE.<stream>.<name>
    ):
        with pytest.raises(NATSTimeoutError):  # refused: no answer comes
            await jsm.add_consumer(PLANS_STREAM, config)
    assert refused(violations, "publish", f"$JS.API.CONSUMER.CREATE.{PLANS_STREAM}.greedy.{ace_key}"), violations
    assert refused(violations, "publish", f"$JS.API.CONSUMER.DURABLE.CREATE.{PLANS_STREAM}.greedy"), violations
    with pytest.raises(NATSTimeoutError):
        await nc.request(f"$JS.API.DIRECT.GET.{PLANS_STREAM}", json.dumps({"last_by_subj": novox}).encode(), timeout=1)
    assert refused(violations, "publish", f"$JS.API.DIRECT.GET.{PLANS_STREAM}"), violations


def refused(violations: list[str], what: str, subject: str) -> bool:
    """Whether nats-server reported a permission violation of ace's for a
    publish to, or a subscription to, exactly subject."""
    # nats-py reports the server's -ERR in lower case.
    want = f"nats: permissions violation for {what} to {subject}".lower()
    return any(v.lower().replace('"', "").replace("'", "").strip() == want for v in violations)
