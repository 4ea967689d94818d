"""The client against the real binary, on a free port, with needs written as
a node's client writes them (a JetStream KV put of the protobuf value)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from mesh_provisioner import (
    SERVICE_NAME,
    WHAT_APPLIED,
    WHAT_NEEDS,
    WHAT_REGISTRY,
    CollectItem,
    ComposeRequest,
    Need,
    ProvisionerClient,
    ProvisionerError,
    ProvisioningRequest,
    RefusalReason,
    Revisions,
)
from server import serve

NEEDS = {
    "ace.web.port.http": Need(placeholder="${port:http}", required=True),
    "ace.web.secret.api_token": Need(placeholder="${secret:api_token}"),
    "ace.web.shell.zsh=3Anormal": Need(placeholder="${shell:zsh:normal}"),
    "ace.worker.dir.state": Need(placeholder="${dir:state}"),
    "ace.worker.gpu.cuda": Need(placeholder="${gpu:cuda}"),
}


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with serve() as url:
        yield url


@pytest.fixture
async def nc(url: str) -> AsyncIterator[NATS]:
    conn = await nats.connect(url, name="mesh-provisioner python client test")
    yield conn
    await conn.close()


async def write_needs(nc: NATS) -> int:
    """Writes NEEDS and an item of the shell collection; returns the needs bucket's last revision."""
    js = nc.jetstream()
    needs = await js.key_value("mesh-provisioner_needs")
    revision = 0
    for key, need in NEEDS.items():
        revision = await needs.put(key, need.SerializeToString())
    collect = await js.key_value("mesh-provisioner_collect")
    await collect.put("ace.shell=3Azsh=3Anormal.web", CollectItem(value="export A=1", order=1).SerializeToString())
    return revision


async def test_provisioning_reads_its_writes(nc: NATS) -> None:
    client = ProvisionerClient(nc)
    revision = await write_needs(nc)
    answer = await client.provisioning(ProvisioningRequest(what=WHAT_NEEDS, node="ace", module="web", min_revision=revision))
    assert answer.what == WHAT_NEEDS
    assert answer.revision >= revision
    assert [(r.kind, r.name, r.need) for r in answer.needs] == [
        ("port", "http", NEEDS["ace.web.port.http"]),
        ("secret", "api_token", NEEDS["ace.web.secret.api_token"]),
        ("shell", "zsh:normal", NEEDS["ace.web.shell.zsh=3Anormal"]),
    ]
    assert list(answer.malformed) == []
    registry = await client.provisioning()
    assert registry.what == WHAT_REGISTRY
    assert "port" in [r.kind for r in registry.registry]


async def test_compose_plans_and_refuses(nc: NATS) -> None:
    client = ProvisionerClient(nc)
    revision = await write_needs(nc)
    plan = await client.compose(ComposeRequest(node="ace", min_revisions=Revisions(needs=revision)))
    assert [(p.module, [i.placeholder for i in p.items]) for p in plan.plans] == [
        ("web", ["${port:http}", "${secret:api_token}", "${shell:zsh:normal}"]),
        ("worker", ["${dir:state}"]),
    ]
    web = plan.plans[0].items
    assert (web[0].WhichOneof("location"), web[0].bucket.key) == ("bucket", "ace.web")
    assert (web[1].WhichOneof("location"), web[1].verb.subject) == ("verb", "mesh-vault.secret")
    assert [i.item.value for i in web[2].items] == ["export A=1"]
    assert [(r.key, r.reason) for r in plan.refusals] == [("ace.worker.gpu.cuda", RefusalReason.REFUSAL_REASON_NO_DOMAIN)]
    assert [p.name for p in plan.phases] == ["wait", "read", "resolve", "items"]


async def test_a_refusal_is_a_provisioner_error_with_code_and_sentence(nc: NATS) -> None:
    client = ProvisionerClient(nc)
    with pytest.raises(ProvisionerError) as refused:
        await client.compose(ComposeRequest(module="web"))
    assert (refused.value.code, refused.value.description) == (400, "node is required: the node to compose")
    with pytest.raises(ProvisionerError) as refused:
        await client.provisioning(ProvisioningRequest(what=WHAT_APPLIED, contributor="web"))
    assert refused.value.code == 400
    assert refused.value.description.startswith("filter contributor does not apply to WHAT_APPLIED")
    with pytest.raises(ProvisionerError) as refused:
        await client.provisioning(ProvisioningRequest(what=WHAT_APPLIED, min_revision=50), timeout=5)
    assert refused.value.code == 503
    assert "mesh-provisioner_applied" in refused.value.description


async def test_pages_join_to_the_whole_answer(nc: NATS) -> None:
    client = ProvisionerClient(nc)
    revision = await write_needs(nc)
    request = ProvisioningRequest(what=WHAT_NEEDS, min_revision=revision)
    whole = await client.provisioning(request)
    paged = ProvisioningRequest(what=WHAT_NEEDS, min_revision=revision, page_size=2)
    pages = [page async for page in client.provisioning_pages(paged)]
    assert all(page.next_page_token for page in pages[:-1]) and not pages[-1].next_page_token
    assert sum(len(page.needs) for page in pages) == len(NEEDS)
    assert await client.provisioning_all(paged) == whole

    composed = await client.compose(ComposeRequest(node="ace"))
    joined = await client.compose_all(ComposeRequest(node="ace", page_size=2))
    for answer in (composed, joined):
        answer.ClearField("phases")
    assert joined == composed


async def test_five_megabytes_arrive_whole_page_by_page(nc: NATS) -> None:
    """An answer several times NATS's max_payload comes in pages, each under it."""
    js = nc.jetstream()
    needs = await js.key_value("mesh-provisioner_needs")
    placeholder = "${config:" + "x" * 1000 + "}"
    revision = 0
    # Five nodes of 1,000 needs: within each node's budget in the copy.
    for node in range(5):
        puts = [needs.put(f"n{node}.m.config.k{i:04d}", Need(placeholder=placeholder).SerializeToString()) for i in range(1000)]
        revision = max(await asyncio.gather(*puts))
    client = ProvisionerClient(nc)
    request = ProvisioningRequest(what=WHAT_NEEDS, min_revision=revision)
    pages = [page async for page in client.provisioning_pages(request, timeout=10)]
    assert len(pages) >= 5
    assert all(page.ByteSize() <= nc.max_payload for page in pages)
    assert sum(len(page.needs) for page in pages) == 5000
    assert sum(page.ByteSize() for page in pages) > 5_000_000
    keys = [(r.node, r.name) for page in pages for r in page.needs]
    assert keys == sorted(keys) and len(set(keys)) == 5000


async def test_discovery_names_the_instance(nc: NATS) -> None:
    client = ProvisionerClient(nc)
    pings = await client.ping()
    assert [p["name"] for p in pings] == [SERVICE_NAME]
    instance = pings[0]["id"]
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", pings[0]["version"])
    [info] = await client.info(id=instance)
    assert [e["subject"] for e in info["endpoints"]] == ["mesh-provisioner.provisioning", "mesh-provisioner.compose"]
    [stats] = await client.stats()
    assert [e["name"] for e in stats["endpoints"]] == ["provisioning", "compose"]
    assert stats["endpoints"][0]["data"]["loading"] == []
    assert await client.ping(id="no-such-instance", max_wait=0.5) == []


async def test_readme_example_runs_as_written(url: str) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    [example] = re.findall(r"```python\n(.*?)```", readme, re.S)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", example, env={**os.environ, "NATS_URL": url},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    for line in re.findall(r"```\n(need:.*?)```", readme, re.S)[0].splitlines():
        assert line in out.decode().splitlines(), out.decode()
