"""Builds and bound provisions: plan_at and is_bound, and the page joins with
builds, manifests and revisions.bound, checked against the conformance
suite's own answers (conformance/cases). No server is needed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf import json_format

from mesh_provisioner import (
    ComposeResponse,
    ModulePlan,
    PlanItem,
    Provision,
    ProvisioningResponse,
    is_bound,
    join_compose_pages,
    join_provisioning_pages,
    plan_at,
)
from server import CASES


def answer_of(name: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads((CASES / f"{name}.json").read_text())["expect"]["answer"]
    return answer


BETWEEN = json_format.ParseDict(answer_of("compose-builds-between"), ComposeResponse())


def plan_of(answer: ComposeResponse, module: str) -> ModulePlan:
    [plan] = [p for p in answer.plans if p.module == module]
    return plan


# compose-builds-between: module web wants b1 and knows b2 as newest; module
# db's applied record names no build (its need names b9).
@pytest.mark.parametrize(
    ("module", "build", "names"),
    [
        pytest.param("web", "b1", ["http", "legacy"], id="wanted build: the items that name it"),
        pytest.param("web", "b2", ["db", "http"], id="newest build: the items that name it"),
        pytest.param("web", "b0", [], id="a build neither wanted nor newest: none"),
        pytest.param("web", "", [], id="the empty build of a plan of builds: none"),
        pytest.param("db", "b9", ["sql"], id="a plan without builds: every item"),
        pytest.param("db", "b1", ["sql"], id="a plan without builds: every item at another build"),
        pytest.param("db", "", ["sql"], id="a plan without builds: every item at the empty build"),
    ],
)
def test_plan_at(module: str, build: str, names: list[str]) -> None:
    assert [item.name for item in plan_at(plan_of(BETWEEN, module), build)] == names


def test_plan_at_keeps_the_plans_items_in_a_new_list() -> None:
    plan = plan_of(BETWEEN, "db")
    items = plan_at(plan, "b1")
    assert items[0] is plan.items[0]
    items.pop()
    assert len(plan.items) == 1


def test_plan_at_reads_the_plans_builds_a_newest_build_alone_names_builds() -> None:
    plan = ModulePlan(module="web", newest_build="b2", items=[PlanItem(name="a", builds=["b2"]), PlanItem(name="b")])
    assert [item.name for item in plan_at(plan, "b2")] == ["a"]


@pytest.mark.parametrize(
    ("provision", "bound"),
    [
        pytest.param(Provision(provider="postgres", key="ace.web.db"), False, id="pending: no bound revision"),
        pytest.param(Provision(bound_revision=0), False, id="pending: bound revision zero"),
        pytest.param(Provision(bound_revision=1), True, id="bound at revision 1"),
        pytest.param(Provision(bound_revision=2**64 - 1), True, id="bound at the largest revision"),
    ],
)
def test_is_bound(provision: Provision, bound: bool) -> None:
    assert is_bound(provision) is bound


def test_is_bound_on_compose_provision_bound() -> None:
    answer = json_format.ParseDict(answer_of("compose-provision-bound"), ComposeResponse())
    assert [(p.key, is_bound(p)) for p in answer.provisions] == [("ace.web.db", True), ("ace.web.ro", False)]


def test_a_plan_of_builds_split_across_pages_joins_to_the_whole() -> None:
    """compose-builds-between cut after web's first item, as a server paging
    one need at a time would; revisions.bound is the last page's."""
    whole = ComposeResponse()
    whole.CopyFrom(BETWEEN)
    whole.revisions.CopyFrom(json_format.ParseDict(answer_of("read-your-writes-bound"), ComposeResponse()).revisions)
    assert dict(whole.revisions.bound) == {"postgres_bound": 2}

    first, second = ComposeResponse(), ComposeResponse()
    first.CopyFrom(whole)
    second.CopyFrom(whole)
    del first.plans[1].items[1:]
    del first.refusals[:]
    first.revisions.bound["postgres_bound"] = 1
    first.next_page_token = "t"
    del second.plans[0]
    del second.plans[0].items[0]
    del second.provisions[:]

    joined = join_compose_pages([first, second])
    assert joined == whole
    assert dict(joined.revisions.bound) == {"postgres_bound": 2}
    web = plan_of(joined, "web")
    assert (web.wanted_build, web.newest_build) == ("b1", "b2")
    assert [item.name for item in plan_at(web, "b2")] == ["db", "http"]


def test_a_bound_bucket_only_an_earlier_page_named_is_not_kept() -> None:
    """revisions are the last page's, whole: a map is replaced, not merged."""
    first, last = ComposeResponse(node="ace"), ComposeResponse(node="ace")
    first.revisions.bound["postgres_bound"] = 3
    last.revisions.needs = 4
    assert dict(join_compose_pages([first, last]).revisions.bound) == {}


def test_the_manifests_of_provisioning_pages_are_concatenated() -> None:
    whole = json_format.ParseDict(answer_of("manifests-provider"), ProvisioningResponse())
    assert len(whole.manifests) == 2
    pages = []
    for i, record in enumerate(whole.manifests):
        page = ProvisioningResponse(what=whole.what, revision=whole.revision, next_page_token="t" if i < len(whole.manifests) - 1 else "")
        page.manifests.append(record)
        pages.append(page)
    assert join_provisioning_pages(pages) == whole
