// The clients agree by test: the node-name rule, the timeouts and the states
// of a plan are data in conformance/clients, which the Go client
// (client/agree_test.go), this one and the Python client
// (clients/python/tests/test_agree.py) each check themselves against. No
// server is needed.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import { fromJson, toJson, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";
import type { NatsConnection } from "@nats-io/nats-core";

import * as api from "../src/index.js";
import {
  ComposeResponseSchema,
  inboxPrefix,
  ModulePlanSchema,
  PlanItemSchema,
  ProvisionerClient,
  ProvisionSchema,
  type ComposeResponse,
  type ModulePlan,
  type PlanItem,
  type Provision,
} from "../src/index.js";

// build-test/test/ -> the repository's root.
const repo = resolve(fileURLToPath(import.meta.url), "../../../../..");

function agreement<T>(name: string): T {
  return JSON.parse(readFileSync(join(repo, "conformance", "clients", `${name}.json`), "utf8")) as T;
}

/** The Go keys.Echo: a name's first 64 characters, and "…" when it is longer. */
function echo(name: string): string {
  const chars = [...name];
  return chars.length > 64 ? `${chars.slice(0, 64).join("")}…` : name;
}

/** Runs a check unless the data says it is pending, as the conformance suite's runners do. */
function unlessPending(pending: Record<string, string> | undefined, check: string): { skip?: string } {
  const why = pending?.[check];
  return why !== undefined && process.env["CONFORMANCE_RUN_PENDING"] === undefined ? { skip: `pending: ${why}` } : {};
}

interface NodeNames {
  about: string;
  checks: Record<"go" | "ts" | "python", string[]>;
  names: { about: string; name: string; accepted: boolean; pending?: Record<string, string> }[];
}

describe("node names (conformance/clients/node-names.json)", () => {
  const data = agreement<NodeNames>("node-names");

  /** What a connection throws when a client uses it: the name was taken. */
  class PastTheName extends Error {}
  // A connection every use of which throws PastTheName: a client that took
  // the name goes on to it (watchPlan subscribes); one that refused it
  // threw before.
  const unreachable = new Proxy({}, {
    get(_target, property) {
      throw new PastTheName(`the connection's ${String(property)} was used`);
    },
  }) as NatsConnection;

  /** Each check: whether the client took the name. A refusal is a TypeError; anything else fails. */
  const refused = (err: unknown): false => {
    if (err instanceof TypeError) {
      return false;
    }
    throw err;
  };
  const checks: Record<string, (name: string) => Promise<boolean>> = {
    "new ProvisionerClient({ node })": async (name) => {
      try {
        return new ProvisionerClient(unreachable, { node: name }).node === name;
      } catch (err) {
        return refused(err);
      }
    },
    "new ProvisionerClient({ provider })": async (name) => {
      try {
        return new ProvisionerClient(unreachable, { provider: name }).provider === name;
      } catch (err) {
        return refused(err);
      }
    },
    watchPlan: async (name) => {
      try {
        await new ProvisionerClient(unreachable).watchPlan(name).next();
      } catch (err) {
        if (err instanceof PastTheName) {
          return true;
        }
        return refused(err);
      }
      throw new Error("watchPlan yielded on a connection that cannot be used");
    },
    'inboxPrefix("node")': async (name) => {
      try {
        return inboxPrefix("node", name) === `_INBOX_MESH.node.${name}`;
      } catch (err) {
        return refused(err);
      }
    },
  };

  it("names the checks this test makes", () => {
    assert.deepEqual(Object.keys(checks).sort(), [...data.checks.ts].sort());
  });

  for (const check of data.checks.ts) {
    describe(check, () => {
      for (const { about, name, accepted, pending } of data.names) {
        it(`${accepted ? "takes" : "refuses"} ${about}`, unlessPending(pending, check), async () => {
          assert.equal(await checks[check]!(name), accepted, `${check} of ${JSON.stringify(echo(name))}`);
        });
      }
    });
  }
});

interface Timeouts {
  about: string;
  timeouts: { about: string; ms: number; go: string | null; ts: string | null; python: string | null }[];
}

describe("timeouts (conformance/clients/timeouts.json)", () => {
  const data = agreement<Timeouts>("timeouts");
  for (const { about, ms, ts } of data.timeouts) {
    if (ts === null) {
      continue;
    }
    it(`${ts} is ${ms} ms`, () => {
      assert.ok(ts in api, `the package exports no ${ts}`);
      assert.equal((api as Record<string, unknown>)[ts], ms, about);
    });
  }
});

interface PlanStates {
  about: string;
  functions: Record<string, { about: string; go: string; ts: string; python: string }>;
  cases: {
    about: string;
    function: string;
    plan?: JsonValue;
    build?: string;
    provision?: JsonValue;
    composition?: JsonValue;
    want: JsonValue;
  }[];
}

describe("plan states (conformance/clients/plan-states.json)", () => {
  const data = agreement<PlanStates>("plan-states");
  /** The function the package exports under name. */
  const exported = <F>(name: string): F => {
    const fn = (api as Record<string, unknown>)[name];
    assert.equal(typeof fn, "function", `the package exports no function ${name}`);
    return fn as F;
  };
  /** Messages as protobuf JSON, for a readable diff. */
  const jsonOf = <Desc extends DescMessage>(schema: Desc, messages: MessageShape<Desc>[]): JsonValue[] =>
    messages.map((m) => toJson(schema, m));
  const wantOf = <Desc extends DescMessage>(schema: Desc, want: JsonValue): JsonValue[] =>
    (want as JsonValue[]).map((w) => toJson(schema, fromJson(schema, w)));

  it("names the functions this test knows", () => {
    assert.deepEqual(Object.keys(data.functions).sort(), ["is_bound", "pending", "plan_at"]);
  });

  for (const c of data.cases) {
    const name = data.functions[c.function]!.ts;
    it(`${name}: ${c.about}`, () => {
      switch (c.function) {
        case "plan_at": {
          const plan = fromJson(ModulePlanSchema, c.plan!);
          const got = exported<(plan: ModulePlan, build: string) => PlanItem[]>(name)(plan, c.build!);
          assert.deepEqual(jsonOf(PlanItemSchema, got), wantOf(PlanItemSchema, c.want));
          assert.ok(got.every((item) => plan.items.includes(item)), "the plan's own items, not copies");
          break;
        }
        case "is_bound":
          assert.equal(exported<(p: Provision) => boolean>(name)(fromJson(ProvisionSchema, c.provision!)), c.want);
          break;
        case "pending": {
          const composition = fromJson(ComposeResponseSchema, c.composition!);
          const got = exported<(c: ComposeResponse) => Provision[]>(name)(composition);
          assert.deepEqual(jsonOf(ProvisionSchema, got), wantOf(ProvisionSchema, c.want));
          assert.ok(got.every((p) => composition.provisions.includes(p)), "the composition's own provisions, not copies");
          break;
        }
        default:
          assert.fail(`no function ${c.function}`);
      }
    });
  }
});
