"""The clients agree by test: the node-name rule, the timeouts and the states
of a plan are data in conformance/clients, which the Go client
(client/agree_test.go), the TypeScript client (clients/ts/test/agree.test.ts)
and this one each check themselves against. No server is needed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, cast

import pytest
from google.protobuf import json_format
from nats.aio.client import Client as NATS

import mesh_provisioner
from mesh_provisioner import ComposeResponse, ModulePlan, PlanItem, Provision, ProvisionerClient, inbox_prefix
from server import REPO

AGREEMENT = REPO / "conformance" / "clients"


def agreement(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((AGREEMENT / f"{name}.json").read_text())
    return data


def echo(name: str) -> str:
    """The Go keys.Echo: a name's first 64 characters, and "…" when it is longer."""
    return name if len(name) <= 64 else name[:64] + "…"


def unless_pending(pending: dict[str, str] | None, check: str) -> None:
    """Skips a check the data says is pending, as the conformance suite's runners do."""
    why = (pending or {}).get(check)
    if why and not os.environ.get("CONFORMANCE_RUN_PENDING"):
        pytest.skip(f"pending: {why}")


# Node names.

NAMES = agreement("node-names")


class PastTheName(Exception):
    """What a connection raises when a client uses it: the name was taken."""


class Unreachable:
    """A connection every use of which raises PastTheName: a client that took
    the name goes on to it (watch_plan subscribes); one that refused it
    raised before."""

    def __getattr__(self, name: str) -> Any:
        raise PastTheName(f"the connection's {name} was used")


UNREACHABLE = cast(NATS, Unreachable())


async def takes_node(name: str) -> bool:
    try:
        return ProvisionerClient(UNREACHABLE, node=name).node == name
    except ValueError:
        return False


async def takes_provider(name: str) -> bool:
    try:
        return ProvisionerClient(UNREACHABLE, provider=name).provider == name
    except ValueError:
        return False


async def watch_plan_takes(name: str) -> bool:
    try:
        await anext(ProvisionerClient(UNREACHABLE).watch_plan(name))
    except PastTheName:
        return True
    except ValueError:
        return False
    raise AssertionError("watch_plan yielded on a connection that cannot be used")


async def inbox_prefix_takes(name: str) -> bool:
    try:
        return inbox_prefix("node", name) == f"_INBOX_MESH.node.{name}"
    except ValueError:
        return False


# Each check: whether the client took the name. A refusal is a ValueError;
# anything else fails the test.
CHECKS: dict[str, Callable[[str], Any]] = {
    "ProvisionerClient(node=)": takes_node,
    "ProvisionerClient(provider=)": takes_provider,
    "watch_plan": watch_plan_takes,
    'inbox_prefix("node")': inbox_prefix_takes,
}


def test_the_data_names_the_checks_this_test_makes() -> None:
    assert sorted(CHECKS) == sorted(NAMES["checks"]["python"])


@pytest.mark.parametrize(
    ("check", "entry"),
    [
        pytest.param(check, entry, id=f"{check}: {'takes' if entry['accepted'] else 'refuses'} {entry['about']}")
        for check in NAMES["checks"]["python"]
        for entry in NAMES["names"]
    ],
)
async def test_node_name(check: str, entry: dict[str, Any]) -> None:
    unless_pending(entry.get("pending"), check)
    assert await CHECKS[check](entry["name"]) is entry["accepted"], f"{check} of {echo(entry['name'])!r}"


# Timeouts: Python's are seconds, as its timeout arguments are.

TIMEOUTS = agreement("timeouts")


@pytest.mark.parametrize(
    "timeout",
    [pytest.param(t, id=f"{t['python']} is {t['ms']} ms") for t in TIMEOUTS["timeouts"] if t["python"] is not None],
)
def test_timeout(timeout: dict[str, Any]) -> None:
    name = timeout["python"]
    assert name in mesh_provisioner.__all__, f"the package exports no {name}"
    assert getattr(mesh_provisioner, name) == timeout["ms"] / 1000, timeout["about"]


# Plan states.

STATES = agreement("plan-states")


def exported(name: str) -> Callable[..., Any]:
    assert name in mesh_provisioner.__all__, f"the package exports no {name}"
    fn = getattr(mesh_provisioner, name)
    assert callable(fn)
    return cast(Callable[..., Any], fn)


def test_the_data_names_the_functions_this_test_knows() -> None:
    assert sorted(STATES["functions"]) == ["is_bound", "pending", "plan_at"]


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=f"{STATES['functions'][c['function']]['python']}: {c['about']}") for c in STATES["cases"]],
)
def test_plan_state(case: dict[str, Any]) -> None:
    fn = exported(STATES["functions"][case["function"]]["python"])
    if case["function"] == "plan_at":
        plan = json_format.ParseDict(case["plan"], ModulePlan())
        items = fn(plan, case["build"])
        assert items == [json_format.ParseDict(w, PlanItem()) for w in case["want"]]
        assert all(any(item is own for own in plan.items) for item in items), "the plan's own items, not copies"
    elif case["function"] == "is_bound":
        assert fn(json_format.ParseDict(case["provision"], Provision())) is case["want"]
    elif case["function"] == "pending":
        composition = json_format.ParseDict(case["composition"], ComposeResponse())
        provisions = fn(composition)
        assert provisions == [json_format.ParseDict(w, Provision()) for w in case["want"]]
        assert all(any(p is own for own in composition.provisions) for p in provisions), "the composition's own provisions, not copies"
    else:
        pytest.fail(f"no function {case['function']}")
