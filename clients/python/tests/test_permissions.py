"""A node's and a provider's writes and a node's watch of its plan on a
nats-server whose authorization is what `mesh-provisioner permissions`
prints (the Go tool internal/testkit/e2e/authnats, built by `make test-python`),
with the service as its two identities. Node ace writes its records only
through the service's verbs (put, delete, apply, and declare for pg, the
provider it runs) and watches its own plan; nats-server refuses it every
JetStream publish (a KV put of its own key, stream info, a direct get of its
own plan, any consumer), the declare of a provider its grant does not name,
and the watch of novox's plan; the verbs refuse what is not ace's or not
well formed, and answer only into ace's own inbox. Provider pg binds through
mesh-provisioner.bind.pg and publishes nothing into its bucket. Twice: in
one account, and in the runs-as set-up (authnats -runs-as: the service in
its account PROVISIONER, ace, novox and pg each in an account of its own,
which imports its own verbs and, a node's, its plan key's writes under
RUNS_AS_API_PREFIX)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NATSTimeoutError
from nats.js.api import ConsumerConfig

from mesh_provisioner import (
    PLANS_BUCKET,
    PUT_SUBJECT,
    RUNS_AS_API_PREFIX,
    WHAT_APPLIED,
    WHAT_COLLECT,
    WHAT_MANIFESTS,
    WHAT_NEEDS,
    Applied,
    CollectItem,
    ComposeRequest,
    ComposeResponse,
    Manifest,
    ModuleNeed,
    Need,
    Offer,
    ProvisionerClient,
    ProvisionerError,
    ProvisioningRequest,
    ProvisionsRequest,
    PutRequest,
    Record,
    Revisions,
    Role,
    What,
    WriteResponse,
    error_of,
    inbox_prefix,
    is_bound,
    manifest_digest,
    node_subject,
)
from server import authorized, serve

PLANS_STREAM = f"KV_{PLANS_BUCKET}"
Callback = Callable[[Exception], Awaitable[None]]


@dataclass
class Mesh:
    """The connections of node ace, node novox and provider pg, where ace
    reaches the provisioner's JetStream (api_prefix: None in one account),
    and the permission violations nats-server reported to ace and to pg."""

    ace: NATS
    novox: NATS
    pg: NATS
    api_prefix: str | None
    violations: list[str] = field(default_factory=list)
    pg_violations: list[str] = field(default_factory=list)

    @property
    def api(self) -> str:
        """The provisioner's JetStream API as ace reaches it."""
        return self.api_prefix or "$JS.API"

    def key(self, subject: str) -> str:
        """A key's subject of the provisioner's buckets as ace reaches it."""
        return f"{self.api_prefix}.{subject}" if self.api_prefix else subject

    def client(self) -> ProvisionerClient:
        """ace's client: it reads, writes and watches as node ace."""
        return ProvisionerClient(self.ace, node="ace", api_prefix=self.api_prefix)

    async def raw_put(self, key: str, value: bytes) -> int:
        """Sends ace's put verb a need record as given (what the client would
        not build); returns the refusal's code, or 0 for an answer."""
        request = PutRequest(record=Record(what=What.WHAT_NEEDS, key=key, value=value))
        reply = await self.ace.request(node_subject(PUT_SUBJECT, "ace"), request.SerializeToString(), timeout=5,
                                       headers={"Content-Type": "application/protobuf"})
        refusal = error_of(reply.headers)
        if refusal is None:
            WriteResponse.FromString(reply.data)
            return 0
        return refusal.code


@pytest.fixture(params=[False, True], ids=["one-account", "runs-as"])
async def mesh(request: pytest.FixtureRequest) -> AsyncIterator[Mesh]:
    """The service on authnats, in one account or in the runs-as set-up, and
    the connections of ace, novox and pg, each with its own inbox prefix."""
    runs_as: bool = request.param
    async with authorized(runs_as=runs_as) as urls:
        args = ["--nats-url", urls["mesh-provisioner"], "--writer-nats-url", urls["mesh-provisioner-writer"],
                "--log-format", "json", "--plans-interval", "10ms"]
        async with serve(args):
            violations: list[str] = []
            pg_violations: list[str] = []

            def recorder(seen: list[str]) -> Callback:
                async def on_error(err: Exception) -> None:
                    seen.append(str(err))

                return on_error

            ace = await nats.connect(urls["ace"], inbox_prefix=inbox_prefix("node", "ace"), error_cb=recorder(violations))
            novox = await nats.connect(urls["novox"], inbox_prefix=inbox_prefix("node", "novox"), error_cb=recorder([]))
            pg = await nats.connect(urls["pg"], inbox_prefix=inbox_prefix("provider", "pg"), error_cb=recorder(pg_violations))
            try:
                yield Mesh(ace, novox, pg, RUNS_AS_API_PREFIX if runs_as else None, violations, pg_violations)
            finally:
                for nc in (ace, novox, pg):
                    await nc.close()


async def next_at(plans: AsyncGenerator[ComposeResponse, None], needs: int) -> ComposeResponse:
    """The first composition the watch yields that read the needs bucket at
    revision needs or later (one asked before a write reached the service's
    copy is older)."""
    while True:
        composition = await asyncio.wait_for(anext(plans), 10)
        if composition.revisions.needs >= needs:
            return composition


def item_names(composition: ComposeResponse) -> list[list[str]]:
    return [[item.name for item in plan.items] for plan in composition.plans]


async def test_a_node_writes_its_records_through_the_verbs_and_its_watch_hears_its_plan_change(mesh: Mesh) -> None:
    client = mesh.client()
    http = await client.put_need("web", "port", "http", Need(placeholder="${port:http}"))
    async with contextlib.aclosing(client.watch_plan("ace")) as plans:
        first = await next_at(plans, http)
        assert item_names(first) == [["http"]]

        # The module's whole set: http unchanged, admin new.
        applied = await client.apply_needs("web", [
            ModuleNeed("port", "http", Need(placeholder="${port:http}")),
            ModuleNeed("port", "admin", Need(placeholder="${port:admin}")),
        ])
        assert (applied.written, applied.deleted, applied.unchanged) == (1, 0, 1)
        second = await next_at(plans, applied.revision)
        assert second.plan_digest != first.plan_digest
        assert item_names(second) == [["admin", "http"]]

        deleted = await client.delete_need("web", "port", "admin")
        third = await next_at(plans, deleted)
        assert item_names(third) == [["http"]]
        assert third.plan_digest == first.plan_digest

    # Its applied record, a collection item and the manifest of pg, the
    # provider its grant names: each read back on its own subject.
    applied_at = await client.put_applied("web", Applied(plan_digest="sha256:0a", placeholders=["${port:http}"]))
    item_at = await client.put_collect_item("shell:zsh:normal", "web", CollectItem(value="export A=1"))
    manifest = Manifest(offers=[Offer(provision="database")], attributes={"b": "2", "a": "1"})
    declared = await client.put_manifest("pg", manifest)
    assert declared.digest == manifest_digest(manifest.SerializeToString(deterministic=True))
    applieds = await client.provisioning(ProvisioningRequest(what=WHAT_APPLIED, node="ace", min_revision=applied_at))
    assert [(r.module, r.applied.plan_digest, r.revision) for r in applieds.applied] == [("web", "sha256:0a", applied_at)]
    items = await client.provisioning(ProvisioningRequest(what=WHAT_COLLECT, node="ace", min_revision=item_at))
    assert [(r.collection, r.contributor, r.item.value) for r in items.collect] == [("shell:zsh:normal", "web", "export A=1")]
    manifests = await client.provisioning(ProvisioningRequest(what=WHAT_MANIFESTS, node="ace", min_revision=declared.revision))
    assert [(r.provider, r.digest, r.revision, r.manifest) for r in manifests.manifests] == [
        ("pg", declared.digest, declared.revision, manifest)
    ]

    # Deleted through the verbs: gone once the copy reached the markers.
    gone = await client.delete_collect_item("shell:zsh:normal", "web")
    assert list((await client.provisioning(ProvisioningRequest(what=WHAT_COLLECT, node="ace", min_revision=gone))).collect) == []
    gone = await client.delete_applied("web")
    assert list((await client.provisioning(ProvisioningRequest(what=WHAT_APPLIED, node="ace", min_revision=gone))).applied) == []
    await mesh.ace.flush()
    assert mesh.violations == []


async def test_a_node_publishes_nothing_into_jetstream_nor_declares_another_provider_nor_watches_another_node(
    mesh: Mesh,
) -> None:
    client = mesh.client()
    http = await client.put_need("web", "port", "http", Need(placeholder="${port:http}"))

    # A put of its own need into the bucket, whose acknowledgement it could
    # aim at any key; the needs' stream information, which lists every
    # node's keys; the direct get of its own plan: each refused, unanswered.
    own_need = mesh.key("$KV.mesh-provisioner_needs.ace.web.port.http")
    with pytest.raises(NATSTimeoutError):
        await mesh.ace.request(own_need, Need(placeholder="${port:forged}").SerializeToString(), timeout=1)
    assert await refused_soon(mesh.ace, mesh.violations, "publish", own_need), mesh.violations
    needs_info = f"{mesh.api}.STREAM.INFO.KV_mesh-provisioner_needs"
    with pytest.raises(NATSTimeoutError):
        await mesh.ace.request(needs_info, json.dumps({"subjects_filter": ">"}).encode(), timeout=1)
    assert await refused_soon(mesh.ace, mesh.violations, "publish", needs_info), mesh.violations
    own_plan = f"{mesh.api}.DIRECT.GET.{PLANS_STREAM}.$KV.{PLANS_BUCKET}.ace"
    with pytest.raises(NATSTimeoutError):
        await mesh.ace.request(own_plan, b"", timeout=1)
    assert await refused_soon(mesh.ace, mesh.violations, "publish", own_plan), mesh.violations

    # The declare of redis, which ace does not run: refused by nats-server,
    # so never answered.
    with pytest.raises(NATSTimeoutError):
        await client.put_manifest("redis", Manifest(offers=[Offer(provision="cache")]), timeout=1)
    assert await refused_soon(mesh.ace, mesh.violations, "publish", "mesh-provisioner.declare.ace.redis"), mesh.violations

    # novox's plan: nats-server refuses the subscription to its key's
    # subject, and the service the composition.
    with pytest.raises(ProvisionerError) as refusal:
        async with contextlib.aclosing(client.watch_plan("novox", timeout=1)) as theirs:
            await asyncio.wait_for(anext(theirs), 10)
    assert refusal.value.code == 403
    novox_plan = mesh.key(f"$KV.{PLANS_BUCKET}.novox")
    assert await refused_soon(mesh.ace, mesh.violations, "subscription", novox_plan), mesh.violations

    # None of it was written: the need is what ace put, no manifest of redis.
    needs = await client.provisioning(ProvisioningRequest(what=WHAT_NEEDS, node="ace", min_revision=http))
    assert [r.need.placeholder for r in needs.needs] == ["${port:http}"]
    manifests = await client.provisioning(ProvisioningRequest(what=WHAT_MANIFESTS, node="ace"))
    assert list(manifests.manifests) == []


async def test_the_verbs_refuse_what_is_not_the_nodes_or_not_well_formed_and_answer_no_other_inbox(mesh: Mesh) -> None:
    client = mesh.client()
    need = Need(placeholder="${port:grpc}").SerializeToString()
    assert await mesh.raw_put("novox.web.port.grpc", need) == 403
    assert await mesh.raw_put("ace.web.port", need) == 400
    assert await mesh.raw_put("ace.web.port.grpc", b"\xff\xff\xff") == 400
    with pytest.raises(ProvisionerError) as too_large:
        await client.put_need("web", "config", "big", Need(placeholder="x" * (65 * 1024)))
    assert too_large.value.code == 413

    # A put whose reply subject is novox's inbox (or an operator's): not
    # answered there. In one account the service refuses it, storing
    # nothing; runs-as, it sees only nats-server's _R_ reply, stores ace's
    # own record and answers, and nats-server delivers the answer in ace's
    # own account, where no one else is.
    heard: list[str] = []

    async def on_reply(msg: Msg) -> None:
        heard.append(msg.subject)

    theirs = await mesh.novox.subscribe(f"{inbox_prefix('node', 'novox')}.>", cb=on_reply)
    await mesh.novox.flush()
    headers = {"Content-Type": "application/protobuf"}
    owners: list[tuple[Role, str]] = [("node", "novox"), ("operator", "alice")]
    for role, owner in owners:  # each its own key: which was stored, if any, tells
        stolen = PutRequest(record=Record(what=What.WHAT_NEEDS, key=f"ace.web.port.to_{owner}", value=need))
        await mesh.ace.publish(node_subject(PUT_SUBJECT, "ace"), stolen.SerializeToString(),
                               reply=f"{inbox_prefix(role, owner)}.stolen", headers=headers)
    await mesh.ace.flush()
    # A write after them, answered: the copy read at its revision holds
    # whatever the two would have written.
    after = await client.put_need("web", "port", "after", Need(placeholder="${port:after}"))
    await asyncio.sleep(0.5)
    await theirs.unsubscribe()
    needs = await client.provisioning(ProvisioningRequest(what=WHAT_NEEDS, node="ace", min_revision=after))
    stored = ["after"] if mesh.api_prefix is None else ["after", "to_alice", "to_novox"]
    assert {"heard by novox": heard, "stored": sorted(r.name for r in needs.needs)} == {"heard by novox": [], "stored": stored}
    assert list(needs.malformed) == []
    await mesh.ace.flush()
    assert mesh.violations == []


async def test_a_provider_binds_through_its_bind_verb_and_publishes_nothing_into_its_bucket(mesh: Mesh) -> None:
    node = mesh.client()
    provider = ProvisionerClient(mesh.pg, provider="pg")
    assert provider.provider == "pg"
    declared = await node.put_manifest("pg", Manifest(offers=[Offer(provision="database")]))
    need_at = await node.put_need(
        "shop", "bound", "db", Need(placeholder="${bound:db}", provider="pg", provision="database", local="main")
    )
    provisions = await provider.provisions_all(ProvisionsRequest(provider="pg", min_revisions=Revisions(needs=need_at)))
    assert [(p.node, p.key) for p in provisions.provisions] == [("ace", "ace.shop.database.main")]

    bound = await provider.bind("ace.shop.database.main", b"postgres://db")
    composed = await node.compose_all(ComposeRequest(
        node="ace", module="shop", min_revisions=Revisions(needs=need_at, manifests=declared.revision, bound={"pg_bound": bound}),
    ))
    assert [(p.key, p.bound_revision, is_bound(p), p.manifest_digest) for p in composed.provisions] == [
        ("ace.shop.database.main", bound, True, declared.digest)
    ]

    # Its own key's subject, and its bucket's stream information: refused.
    own = "$KV.pg_bound.ace.shop.database.main"
    await mesh.pg.publish(own, b"forged")
    assert await refused_soon(mesh.pg, mesh.pg_violations, "publish", own), mesh.pg_violations
    info = "$JS.API.STREAM.INFO.KV_pg_bound"
    await mesh.pg.publish(info, b"")
    assert await refused_soon(mesh.pg, mesh.pg_violations, "publish", info), mesh.pg_violations
    again = await node.compose_all(ComposeRequest(node="ace", module="shop"))
    assert [p.bound_revision for p in again.provisions] == [bound]

    # A malformed key is the verb's 400; unbind leaves a marker.
    with pytest.raises(ProvisionerError) as malformed:
        await provider.bind("ace.shop", b"x")
    assert malformed.value.code == 400
    unbound = await provider.unbind("ace.shop.database.main")
    assert unbound > bound
    assert len(mesh.pg_violations) == 2, mesh.pg_violations


async def test_a_node_makes_no_consumer_of_the_plans_stream_nor_reads_a_key_a_direct_gets_body_names(mesh: Mesh) -> None:
    # One consumer a node may make is one more it may make (a durable
    # outlives its connection), until the stream holds no more and every
    # node's watch fails: even of its own key, each is refused.
    ace_key = f"$KV.{PLANS_BUCKET}.ace"
    jsm = mesh.ace.jsm(prefix=mesh.api, timeout=1)
    for config in (
        ConsumerConfig(name="greedy", durable_name="greedy", filter_subject=ace_key),  # CONSUMER.CREATE.<stream>.<name>.<filter>
        ConsumerConfig(name="greedy", filter_subject=ace_key, inactive_threshold=3600.0),
        ConsumerConfig(durable_name="greedy", filter_subject=ace_key),  # CONSUMER.DURABLE.CREATE.<stream>.<name>
    ):
        with pytest.raises(NATSTimeoutError):  # refused: no answer comes
            await jsm.add_consumer(PLANS_STREAM, config)
    assert refused(mesh.violations, "publish", f"{mesh.api}.CONSUMER.CREATE.{PLANS_STREAM}.greedy.{ace_key}"), mesh.violations
    assert refused(mesh.violations, "publish", f"{mesh.api}.CONSUMER.DURABLE.CREATE.{PLANS_STREAM}.greedy"), mesh.violations
    # Nor the direct get whose body names a key, novox's or its own.
    for node in ("novox", "ace"):
        with pytest.raises(NATSTimeoutError):
            body = json.dumps({"last_by_subj": f"$KV.{PLANS_BUCKET}.{node}"}).encode()
            await mesh.ace.request(f"{mesh.api}.DIRECT.GET.{PLANS_STREAM}", body, timeout=1)
    assert refused(mesh.violations, "publish", f"{mesh.api}.DIRECT.GET.{PLANS_STREAM}"), mesh.violations


def refused(violations: list[str], what: str, subject: str) -> bool:
    """Whether nats-server reported a permission violation for a publish
    to, or a subscription to, exactly subject."""
    # nats-py reports the server's -ERR in lower case.
    want = f"nats: permissions violation for {what} to {subject}".lower()
    return any(v.lower().replace('"', "").replace("'", "").strip() == want for v in violations)


async def refused_soon(nc: NATS, violations: list[str], what: str, subject: str) -> bool:
    """Whether nats-server reports, within 2 s, a permission violation for
    a publish to, or a subscription to, exactly subject: nats-py tells of it
    a little after the flush that follows it."""
    await nc.flush()
    for _ in range(200):
        if refused(violations, what, subject):
            return True
        await asyncio.sleep(0.01)
    return refused(violations, what, subject)
