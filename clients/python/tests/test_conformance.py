"""The Python runner of the conformance suite: every case of
conformance/cases against the real binary, each on a fresh server, reported
by the case's name. conformance/README.md describes the cases."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from mesh_provisioner import (
    ComposeRequest,
    ComposeResponse,
    EndpointStatsData,
    ProvisioningRequest,
    ProvisioningResponse,
    ProvisionsRequest,
    ProvisionsResponse,
    error_of,
    inbox_prefix,
)
from mesh.provisioner.v1.write_pb2 import (
    ApplyRequest,
    ApplyResponse,
    BindRequest,
    DeclareRequest,
    DeleteRequest,
    PutRequest,
    WriteResponse,
)
from server import CASES, SERVE_ARGS, apply, serve

MESSAGES: dict[str, tuple[type[Message], type[Message]]] = {
    "provisioning": (ProvisioningRequest, ProvisioningResponse),
    "compose": (ComposeRequest, ComposeResponse),
    "provisions": (ProvisionsRequest, ProvisionsResponse),
    "put": (PutRequest, WriteResponse),
    "delete": (DeleteRequest, WriteResponse),
    "apply": (ApplyRequest, ApplyResponse),
    "declare": (DeclareRequest, WriteResponse),
    "bind": (BindRequest, WriteResponse),
}
CONTENT_TYPES = {"binary": "application/protobuf", "json": "application/json"}
CASE_FILES = sorted(CASES.glob("*.json"))


class Reply:
    """What a request got: an answer, or a refusal's code and sentence."""

    def __init__(self, answer: Message | None, content_type: str, code: int = 0, sentence: str = "") -> None:
        self.answer, self.content_type, self.code, self.sentence = answer, content_type, code, sentence


def subject_of(case: dict[str, Any]) -> str:
    """The subject a case's request goes to: the verb's, or its addressed
    subject mesh-provisioner.<verb>.<address> (a node's or a provider's)."""
    subject = f"mesh-provisioner.{case['verb']}"
    return f"{subject}.{case['address']}" if "address" in case else subject


async def ask(nc: NATS, case: dict[str, Any], body: bytes, content_type: str | None) -> Reply:
    verb = case["verb"]
    headers = {"Content-Type": content_type} if content_type else None
    msg = await nc.request(subject_of(case), body, timeout=10, headers=headers)
    reply_type = (msg.headers or {}).get("Content-Type", "")
    refusal = error_of(msg.headers)
    if refusal is not None:
        return Reply(None, reply_type, refusal.code, refusal.description)
    answer = MESSAGES[verb][1]()
    if reply_type == "application/json":
        json_format.Parse(msg.data, answer)
    else:
        answer.ParseFromString(msg.data)
    return Reply(answer, reply_type)


def parse_request(verb: str, fields: dict[str, Any] | None, page_token: str = "") -> Message:
    request = MESSAGES[verb][0]()
    json_format.ParseDict(fields or {}, request)
    if page_token:
        request.page_token = page_token  # type: ignore[attr-defined]
    return request


def encode(request: Message, encoding: str) -> bytes:
    if encoding == "json":
        return json_format.MessageToJson(request).encode()
    return request.SerializeToString(deterministic=True)


def comparable(answer: Message) -> Message:
    """The answer without what the suite does not compare: the opaque page
    token (only whether it is empty counts) and compose's timings."""
    copy = type(answer)()
    copy.CopyFrom(answer)
    if "next_page_token" in copy.DESCRIPTOR.fields_by_name:  # a write's answer has none
        copy.ClearField("next_page_token")
    if isinstance(copy, ComposeResponse):
        copy.ClearField("phases")
    return copy


def check(verb: str, expect: dict[str, Any], got: list[Reply], more: bool = False) -> None:
    """Compares what a request got with what the case expects; more says
    the last page expected is followed by others (a case with "then")."""
    if "error" in expect:
        want, reply = expect["error"], got[0]
        assert reply.answer is None, f"answered, want error {want['code']}"
        assert reply.code == want["code"], f"code {reply.code} ({reply.sentence}), want {want['code']}"
        if "sentence" in want:
            assert reply.sentence == want["sentence"]
        if "sentence_prefix" in want:
            assert reply.sentence.startswith(want["sentence_prefix"]), reply.sentence
        return
    pages = expect.get("pages", [expect.get("answer")])
    for i, reply in enumerate(got):
        assert reply.answer is not None, f"page {i + 1}: refused with {reply.code}: {reply.sentence}"
    assert len(got) == len(pages), f"{len(got)} pages, want {len(pages)}"
    for i, (reply, want) in enumerate(zip(got, pages)):
        assert reply.answer is not None
        last = i == len(pages) - 1 and not more
        token = getattr(reply.answer, "next_page_token", "")
        assert (token == "") == last, f"page {i + 1} of {len(pages)}: next_page_token {token!r}"
        expected = json_format.ParseDict(want, MESSAGES[verb][1]())
        actual = comparable(reply.answer)
        if comparable(expected) != actual:
            assert json_format.MessageToDict(actual) == json_format.MessageToDict(comparable(expected)), f"page {i + 1}"


async def run_request(nc: NATS, case: dict[str, Any], encoding: str) -> None:
    verb = case["verb"]
    expect = case["expect"]
    request = parse_request(verb, case.get("request"))
    got: list[Reply] = []
    while True:
        reply = await ask(nc, case, encode(request, encoding), CONTENT_TYPES[encoding])
        assert reply.content_type == CONTENT_TYPES[encoding], f"{encoding}: answered with Content-Type {reply.content_type!r}"
        got.append(reply)
        token = getattr(reply.answer, "next_page_token", "") if reply.answer is not None else ""
        if "pages" not in expect or not token or len(got) > len(expect["pages"]) or "then" in case:
            break
        request = parse_request(verb, case.get("request"), token)
    check(verb, expect, got, more="then" in case)
    if "then" in case:
        token = got[0].answer.next_page_token if got[0].answer is not None else ""  # type: ignore[attr-defined]
        assert token, "then: the first page has no next_page_token"
        then = parse_request(verb, case["then"]["request"], token)
        check(verb, case["then"]["expect"], [await ask(nc, case, encode(then, encoding), CONTENT_TYPES[encoding])])


async def run_raw(nc: NATS, case: dict[str, Any]) -> None:
    body = case["body"]
    data = body["text"].encode() if "text" in body else base64.b64decode(body["base64"])
    # Sent first with a reply that is not the asker's inbox: the service
    # handles requests in order, so by the time the second is answered the
    # first was refused or answered.
    heard: list[str] = []

    async def on_foreign(msg: Msg) -> None:
        heard.append(msg.subject)

    foreign = await nc.subscribe(case["reply"], cb=on_foreign) if "reply" in case else None
    if "reply" in case:
        headers = {"Content-Type": body["content_type"]} if "content_type" in body else None
        await nc.publish(subject_of(case), data, reply=case["reply"], headers=headers)
    reply = await ask(nc, case, data, body.get("content_type"))
    if foreign is not None:
        await nc.flush()
        await foreign.unsubscribe()
        assert heard == [], f"messages reached {case['reply']}, the reply subject that is not the asker's inbox"
    if "content_type" in case["expect"]:
        assert reply.content_type == case["expect"]["content_type"]
    check(case["verb"], case["expect"], [reply])


async def check_stats(nc: NATS) -> None:
    """Asks $SRV.STATS.mesh-provisioner and decodes every endpoint's data as
    an EndpointStatsData, refusing fields the message does not define."""
    reply = await nc.request("$SRV.STATS.mesh-provisioner", b"", timeout=10)
    stats = json.loads(reply.data)
    assert stats["type"] == "io.nats.micro.v1.stats_response"
    assert stats["endpoints"], "stats list no endpoint"
    for endpoint in stats["endpoints"]:
        try:
            data = json_format.ParseDict(endpoint["data"], EndpointStatsData(), ignore_unknown_fields=False)
        except json_format.ParseError as err:
            pytest.fail(f"endpoint {endpoint['name']}: data is not a mesh.provisioner.v1.EndpointStatsData: {err}\n{endpoint['data']}")
        assert len(data.buckets) == 5, f"endpoint {endpoint['name']}: buckets (the five provisioning buckets)"
        assert data.HasField("answer_cache"), f"endpoint {endpoint['name']}: answer_cache"


def asker_inbox(case: dict[str, Any]) -> str | None:
    """The inbox prefix of the identity an addressed case asks as (the
    provider for provisions and bind, else the node): the service answers a
    request on an identity's own subject only on that identity's inbox. None
    for a bare subject: nats-py's own."""
    if "address" not in case:
        return None
    if case["verb"] in ("provisions", "bind"):
        return inbox_prefix("provider", case["address"])
    return inbox_prefix("node", case["address"].split(".")[0])


@pytest.mark.parametrize("case_file", CASE_FILES, ids=[f.stem for f in CASE_FILES])
async def test_case(case_file: Path) -> None:
    case = json.loads(case_file.read_text())
    if case.get("pending") and not os.environ.get("CONFORMANCE_RUN_PENDING"):
        pytest.skip(f"pending: {case['pending']}")
    async with serve([*SERVE_ARGS, *case.get("server_args", [])]) as url:
        await apply(url, case_file)
        inbox = asker_inbox(case)
        if inbox is None:
            nc = await nats.connect(url, name=f"mesh-provisioner conformance {case_file.stem}")
        else:
            nc = await nats.connect(url, name=f"mesh-provisioner conformance {case_file.stem}", inbox_prefix=inbox)
        try:
            if "body" in case:
                await run_raw(nc, case)
            else:
                for encoding in ("binary", "json"):
                    await run_request(nc, case, encoding)
            await check_stats(nc)
        finally:
            await nc.close()


def test_suite_has_cases() -> None:
    assert len(CASE_FILES) >= 40
