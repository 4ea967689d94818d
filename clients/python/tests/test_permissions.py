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

from mesh_provisioner import Need, ProvisionerClient, inbox_prefix
from server import from_make, serve


@contextlib.asynccontextmanager
async def authorized() -> AsyncIterator[dict[str, str]]:
    """Runs the authorizing nats-server; yields the URL of each identity."""
    proc = await asyncio.create_subprocess_exec(
        from_make("MESH_PROVISIONER_AUTHNATS_BIN"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        urls: dict[str, str] = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        yield urls
    finally:
        proc.stdin.close()  # it serves until its standard input closes
        await asyncio.wait_for(proc.wait(), 10)


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

    with pytest.raises(Exception):  # nats-server refuses the consumer: no answer comes
        async with contextlib.aclosing(client.watch_plan("novox", timeout=1)) as theirs:
            await asyncio.wait_for(anext(theirs), 10)
    # nats-py reports the server's -ERR in lower case.
    assert any(
        v.lower().startswith("nats: permissions violation for publish to")
        and v.lower().rstrip("'\"").endswith("$kv.mesh-provisioner_plans.novox")
        for v in violations
    ), violations
