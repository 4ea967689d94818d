"""The client against the real binary, on a free port, with records written
as a node's client writes them: through the service's write verbs (put,
delete, apply, declare; a provider's bind)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlparse

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError

from mesh_provisioner import (
    COMPOSE_SUBJECT,
    PUT_SUBJECT,
    PLANS_BUCKET,
    PROVISIONING_SUBJECT,
    SERVICE_NAME,
    WHAT_APPLIED,
    WHAT_COLLECT,
    WHAT_MANIFESTS,
    WHAT_NEEDS,
    WHAT_REGISTRY,
    Applied,
    CollectItem,
    ComposeRequest,
    ComposeResponse,
    EndpointStatsData,
    Manifest,
    ModuleNeed,
    Need,
    Offer,
    PlanDigest,
    Provision,
    ProvisionerClient,
    ProvisionerError,
    ProvisioningRequest,
    ProvisionsRequest,
    RefusalReason,
    Revisions,
    applied_key,
    bind_subject,
    collect_key,
    declare_subject,
    error_of,
    escape_name,
    inbox_prefix,
    join_provisions_pages,
    manifest_digest,
    manifest_key,
    need_key,
    node_subject,
    provider_subject,
)
from server import authorized, serve

# Needs by (node, module, kind, name): written as the node, through the put verb.
NeedParts = tuple[str, str, str, str]
NEEDS: dict[NeedParts, Need] = {
    ("ace", "web", "port", "http"): Need(placeholder="${port:http}", required=True),
    ("ace", "web", "secret", "api_token"): Need(placeholder="${secret:api_token}"),
    ("ace", "web", "shell", "zsh:normal"): Need(placeholder="${shell:zsh:normal}"),
    ("ace", "worker", "dir", "state"): Need(placeholder="${dir:state}"),
    ("ace", "worker", "gpu", "cuda"): Need(placeholder="${gpu:cuda}"),
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


async def put_needs(nc: NATS, needs: dict[NeedParts, Need]) -> int:
    """Writes needs, each as its node through the put verb; returns the
    needs bucket's last revision."""
    revision = 0
    for (node, module, kind, name), need in needs.items():
        revision = await ProvisionerClient(nc, node=node).put_need(module, kind, name, need)
    return revision


async def write_needs(nc: NATS) -> Revisions:
    """Writes NEEDS and ace's item of the shell collection; returns the
    revisions of the last writes (needs, collect)."""
    needs = await put_needs(nc, NEEDS)
    item = CollectItem(value="export A=1", order=1)
    collect = await ProvisionerClient(nc, node="ace").put_collect_item("shell:zsh:normal", "web", item)
    return Revisions(needs=needs, collect=collect)


async def test_provisioning_reads_its_writes(nc: NATS) -> None:
    client = ProvisionerClient(nc)
    revision = (await write_needs(nc)).needs
    answer = await client.provisioning(ProvisioningRequest(what=WHAT_NEEDS, node="ace", module="web", min_revision=revision))
    assert answer.what == WHAT_NEEDS
    assert answer.revision >= revision
    assert [(r.kind, r.name, r.need) for r in answer.needs] == [
        ("port", "http", NEEDS["ace", "web", "port", "http"]),
        ("secret", "api_token", NEEDS["ace", "web", "secret", "api_token"]),
        ("shell", "zsh:normal", NEEDS["ace", "web", "shell", "zsh:normal"]),
    ]
    assert list(answer.malformed) == []
    registry = await client.provisioning()
    assert registry.what == WHAT_REGISTRY
    assert "port" in [r.kind for r in registry.registry]


async def test_compose_plans_and_refuses(nc: NATS) -> None:
    client = ProvisionerClient(nc)
    # At the item's revision too: written after the needs, it may reach the
    # server's copy after them.
    plan = await client.compose(ComposeRequest(node="ace", min_revisions=await write_needs(nc)))
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
    revision = (await write_needs(nc)).needs
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
    """An answer several times NATS's max_payload comes in pages, each under
    it. The needs are put straight into the bucket, a fixture of this
    server without authorization: 5,000 at once."""
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
    assert [e["subject"] for e in info["endpoints"]] == [
        "mesh-provisioner.provisioning",
        "mesh-provisioner.compose",
        "mesh-provisioner.provisioning.*",
        "mesh-provisioner.compose.*",
        "mesh-provisioner.provisions.*",
        "mesh-provisioner.put.*",
        "mesh-provisioner.delete.*",
        "mesh-provisioner.apply.*",
        "mesh-provisioner.declare.*.*",
        "mesh-provisioner.bind.*",
    ]
    assert info["endpoints"][4]["metadata"] == {
        "request": "mesh.provisioner.v1.ProvisionsRequest",
        "response": "mesh.provisioner.v1.ProvisionsResponse",
        "content_types": "application/protobuf, application/json",
    }
    assert [(e["metadata"] or {}).get("response") for e in info["endpoints"][5:]] == [
        "mesh.provisioner.v1.WriteResponse",
        "mesh.provisioner.v1.WriteResponse",
        "mesh.provisioner.v1.ApplyResponse",
        "mesh.provisioner.v1.WriteResponse",
        "mesh.provisioner.v1.WriteResponse",
    ]
    [stats] = await client.stats()
    assert [e["name"] for e in stats["endpoints"]] == [
        "provisioning", "compose", "provisioning-node", "compose-node", "provisions", "put", "delete", "apply", "declare", "bind",
    ]
    data = stats["endpoints"][0]["data"]
    assert isinstance(data, EndpointStatsData) and list(data.loading) == [] and len(data.buckets) == 5
    assert await client.ping(id="no-such-instance", max_wait=0.5) == []


async def test_stats_read_a_newer_instances_data_skipping_what_this_client_does_not_know(nc: NATS) -> None:
    # An instance of a later version, with a statistic this version does not
    # define, asked by its id: the answer is its alone.
    newer = {
        "type": "io.nats.micro.v1.stats_response", "name": SERVICE_NAME, "id": "newer", "version": "9.0.0",
        "started": "2026-12-01T00:00:00Z",
        "endpoints": [{
            "name": "compose", "subject": COMPOSE_SUBJECT, "queue_group": "q", "num_requests": 3, "num_errors": 0,
            "last_error": "", "processing_time": 0, "average_processing_time": 0,
            "data": {"answered": 3, "seat": "held", "sections": {"hits": 2}},
        }],
    }

    async def answer(msg: Msg) -> None:
        await msg.respond(json.dumps(newer).encode())

    sub = await nc.subscribe("$SRV.STATS." + SERVICE_NAME + ".newer", cb=answer)
    try:
        await nc.flush()
        [stats] = await ProvisionerClient(nc).stats(id="newer")
        data = stats["endpoints"][0]["data"]
        assert stats["id"] == "newer" and (data.answered, data.seat) == (3, "held")
    finally:
        await sub.unsubscribe()


# A bound need of each of two nodes on provider postgres, and a need of
# novox's, for the tests of nodes' and providers' confinement.
BOUND: dict[NeedParts, Need] = {
    ("ace", "web", "bound", "db"): Need(placeholder="${bound:db}", provider="postgres", provision="database", local="web"),
    ("novox", "api", "bound", "db"): Need(placeholder="${bound:db}", provider="postgres", provision="database", local="api"),
    ("novox", "api", "port", "grpc"): Need(placeholder="${port:grpc}", required=True),
}


async def write_bound(nc: NATS) -> int:
    """Writes NEEDS and BOUND; returns the needs bucket's last revision."""
    await write_needs(nc)
    return await put_needs(nc, BOUND)


def test_inbox_prefix_is_the_identitys() -> None:
    assert inbox_prefix("node", "ace") == "_INBOX_MESH.node.ace"
    assert inbox_prefix("provider", "postgres") == "_INBOX_MESH.provider.postgres"
    assert inbox_prefix("operator", "alice") == "_INBOX_MESH.operator.alice"
    assert node_subject(COMPOSE_SUBJECT, "ace") == "mesh-provisioner.compose.ace"
    assert provider_subject("postgres") == "mesh-provisioner.provisions.postgres"
    for name in ("", "a.b", "*", ">", "a b"):
        with pytest.raises(ValueError):
            inbox_prefix("node", name)
        with pytest.raises(ValueError):
            ProvisionerClient(None, node=name)  # type: ignore[arg-type]


def test_keys_and_subjects_are_built_as_the_go_keys_package_builds_them() -> None:
    """Every byte of a name's UTF-8 outside A-Z a-z 0-9 - _ / is =XX (keys.Escape);
    every other part must be a token (keys.CheckToken) or nothing is sent."""
    assert escape_name("zsh:normal") == "zsh=3Anormal"
    assert escape_name("a.b=c d") == "a=2Eb=3Dc=20d"
    assert escape_name("é/x-_Y9") == "=C3=A9/x-_Y9"
    assert need_key("ace", "web", "shell", "zsh:normal") == "ace.web.shell.zsh=3Anormal"
    assert applied_key("ace", "web") == "ace.web"
    assert collect_key("ace", "shell:zsh:normal", "web") == "ace.shell=3Azsh=3Anormal.web"
    assert manifest_key("ace", "pg") == "ace.pg"
    assert declare_subject("ace", "pg") == "mesh-provisioner.declare.ace.pg"
    assert bind_subject("pg") == "mesh-provisioner.bind.pg"
    assert manifest_digest(b"") == "sha256:" + hashlib.sha256(b"").hexdigest()
    bad_keys: list[Callable[[], str]] = [
        lambda: need_key("ace", "web", "port", ""),
        lambda: need_key("ace.x", "web", "port", "http"),
        lambda: need_key("ace", "we b", "port", "http"),
        lambda: need_key("ace", "web", "", "http"),
        lambda: applied_key("ace", "web:1"),
        lambda: collect_key("ace", "", "web"),
        lambda: collect_key("ace", "shell", "w.eb"),
        lambda: manifest_key("ace", "p*g"),
    ]
    for bad in bad_keys:
        with pytest.raises(ValueError, match="invalid key part"):
            bad()


async def test_a_node_writes_each_record_through_the_verbs(nc: NATS) -> None:
    """put, apply, delete of needs (the name escaped as Go escapes it, read
    back by its readable name), an applied record, a collection item and a
    manifest, each read back at the revision its write returned; values
    encoded deterministically: a set applied again is unchanged, and a
    manifest's digest does not depend on the order its map was filled in."""
    ace = ProvisionerClient(nc, node="ace")
    at = await ace.put_need("web", "shell", "zsh:normal", Need(placeholder="${shell:zsh:normal}"))
    needs = await ace.provisioning(ProvisioningRequest(what=WHAT_NEEDS, node="ace", min_revision=at))
    assert [(r.module, r.kind, r.name) for r in needs.needs] == [("web", "shell", "zsh:normal")]
    assert list(needs.malformed) == []

    web = [
        ModuleNeed("port", "http", Need(placeholder="${port:http}", required=True, builds=["b2", "b1"])),
        ModuleNeed("secret", "api_token", Need(placeholder="${secret:api_token}")),
    ]
    # The client names web's last write it was answered (the put above) in
    # each apply, so the service does not ask the bucket for it.
    direct_gets = 0

    async def count(_: Msg) -> None:
        nonlocal direct_gets
        direct_gets += 1

    gets = await nc.subscribe("$JS.API.DIRECT.GET.KV_mesh-provisioner_needs", cb=count)
    applied = await ace.apply_needs("web", web)
    assert (applied.written, applied.deleted, applied.unchanged) == (2, 1, 0)
    again = await ace.apply_needs("web", web)
    assert (again.written, again.deleted, again.unchanged) == (0, 0, 2)
    assert again.revision >= applied.revision
    await nc.flush()
    await gets.unsubscribe()
    assert direct_gets == 0, f"the applies asked the bucket {direct_gets} times"
    needs = await ace.provisioning(ProvisioningRequest(what=WHAT_NEEDS, node="ace", min_revision=applied.revision))
    assert [(r.kind, r.name, r.need) for r in needs.needs] == [(n.kind, n.name, n.need) for n in web]
    gone = await ace.delete_need("web", "secret", "api_token")
    assert gone > applied.revision
    needs = await ace.provisioning(ProvisioningRequest(what=WHAT_NEEDS, node="ace", min_revision=gone))
    assert [r.name for r in needs.needs] == ["http"]
    cleared = await ace.apply_needs("web", [])
    assert (cleared.written, cleared.deleted, cleared.unchanged) == (0, 1, 0)

    at = await ace.put_applied("web", Applied(plan_digest="sha256:0a", wanted_build="b1"))
    applieds = await ace.provisioning(ProvisioningRequest(what=WHAT_APPLIED, node="ace", min_revision=at))
    assert [(r.module, r.applied.wanted_build, r.revision) for r in applieds.applied] == [("web", "b1", at)]
    at = await ace.delete_applied("web")
    assert list((await ace.provisioning(ProvisioningRequest(what=WHAT_APPLIED, node="ace", min_revision=at))).applied) == []

    item = CollectItem(value="export A=1", order=2, attributes={"z": "1", "a": "2"})
    at = await ace.put_collect_item("shell:zsh:normal", "web", item)
    items = await ace.provisioning(ProvisioningRequest(what=WHAT_COLLECT, node="ace", min_revision=at))
    assert [(r.collection, r.contributor, r.item, r.revision) for r in items.collect] == [("shell:zsh:normal", "web", item, at)]
    at = await ace.delete_collect_item("shell:zsh:normal", "web")
    assert list((await ace.provisioning(ProvisioningRequest(what=WHAT_COLLECT, node="ace", min_revision=at))).collect) == []

    # The same manifest, its maps filled in two orders: one encoding, one digest.
    offers = [Offer(provision="database", attributes={"y": "1", "b": "2", "m": "3"})]
    one = await ace.put_manifest("pg", Manifest(offers=offers, attributes={"zone": "a", "arch": "x86", "mem": "8"}))
    two = await ace.put_manifest("pg", Manifest(offers=offers, attributes={"mem": "8", "arch": "x86", "zone": "a"}))
    assert one.digest == two.digest and two.revision > one.revision
    stored = Manifest(offers=offers, attributes={"arch": "x86", "mem": "8", "zone": "a"})
    assert one.digest == manifest_digest(stored.SerializeToString(deterministic=True))
    manifests = await ace.provisioning(ProvisioningRequest(what=WHAT_MANIFESTS, node="ace", min_revision=two.revision))
    assert [(r.provider, r.digest, r.manifest) for r in manifests.manifests] == [("pg", one.digest, stored)]
    at = await ace.delete_manifest("pg")
    assert list((await ace.provisioning(ProvisioningRequest(what=WHAT_MANIFESTS, node="ace", min_revision=at))).manifests) == []


async def test_writes_need_the_clients_node_or_provider_and_refusals_are_provisioner_errors(nc: NATS) -> None:
    operator = ProvisionerClient(nc)
    with pytest.raises(ValueError, match="put_need: the client has no node"):
        await operator.put_need("web", "port", "http", Need(placeholder="${port:http}"))
    with pytest.raises(ValueError, match="apply_needs: the client has no node"):
        await operator.apply_needs("web", [])
    with pytest.raises(ValueError, match="put_manifest: the client has no node"):
        await operator.put_manifest("pg", Manifest())
    with pytest.raises(ValueError, match="bind: the client has no provider"):
        await ProvisionerClient(nc, node="ace").bind("ace.web.database.main", b"x")
    with pytest.raises(ValueError):
        ProvisionerClient(nc, provider="p.g")
    # The service's refusals, with their codes: a value over the bucket's
    # largest (64 KiB), a malformed bound key.
    with pytest.raises(ProvisionerError) as refused:
        await ProvisionerClient(nc, node="ace").put_need("web", "config", "big", Need(placeholder="x" * (65 * 1024)))
    assert refused.value.code == 413
    with pytest.raises(ProvisionerError) as refused:
        await ProvisionerClient(nc, provider="postgres").bind("ace.web", b"x")
    assert refused.value.code == 400


async def test_nats_py_replies_under_the_inbox_prefix(url: str) -> None:
    conn = await nats.connect(url, inbox_prefix=inbox_prefix("node", "ace"))
    try:
        sub = await conn.subscribe("test.probe", max_msgs=1)
        with pytest.raises(TimeoutError):  # nobody answers: only the reply subject counts
            await conn.request("test.probe", b"", timeout=0.2)
        msg = await sub.next_msg(timeout=1)
        assert msg.reply.startswith("_INBOX_MESH.node.ace.")
    finally:
        await conn.close()


async def test_a_node_reads_its_own_as_an_operator_reads_it(nc: NATS, url: str) -> None:
    revision = await write_bound(nc)
    operator = ProvisionerClient(nc)
    conn = await nats.connect(url, inbox_prefix=inbox_prefix("node", "ace"))
    try:
        ace = ProvisionerClient(conn, node="ace")
        assert (ace.node, ace.subject, ace.compose_subject) == ("ace", "mesh-provisioner.provisioning.ace", "mesh-provisioner.compose.ace")
        assert (operator.node, operator.subject, operator.compose_subject) == (None, PROVISIONING_SUBJECT, COMPOSE_SUBJECT)
        for request in (
            ProvisioningRequest(),
            ProvisioningRequest(what=WHAT_NEEDS, node="ace", min_revision=revision),
            ProvisioningRequest(what=WHAT_COLLECT, node="ace"),
        ):
            assert await ace.provisioning(request) == await operator.provisioning(request)
        paged = ProvisioningRequest(what=WHAT_NEEDS, node="ace", page_size=2)
        pages = [page async for page in ace.provisioning_pages(paged)]
        assert len(pages) > 1
        assert await ace.provisioning_all(paged) == await operator.provisioning(ProvisioningRequest(what=WHAT_NEEDS, node="ace"))
        mine = await ace.compose_all(ComposeRequest(node="ace", page_size=2))
        theirs = await operator.compose(ComposeRequest(node="ace"))
        for answer in (mine, theirs):
            answer.ClearField("phases")
        assert mine == theirs
    finally:
        await conn.close()


async def test_another_nodes_records_or_plan_are_a_403(nc: NATS, url: str) -> None:
    await write_bound(nc)
    conn = await nats.connect(url, inbox_prefix=inbox_prefix("node", "ace"))
    try:
        ace = ProvisionerClient(conn, node="ace")
        for what, name in ((WHAT_NEEDS, "WHAT_NEEDS"), (WHAT_APPLIED, "WHAT_APPLIED"), (WHAT_COLLECT, "WHAT_COLLECT")):
            with pytest.raises(ProvisionerError) as refused:
                await ace.provisioning(ProvisioningRequest(what=what, node="novox"))
            assert refused.value == ProvisionerError(
                403,
                f'{name} on mesh-provisioner.provisioning.ace: node "ace" reads its own records only, and the request names '
                'node "novox"; ask mesh-provisioner.provisioning.<node> as that node',
            )
        with pytest.raises(ProvisionerError) as refused:
            await ace.provisioning(ProvisioningRequest(what=WHAT_NEEDS))
        assert refused.value.code == 403
        assert "every node's records are for operators" in refused.value.description
        with pytest.raises(ProvisionerError) as refused:
            await ace.compose(ComposeRequest(node="novox"))
        assert refused.value.code == 403
        with pytest.raises(ProvisionerError) as refused:
            [page async for page in ace.compose_pages(ComposeRequest(node="novox", page_size=1))]
        assert refused.value.code == 403
    finally:
        await conn.close()


async def test_a_node_asking_with_another_nodes_inbox_gets_no_answer(url: str) -> None:
    conn = await nats.connect(url, inbox_prefix=inbox_prefix("node", "bob"))
    try:
        with pytest.raises(TimeoutError):
            await conn.request(node_subject(COMPOSE_SUBJECT, "ace"), ComposeRequest(node="ace").SerializeToString(), timeout=0.5)
    finally:
        await conn.close()


async def test_an_operator_reads_every_node(nc: NATS, url: str) -> None:
    revision = await write_bound(nc)
    conn = await nats.connect(url, inbox_prefix=inbox_prefix("operator", "alice"))
    try:
        operator = ProvisionerClient(conn)
        needs = await operator.provisioning(ProvisioningRequest(what=WHAT_NEEDS, min_revision=revision))
        assert {r.node for r in needs.needs} == {"ace", "novox"}
        # An operator asks a node's plan on the bare subject; on the node's
        # own, which is the node's to ask, its inbox gets no answer.
        assert (await operator.compose(ComposeRequest(node="novox"))).node == "novox"
        with pytest.raises(TimeoutError):
            await conn.request(node_subject(COMPOSE_SUBJECT, "novox"), ComposeRequest(node="novox").SerializeToString(), timeout=0.5)
    finally:
        await conn.close()


async def test_a_provider_reads_its_provisions_page_by_page(nc: NATS, url: str) -> None:
    revision = await write_bound(nc)
    conn = await nats.connect(url, inbox_prefix=inbox_prefix("provider", "postgres"))
    try:
        postgres = ProvisionerClient(conn)
        request = ProvisionsRequest(provider="postgres", min_revisions=Revisions(needs=revision))
        whole = await postgres.provisions(request)
        assert whole.provider == "postgres" and not whole.next_page_token
        assert list(whole.provisions) == [
            Provision(provider="postgres", bucket="postgres_bound", key="ace.web.database.web", module="web",
                      provision="database", local="web", name="db", node="ace"),
            Provision(provider="postgres", bucket="postgres_bound", key="novox.api.database.api", module="api",
                      provision="database", local="api", name="db", node="novox"),
        ]
        assert whole.revisions.needs >= revision
        paged = ProvisionsRequest(provider="postgres", page_size=1)
        pages = [page async for page in postgres.provisions_pages(paged)]
        assert [[p.node for p in page.provisions] for page in pages] == [["ace"], ["novox"]]
        assert pages[0].next_page_token and not pages[-1].next_page_token
        assert await postgres.provisions_all(paged) == whole
        assert join_provisions_pages(pages) == whole
        # Another provider's, asked with postgres's inbox, gets no answer at all.
        with pytest.raises(TimeoutError):
            await conn.request(provider_subject("redis"), ProvisionsRequest(provider="redis").SerializeToString(), timeout=0.5)
        # On postgres's subject, another provider's provisions are a 403.
        reply = await conn.request(provider_subject("postgres"), ProvisionsRequest(provider="redis").SerializeToString(),
                                   timeout=5, headers={"Content-Type": "application/protobuf"})
        refusal = error_of(reply.headers)
        assert refusal is not None and refusal.code == 403
    finally:
        await conn.close()
    with pytest.raises(ValueError):
        await ProvisionerClient(nc).provisions(ProvisionsRequest())


async def test_readme_examples_run_as_written(url: str) -> None:
    """Each example of the README, as a node, an operator and a provider, in
    order on one server, prints the lines of the block that follows it."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    examples = re.findall(r"```python\n(.*?)```\n.*?```\n(.*?)```", readme, re.S)
    assert len(examples) == 3
    for example, prints in examples:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", example, env={**os.environ, "NATS_URL": url},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        for line in prints.splitlines():
            assert line in out.decode().splitlines(), out.decode()


async def test_watch_plan_refuses_a_node_that_is_no_token(nc: NATS) -> None:
    """A wildcard would subscribe to every node's key the identity may read."""
    for node in ("*", ">", "ace.web", ""):
        with pytest.raises(ValueError):
            await anext(ProvisionerClient(nc).watch_plan(node))


async def test_watch_plan_yields_a_new_composition_each_time_the_plan_changes(nc: NATS) -> None:
    """The node's composition first; a need written: a new one, with a new
    digest, at least as new as the write; the need written again unchanged:
    none. Cancelled, or closed, the watcher stops: nothing arrives any more."""
    client = ProvisionerClient(nc)
    wes = ProvisionerClient(nc, node="wes")
    await wes.put_need("web", "port", "http", Need(placeholder="${port:http}", required=True))

    def names(composition: ComposeResponse) -> list[tuple[str, list[str]]]:
        return [(plan.module, [item.name for item in plan.items]) for plan in composition.plans]

    async def quiet(what: str) -> None:
        """Asserts that in 0.3 s nothing but the put verb's answer arrives."""
        # A delivery the server sent before it read the watcher's unsubscribe
        # (the watch's first value may come after the composition) arrives
        # before the flush's answer: counted out, it is not the watcher running.
        await nc.flush()
        before = nc.stats["in_msgs"]
        await wes.put_need("web", "port", what, Need(placeholder=f"${{port:{what}}}"))
        await asyncio.sleep(0.3)
        assert nc.stats["in_msgs"] == before + 1, "a message other than the put's answer arrived: the watcher still runs"

    plans = client.watch_plan("wes")
    first = await asyncio.wait_for(anext(plans), 10)
    assert re.fullmatch(r"xxh3:[0-9a-f]{32}", first.plan_digest)
    assert first.node == "wes"

    revision = await wes.put_need("web", "port", "admin", Need(placeholder="${port:admin}"))
    second = await asyncio.wait_for(anext(plans), 10)
    # The first composition may have been read before the first need was in the copy.
    while not any("admin" in items for _, items in names(second)):
        second = await asyncio.wait_for(anext(plans), 10)
    assert second.plan_digest != first.plan_digest
    assert second.revisions.needs >= revision
    assert names(second) == [("web", ["admin", "http"])]

    # Written again unchanged: the digest holds, nothing is yielded.
    await wes.put_need("web", "port", "admin", Need(placeholder="${port:admin}"))
    pending = asyncio.ensure_future(anext(plans))
    done, _ = await asyncio.wait({pending}, timeout=0.3)
    assert not done
    # Cancelled while it waits: the watcher stops, and the generator ends.
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    with pytest.raises(StopAsyncIteration):
        await anext(plans)
    await quiet("metrics")

    # Closed after a composition (leaving an aclosing block): the watcher stops.
    async with contextlib.aclosing(client.watch_plan("wes")) as again:
        async for composition in again:
            assert names(composition) == [("web", ["admin", "http", "metrics"])]
            break
    await quiet("debug")


class Cuttable:
    """A TCP proxy to a NATS server whose connections can be cut, and new
    ones refused, until restored: a connection through it is lost and found
    again, as across a network outage."""

    def __init__(self, url: str) -> None:
        target = urlparse(url)
        assert target.hostname is not None and target.port is not None
        self._host, self._port = target.hostname, target.port
        self._up = True
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        """Listens on a free port; returns the URL to connect with."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"nats://127.0.0.1:{port}"

    def cut(self) -> None:
        """Closes every connection, and refuses new ones until restore."""
        self._up = False
        for writer in self._open:
            writer.close()

    def restore(self) -> None:
        self._up = True

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._up:
            writer.close()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:
            writer.close()
            return
        pair = {writer, server_writer}
        self._open |= pair

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                for w in pair:  # one side gone: the whole connection is
                    w.close()

        try:
            await asyncio.gather(pipe(reader, server_writer), pipe(server_reader, writer))
        finally:
            self._open -= pair


async def test_watch_plan_composes_again_after_a_reconnect_and_asks_nothing_of_jetstream(nc: NATS, url: str) -> None:
    """A need written while the watcher's connection is down changes the
    plan when nobody hears it; once reconnected, the watcher composes again
    (no min revisions: nothing it heard tells which) and yields the new
    composition. It asks only the compose verb, first and after the
    reconnect: nothing of the JetStream API (no direct get, no consumer)."""
    wes = ProvisionerClient(nc, node="wes")
    # The digest's key, read as the operator's fixture: no node could.
    plans_bucket = await nc.jetstream().key_value(PLANS_BUCKET)
    await wes.put_need("web", "port", "http", Need(placeholder="${port:http}"))
    proxy = Cuttable(url)
    watched = await nats.connect(
        await proxy.start(),
        inbox_prefix=inbox_prefix("node", "wes"),
        reconnect_time_wait=0.1,
        max_reconnect_attempts=-1,
        error_cb=quietly,
    )
    asked: list[str] = []

    async def ask(msg: Msg) -> None:
        # The watcher's requests: on wes's inbox, and not the test's own
        # writes of wes's needs (answered on wes's inbox too).
        if (msg.reply or "").startswith(inbox_prefix("node", "wes") + ".") and not msg.subject.startswith(PUT_SUBJECT + "."):
            asked.append(msg.subject)

    spies = [await nc.subscribe(subject, cb=ask) for subject in ("$JS.API.>", "$KV.>", "mesh-provisioner.>")]
    await nc.flush()
    compose = node_subject(COMPOSE_SUBJECT, "wes")
    try:
        async with contextlib.aclosing(ProvisionerClient(watched, node="wes").watch_plan("wes")) as plans:
            first = await asyncio.wait_for(anext(plans), 10)
            while not first.plans:  # composed before the need reached the copy
                first = await asyncio.wait_for(anext(plans), 10)
            pending = asyncio.ensure_future(anext(plans))

            proxy.cut()
            await asyncio.wait_for(until(lambda: not watched.is_connected), 5)
            revision = await wes.put_need("api", "port", "grpc", Need(placeholder="${port:grpc}"))

            async def digest_written() -> None:  # the plan changed while nobody heard it
                while True:
                    with contextlib.suppress(KeyNotFoundError):
                        entry = await plans_bucket.get("wes")
                        if PlanDigest.FromString(entry.value or b"").revisions.needs >= revision:
                            return
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(digest_written(), 10)
            done, _ = await asyncio.wait({pending}, timeout=0.5)
            assert not done, "a composition while the connection was down"
            reconnects = watched.stats["reconnects"]
            before = len(asked)
            proxy.restore()

            second = await asyncio.wait_for(pending, 10)
            assert watched.stats["reconnects"] > reconnects
            assert [plan.module for plan in second.plans] == ["api", "web"]
            assert second.revisions.needs >= revision
            assert second.plan_digest != first.plan_digest
            # The spy's connection runs its callback in its own task: an ask
            # the server has seen may not be in asked yet.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until(lambda: len(asked) > before), 5)
            assert before >= 1 and compose in asked[before:], f"composed first and again once reconnected: {asked}"
    finally:
        for spy in spies:
            await spy.unsubscribe()
        await watched.close()
        await proxy.stop()
    assert set(asked) == {compose}, asked


async def test_watch_plan_waits_for_the_service() -> None:
    """A node that watches its plan before any instance serves (the
    nats-server up, the buckets made, and the node's need written, by an
    instance since stopped) asks its
    composition again while nobody answers: its watch neither yields nor
    ends. Once an instance serves, it yields the node's composition."""
    async with authorized() as urls:
        args = ["--nats-url", urls["mesh-provisioner"], "--writer-nats-url", urls["mesh-provisioner-writer"],
                "--log-format", "json", "--plans-interval", "10ms"]
        nc = await nats.connect(urls["ace"], inbox_prefix=inbox_prefix("node", "ace"), error_cb=quietly)
        try:
            async with serve(args):  # it makes the buckets and stores ace's need, then stops
                await ProvisionerClient(nc, node="ace").put_need("web", "port", "http", Need(placeholder="${port:http}"))
            with pytest.raises(nats.errors.NoRespondersError):  # nobody serves: no answer
                await ProvisionerClient(nc, node="ace").compose(ComposeRequest(node="ace"))
            async with contextlib.aclosing(ProvisionerClient(nc, node="ace").watch_plan("ace")) as plans:
                pending = asyncio.ensure_future(anext(plans))
                done, _ = await asyncio.wait({pending}, timeout=0.5)
                assert not done, f"the watch ended before any instance served: {pending.exception()!r}"
                async with serve(args):
                    first = await asyncio.wait_for(pending, 10)
                    assert first.node == "ace"
                    assert re.fullmatch(r"xxh3:[0-9a-f]{32}", first.plan_digest)
                    while not first.plans:  # composed before the need reached the copy
                        first = await asyncio.wait_for(anext(plans), 10)
                    assert [plan.module for plan in first.plans] == ["web"]
        finally:
            await nc.close()


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def quietly(err: Exception) -> None:
    """The errors of a connection cut on purpose."""
