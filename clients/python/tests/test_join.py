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
