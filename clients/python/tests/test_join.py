"""Joining pages, checked with the conformance suite's own data: the pages a
page case expects join to the whole answer its unpaged twin expects. No
server is needed: this checks the join and the page cases against each other."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf import json_format

from mesh_provisioner import (
    ComposeResponse,
    ProvisioningResponse,
    ProvisionsResponse,
    join_compose_pages,
    join_provisioning_pages,
    join_provisions_pages,
)
from server import CASES


def expected(name: str) -> dict[str, Any]:
    expect: dict[str, Any] = json.loads((CASES / f"{name}.json").read_text())["expect"]
    return expect


@pytest.mark.parametrize(
    ("paged", "whole"),
    [("page-compose-plan-continues", "compose-node"), ("page-compose-module", "compose-module")],
)
def test_compose_pages_join_to_the_whole_composition(paged: str, whole: str) -> None:
    pages = [json_format.ParseDict(p, ComposeResponse()) for p in expected(paged)["pages"]]
    assert len(pages) > 1
    assert join_compose_pages(pages) == json_format.ParseDict(expected(whole)["answer"], ComposeResponse())


@pytest.mark.parametrize(
    ("paged", "whole"),
    [("page-needs-records-and-malformed", "needs-all"), ("page-registry", "registry-empty-request"), ("page-applied-exact-multiple", "applied-all")],
)
def test_provisioning_pages_join_to_the_whole_answer(paged: str, whole: str) -> None:
    pages = [json_format.ParseDict(p, ProvisioningResponse()) for p in expected(paged)["pages"]]
    assert len(pages) > 1
    assert join_provisioning_pages(pages) == json_format.ParseDict(expected(whole)["answer"], ProvisioningResponse())


def test_provisions_pages_join_to_the_whole_answer() -> None:
    pages = [json_format.ParseDict(p, ProvisionsResponse()) for p in expected("provisions-provider-paged")["pages"]]
    assert len(pages) > 1
    whole = json_format.ParseDict(expected("provisions-provider")["answer"], ProvisionsResponse())
    assert join_provisions_pages(pages) == whole


def test_compose_join_carries_the_plan_digest_and_keeps_a_continued_plans_builds() -> None:
    """Every page carries the whole composition's digest: the join has the
    last page's. A plan continued on the next page keeps the builds of the
    page it starts on, and the pages stay as they came."""
    whole = json_format.ParseDict(expected("compose-builds-between")["answer"], ComposeResponse())
    assert whole.plan_digest.startswith("xxh3:") and len(whole.plan_digest) == len("xxh3:") + 32
    web = [i for i, plan in enumerate(whole.plans) if plan.module == "web"][0]
    assert len(whole.plans[web].items) > 1 and whole.plans[web].wanted_build
    first, second = ComposeResponse(), ComposeResponse()
    first.CopyFrom(whole)
    second.CopyFrom(whole)
    del first.plans[web + 1 :]
    del first.plans[web].items[1:]
    del first.refusals[:]
    first.next_page_token = "t"
    del second.plans[:web]
    del second.plans[0].items[:1]
    # The continuing page's plan names no builds: the join keeps the first's.
    second.plans[0].wanted_build = second.plans[0].newest_build = ""
    del second.provisions[:]
    del second.phases[:]
    first_copy, second_copy = ComposeResponse(), ComposeResponse()
    first_copy.CopyFrom(first)
    second_copy.CopyFrom(second)

    joined = join_compose_pages([first, second])
    assert joined.plan_digest == whole.plan_digest
    assert joined == whole
    assert (first, second) == (first_copy, second_copy)


def test_the_paged_composition_carries_the_unpaged_ones_digest_on_every_page() -> None:
    pages = [json_format.ParseDict(p, ComposeResponse()) for p in expected("page-compose-plan-continues")["pages"]]
    digest = json_format.ParseDict(expected("compose-node")["answer"], ComposeResponse()).plan_digest
    assert digest and all(page.plan_digest == digest for page in pages)
    assert join_compose_pages(pages).plan_digest == digest
