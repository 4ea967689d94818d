// Builds and bound provisions: planAt and isBound, and the page joins with
// builds, manifests and revisions.bound, checked against the conformance
// suite's own answers (conformance/cases). No server is needed.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import { clone, create, equals, fromJson, type JsonObject, type JsonValue } from "@bufbuild/protobuf";

import {
  ComposeResponseSchema,
  isBound,
  joinComposePages,
  joinProvisioningPages,
  ModulePlanSchema,
  planAt,
  ProvisioningResponseSchema,
  ProvisionSchema,
  type ComposeResponse,
  type ModulePlan,
} from "../src/index.js";

// build-test/test/ -> the repository's root.
const repo = resolve(fileURLToPath(import.meta.url), "../../../../..");

function answerOf(name: string): JsonObject {
  const c = JSON.parse(readFileSync(join(repo, "conformance", "cases", `${name}.json`), "utf8")) as { expect: { answer: JsonObject } };
  return c.expect.answer;
}

const between = fromJson(ComposeResponseSchema, answerOf("compose-builds-between"));
const planOf = (answer: ComposeResponse, module: string): ModulePlan => {
  const plan = answer.plans.find((p) => p.module === module);
  assert.ok(plan, `no plan of module ${module}`);
  return plan;
};

describe("planAt", () => {
  // compose-builds-between: module web wants b1 and knows b2 as newest;
  // module db's applied record names no build (its need names b9).
  const table: { about: string; module: string; build: string; names: string[] }[] = [
    { about: "the wanted build: the items that name it", module: "web", build: "b1", names: ["http", "legacy"] },
    { about: "the newest build: the items that name it", module: "web", build: "b2", names: ["db", "http"] },
    { about: "a build neither wanted nor newest: none", module: "web", build: "b0", names: [] },
    { about: "the empty build of a plan of builds: none", module: "web", build: "", names: [] },
    { about: "a plan without builds: every item at any build", module: "db", build: "b9", names: ["sql"] },
    { about: "a plan without builds: every item at another build", module: "db", build: "b1", names: ["sql"] },
    { about: "a plan without builds: every item at the empty build", module: "db", build: "", names: ["sql"] },
  ];
  for (const { about, module, build, names } of table) {
    it(`${module} at ${JSON.stringify(build)}: ${about}`, () => {
      assert.deepEqual(planAt(planOf(between, module), build).map((item) => item.name), names);
    });
  }

  it("keeps the plan's items, in order, in a new array", () => {
    const plan = planOf(between, "db");
    const items = planAt(plan, "b1");
    assert.notEqual(items, plan.items);
    assert.equal(items[0], plan.items[0]);
    items.pop();
    assert.equal(plan.items.length, 1);
  });

  it("reads the plan's builds, not only its items': a newest build alone still names builds", () => {
    const plan = create(ModulePlanSchema, {
      module: "web",
      newestBuild: "b2",
      items: [{ name: "a", builds: ["b2"] }, { name: "b", builds: [] }],
    });
    assert.deepEqual(planAt(plan, "b2").map((item) => item.name), ["a"]);
  });
});

describe("isBound", () => {
  const table: { about: string; provision: JsonValue; bound: boolean }[] = [
    { about: "pending: no bound revision", provision: { provider: "postgres", key: "ace.web.db" }, bound: false },
    { about: "pending: bound revision zero", provision: { boundRevision: "0" }, bound: false },
    { about: "bound at revision 1", provision: { boundRevision: "1" }, bound: true },
    { about: "bound at a revision past 2^53", provision: { boundRevision: "18446744073709551615" }, bound: true },
  ];
  for (const { about, provision, bound } of table) {
    it(about, () => assert.equal(isBound(fromJson(ProvisionSchema, provision)), bound));
  }

  it("the conformance answers: compose-provision-bound has one bound and one pending", () => {
    const answer = fromJson(ComposeResponseSchema, answerOf("compose-provision-bound"));
    assert.deepEqual(answer.provisions.map((p) => [p.key, isBound(p)]), [["ace.web.db", true], ["ace.web.ro", false]]);
  });
});

describe("joining pages with builds and bound", () => {
  it("a plan of builds split across pages joins to the whole, its builds kept; revisions.bound is the last page's", () => {
    // compose-builds-between cut after web's first item, as a server paging one need at a time would.
    const whole = clone(ComposeResponseSchema, between);
    whole.revisions = fromJson(ComposeResponseSchema, answerOf("read-your-writes-bound")).revisions;
    assert.deepEqual(whole.revisions?.bound, { postgres_bound: 2n });

    const first = clone(ComposeResponseSchema, whole);
    const second = clone(ComposeResponseSchema, whole);
    first.plans[1]!.items.splice(1);
    first.refusals = [];
    first.revisions!.bound = { postgres_bound: 1n };
    first.nextPageToken = "t";
    second.plans.splice(0, 1);
    second.plans[0]!.items.splice(0, 1);
    second.provisions = [];
    second.phases = [];

    const joined = joinComposePages([first, second]);
    joined.nextPageToken = "";
    assert.ok(equals(ComposeResponseSchema, joined, whole), "the join differs from the whole");
    assert.deepEqual(joined.revisions?.bound, { postgres_bound: 2n });
    const web = planOf(joined, "web");
    assert.deepEqual([web.wantedBuild, web.newestBuild], ["b1", "b2"]);
    assert.deepEqual(planAt(web, "b2").map((item) => item.name), ["db", "http"]);
  });

  it("carries the plan digest, every page's the whole's; a continued plan keeps the builds of the page it starts on; the pages stay as they came", () => {
    assert.match(between.planDigest, /^xxh3:[0-9a-f]{32}$/u);
    const first = clone(ComposeResponseSchema, between);
    const second = clone(ComposeResponseSchema, between);
    first.plans[1]!.items.splice(1);
    first.refusals = [];
    first.nextPageToken = "t";
    second.plans.splice(0, 1);
    second.plans[0]!.items.splice(0, 1);
    // A continuing page's plan naming no builds: the join keeps the first's.
    second.plans[0]!.wantedBuild = "";
    second.plans[0]!.newestBuild = "";
    second.provisions = [];
    second.phases = [];
    const [firstCopy, secondCopy] = [clone(ComposeResponseSchema, first), clone(ComposeResponseSchema, second)];

    const joined = joinComposePages([first, second]);
    assert.equal(joined.planDigest, between.planDigest);
    assert.ok(equals(ComposeResponseSchema, joined, between), "the join differs from the whole");
    const web = planOf(joined, "web");
    assert.deepEqual([web.wantedBuild, web.newestBuild], ["b1", "b2"]);
    assert.ok(equals(ComposeResponseSchema, first, firstCopy) && equals(ComposeResponseSchema, second, secondCopy), "the join changed a page");
  });

  it("the plan digest of the conformance suite's paged composition is the unpaged one's", () => {
    const c = JSON.parse(readFileSync(join(repo, "conformance", "cases", "page-compose-plan-continues.json"), "utf8")) as { expect: { pages: JsonObject[] } };
    const pages = c.expect.pages.map((page) => fromJson(ComposeResponseSchema, page));
    assert.ok(pages.length > 1 && pages.every((page) => page.planDigest === pages[0]!.planDigest && page.planDigest !== ""));
    const whole = fromJson(ComposeResponseSchema, answerOf("compose-node"));
    const joined = joinComposePages(pages);
    assert.equal(joined.planDigest, whole.planDigest);
    joined.phases = whole.phases;
    assert.ok(equals(ComposeResponseSchema, joined, whole), "the join differs from the whole");
  });

  it("the manifests of provisioning pages are concatenated", () => {
    const whole = fromJson(ProvisioningResponseSchema, answerOf("manifests-provider"));
    assert.equal(whole.manifests.length, 2);
    const pages = whole.manifests.map((record, i) => {
      const page = clone(ProvisioningResponseSchema, whole);
      page.manifests = [record];
      page.nextPageToken = i < whole.manifests.length - 1 ? "t" : "";
      return page;
    });
    assert.ok(equals(ProvisioningResponseSchema, joinProvisioningPages(pages), whole), "the join differs from the whole");
  });
});
