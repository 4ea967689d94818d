// End to end: the TypeScript client against the real mesh-provisioner binary,
// on the nats-server it embeds, holding the data set that the Go seed tool
// (internal/testkit/e2e/seed) writes. The expectations below are that data set, as
// the comment at the top of internal/testkit/e2e/seed/main.go lists it.
//
// Run by `make test`, which builds the binaries and sets
// MESH_PROVISIONER_BIN and MESH_PROVISIONER_SEED_BIN, and
// MESH_PROVISIONER_AUTHNATS_BIN: a nats-server of its own on which a plan's
// watch starts before any instance serves.
import assert from "node:assert/strict";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { once } from "node:events";
import { createConnection, createServer, type Socket } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";

import { create, equals, fromBinary, fromJson, toBinary, type DescMessage, type JsonValue, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createInbox, Empty, headers, type NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";

import {
  AppliedRecordSchema,
  APPLY_ENDPOINT,
  APPLY_SUBJECT,
  ApplyRequestSchema,
  ApplyResponseSchema,
  BIND_ENDPOINT,
  BIND_SUBJECT,
  BindRequestSchema,
  bindSubject,
  COMPOSE_ENDPOINT,
  COMPOSE_SUBJECT,
  CollectRecordSchema,
  ComposeRequestSchema,
  ComposeResponseSchema,
  CONTENT_TYPE_PROTOBUF,
  DECLARE_ENDPOINT,
  DECLARE_SUBJECT,
  DeclareRequestSchema,
  declareSubject,
  DELETE_ENDPOINT,
  DELETE_SUBJECT,
  DeleteRequestSchema,
  encodeDeterministic,
  errorOf,
  escapeName,
  isBound,
  ManifestSchema,
  needKey,
  appliedKey,
  collectKey,
  manifestKey,
  PUT_ENDPOINT,
  PUT_SUBJECT,
  PutRequestSchema,
  WriteResponseSchema,
  MalformedKeySchema,
  ModulePlanSchema,
  NeedRecordSchema,
  NeedSchema,
  PlanDigestSchema,
  PlanItemSchema,
  PLANS_BUCKET,
  PROVISIONING_ENDPOINT,
  PROVISIONING_NODE_ENDPOINT,
  PROVISIONING_SUBJECT,
  PROVISIONS_ENDPOINT,
  PROVISIONS_SUBJECT,
  COMPOSE_NODE_ENDPOINT,
  inboxPrefix,
  joinProvisionsPages,
  nodeSubject,
  providerSubject,
  ProvisionsRequestSchema,
  ProvisionsResponseSchema,
  ProvisionerClient,
  ProvisionerError,
  ProvisioningRequestSchema,
  ProvisioningResponseSchema,
  ProvisionSchema,
  RefusalReason,
  RefusalSchema,
  RegistryRecordSchema,
  RevisionsSchema,
  SERVICE_NAME,
  WatchStoppedError,
  What,
  type ComposeResponse,
  type EndpointStats,
  type MalformedKey,
  type ProvisioningResponse,
  type RegistryEntry,
} from "../src/index.js";

const NEEDS = "mesh-provisioner_needs";
const APPLIED = "mesh-provisioner_applied";
const COLLECT = "mesh-provisioner_collect";

// The seed tool's records, by key as stored, in key order.
const need = {
  // No registry entry answers kind gpu: compose refuses it.
  "ace.ml.gpu.cuda": { node: "ace", module: "ml", kind: "gpu", name: "cuda", need: { placeholder: "${gpu:cuda}" } },
  "ace.web.bound.db": { node: "ace", module: "web", kind: "bound", name: "db", need: { placeholder: "${bound:db}", provider: "postgres", provision: "database", local: "web", required: true } },
  "ace.web.config.db_url": { node: "ace", module: "web", kind: "config", name: "db_url", need: { placeholder: "${config:db_url}", required: true } },
  "ace.web.port.http": { node: "ace", module: "web", kind: "port", name: "http", need: { placeholder: "${port:http}", required: true } },
  "ace.web.secret.api_token": { node: "ace", module: "web", kind: "secret", name: "api_token", need: { placeholder: "${secret:api_token}" } },
  // The key holds the name escaped, as it holds a collection's name.
  "ace.web.shell.zsh=3Anormal": { node: "ace", module: "web", kind: "shell", name: "zsh:normal", need: { placeholder: "${shell:zsh:normal}" } },
  // No provider: compose refuses it.
  "ace.worker.bound.cache": { node: "ace", module: "worker", kind: "bound", name: "cache", need: { placeholder: "${bound:cache}", required: true } },
  "ace.worker.dir.state": { node: "ace", module: "worker", kind: "dir", name: "state", need: { placeholder: "${dir:state}" } },
  "novox.api.collected.plugins": { node: "novox", module: "api", kind: "collected", name: "plugins", need: { placeholder: "${collected:plugins}" } },
  "novox.api.port.grpc": { node: "novox", module: "api", kind: "port", name: "grpc", need: { placeholder: "${port:grpc}", required: true } },
} satisfies Record<string, MessageInitShape<typeof NeedRecordSchema>>;

const applied = {
  "ace.web": {
    node: "ace", module: "web",
    applied: { planDigest: "sha256:0a1b", appliedAt: timestampFromDate(new Date("2026-01-02T03:04:05Z")), placeholders: ["${port:http}", "${config:db_url}", "${secret:api_token}", "${bound:db}"] },
  },
  "ace.worker": {
    node: "ace", module: "worker",
    // 2026-01-02T03:04:05.5Z
    applied: { planDigest: "sha256:2c3d", appliedAt: { seconds: 1767323045n, nanos: 500_000_000 }, placeholders: ["${dir:state}"] },
  },
  "novox.api": {
    node: "novox", module: "api",
    applied: { planDigest: "sha256:4e5f", appliedAt: timestampFromDate(new Date("2026-01-03T00:00:00Z")) },
  },
} satisfies Record<string, MessageInitShape<typeof AppliedRecordSchema>>;

const item = {
  "ace.environment.web": { node: "ace", collection: "environment", contributor: "web", item: { value: "WEB_ENV=production", attributes: { scope: "process", visibility: "public" } } },
  "ace.shell=3Azsh=3Anormal.web": { node: "ace", collection: "shell:zsh:normal", contributor: "web", item: { value: "export WEB_PORT=8080", order: 10, attributes: { source: "web" } } },
  "ace.shell=3Azsh=3Anormal.worker": { node: "ace", collection: "shell:zsh:normal", contributor: "worker", item: { value: "alias w=worker", order: 20 } },
  "novox.environment.api": { node: "novox", collection: "environment", contributor: "api", item: { value: "API_ENV=staging", order: -1 } },
  "novox.plugins.api": { node: "novox", collection: "plugins", contributor: "api", item: { value: "grpc-health", order: 1, attributes: { port: "grpc" } } },
  "novox.plugins.auth": { node: "novox", collection: "plugins", contributor: "auth", item: { value: "jwt", order: 2 } },
  "novox.shell=3Azsh=3Anormal.api": { node: "novox", collection: "shell:zsh:normal", contributor: "api", item: { value: "export API=1", order: 5 } },
} satisfies Record<string, MessageInitShape<typeof CollectRecordSchema>>;

type NeedKey = keyof typeof need;
type ItemKey = keyof typeof item;

/** A malformed key as the seed wrote it, and the reason the service gives. */
interface Malformed {
  bucket: string;
  key: string;
  reason: string | RegExp;
}

const malformed = {
  "ace.web.port": { bucket: NEEDS, key: "ace.web.port", reason: 'malformed key: "ace.web.port" has 3 tokens, want 4 (<node>.<module>.<kind>.<name>)' },
  "ace.worker.port.metrics": { bucket: NEEDS, key: "ace.worker.port.metrics", reason: "value of 3 bytes does not decode as mesh.provisioner.v1.Need" },
  novox: { bucket: NEEDS, key: "novox", reason: 'malformed key: "novox" has 1 tokens, want 4 (<node>.<module>.<kind>.<name>)' },
  "novox.api.v2": { bucket: APPLIED, key: "novox.api.v2", reason: 'malformed key: "novox.api.v2" has 3 tokens, want 2 (<node>.<module>)' },
  "ace.shell=3a.web": {
    bucket: COLLECT, key: "ace.shell=3a.web",
    reason: 'malformed key: "ace.shell=3a.web": token 2 (<collection>) has a bad escape "=3a" at byte 5; an escape is = and two upper-case hex digits',
  },
} satisfies Record<string, Malformed>;

// The registry of registry/registry.go, in key order: the owner of every kind,
// and where its values are (a bucket source's bucket, key shape and collection
// template, or a verb source's seat and subject).
const collectionOf = (template: string) => ({ bucket: COLLECT, keyShape: "<node>.<collection>.<contributor>", collection: template });
const placement = { bucket: "mesh-controller_assignments", keyShape: "<node>.<module>", collection: "" };
const registry = {
  access: { owner: "mesh-controller", where: placement },
  bound: { owner: "<provider>", where: { bucket: "<provider>_bound", keyShape: "<node>.<module>.<provision>[.<local>]", collection: "" } },
  collected: { owner: "mesh-provisioner", where: collectionOf("<name>") },
  config: { owner: "mesh-config", where: { bucket: "mesh-config_values", keyShape: "<node>.<module>.<name>", collection: "" } },
  consumers: { owner: "mesh-vault", where: { seat: "mesh-vault", subject: "mesh-vault.consumers" } },
  contribution: { owner: "mesh-provisioner", where: collectionOf("<kind>:<name>") },
  dir: { owner: "mesh-controller", where: placement },
  environment: { owner: "mesh-provisioner", where: collectionOf("<kind>:<name>") },
  machine: { owner: "mesh-controller", where: placement },
  port: { owner: "mesh-controller", where: placement },
  seat: { owner: "mesh-controller", where: placement },
  secret: { owner: "mesh-vault", where: { seat: "mesh-vault", subject: "mesh-vault.secret" } },
  shell: { owner: "mesh-provisioner", where: collectionOf("<kind>:<name>") },
};

/** Where a registry entry's values are: the fields of its source. */
function whereOf({ source }: RegistryEntry): Record<string, string> {
  switch (source.case) {
    case "bucket":
      return { bucket: source.value.bucket, keyShape: source.value.keyShape, collection: source.value.collection };
    case "verb":
      return { seat: source.value.seat, subject: source.value.subject };
    default:
      return {};
  }
}

let server: ChildProcess | undefined;
const serverLog: string[] = [];
let stateDir: string | undefined;
let nc: NatsConnection | undefined;
let client: ProvisionerClient;
/** The embedded NATS server's URL, for connections of a mesh identity's own. */
let natsUrl: string;
/** The last revision the seed tool wrote to each bucket. */
let seeded: Record<string, bigint>;

/** Returns an environment variable that `make test` sets, or throws saying so. */
function fromMake(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run this test with \`make test\`, which builds the mesh-provisioner and seed binaries and sets MESH_PROVISIONER_BIN and MESH_PROVISIONER_SEED_BIN`);
  }
  return value;
}
/**
 * Starts the server on an embedded NATS on a free port, and resolves to its
 * URL once the server logs that it is serving. stderr is read until the
 * server exits, so that it never blocks on a full pipe.
 */
function serve(bin: string, dir: string): Promise<string> {
  const child = spawn(bin, ["--listen", "127.0.0.1:0", "--log-format", "json", "--state-dir", dir], { stdio: ["ignore", "ignore", "pipe"] });
  server = child;
  // Should this process end before after() runs, the server ends with it.
  process.once("exit", () => child.kill("SIGKILL"));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server did not log "serving" within 20s:\n${serverLog.join("\n")}`)), 20_000);
    const fail = (err: Error) => {
      clearTimeout(timer);
      reject(err);
    };
    child.once("error", fail);
    child.once("exit", (code, signal) => fail(new Error(`the server exited (${code ?? signal}) before serving:\n${serverLog.join("\n")}`)));
    createInterface({ input: child.stderr! }).on("line", (line) => {
      serverLog.push(line);
      let entry: { msg?: unknown; nats_url?: unknown };
      try {
        entry = JSON.parse(line);
      } catch {
        return; // not a log record: shown if the server fails
      }
      if (entry.msg === "serving" && typeof entry.nats_url === "string") {
        clearTimeout(timer);
        resolve(entry.nats_url);
      }
    });
  });
}

/**
 * Stops the server with SIGTERM (SIGKILL if it is still running 10s later)
 * and resolves to its exit code, or the signal that ended it.
 */
async function stop(child: ChildProcess): Promise<number | NodeJS.Signals | null> {
  if (child.exitCode === null && child.signalCode === null) {
    const exited = once(child, "exit", { signal: AbortSignal.timeout(10_000) });
    child.kill("SIGTERM");
    await exited.catch(async () => {
      child.kill("SIGKILL");
      await once(child, "exit");
    });
  }
  return child.exitCode ?? child.signalCode;
}

before(async () => {
  const bin = fromMake("MESH_PROVISIONER_BIN");
  const seedBin = fromMake("MESH_PROVISIONER_SEED_BIN");
  stateDir = await mkdtemp(join(tmpdir(), "mesh-provisioner-e2e-"));
  const url = await serve(bin, stateDir);
  natsUrl = url;
  const { stdout } = await promisify(execFile)(seedBin, ["--nats-url", url], { timeout: 30_000 });
  seeded = Object.fromEntries(Object.entries(JSON.parse(stdout) as Record<string, number>).map(([bucket, rev]) => [bucket, BigInt(rev)]));
  nc = await connect({ servers: url, name: "mesh-provisioner e2e" });
  client = new ProvisionerClient(nc);
});

after(async () => {
  await nc?.close();
  // A server that never started (spawn failed) has no pid: before() said why.
  const exit = server?.pid === undefined ? undefined : await stop(server);
  if (stateDir) {
    await rm(stateDir, { recursive: true, force: true });
  }
  if (exit !== undefined) {
    assert.equal(exit, 0, `the server did not exit with 0 on SIGTERM:\n${serverLog.slice(-20).join("\n")}`);
  }
});

/**
 * Asserts that records hold exactly the expected ones, in order, field by
 * field, and that each carries a revision: non-zero and at most the answer's.
 */
function assertRecords<Desc extends DescMessage>(
  schema: Desc,
  answer: ProvisioningResponse,
  records: (MessageShape<Desc> & { revision: bigint })[],
  expected: MessageInitShape<Desc>[],
): void {
  for (const record of records) {
    assert.ok(record.revision > 0n && record.revision <= answer.revision, `revision ${record.revision} of a record, answer at ${answer.revision}`);
  }
  assert.deepStrictEqual(records.map((r) => ({ ...r, revision: 0n })), expected.map((e) => create(schema, e)));
}

/** Asserts that the answer lists exactly the expected malformed keys, in key order. */
function assertMalformed(answer: ProvisioningResponse, expected: Malformed[]): void {
  assert.deepStrictEqual(answer.malformed.map((m) => m.key), expected.map((m) => m.key));
  answer.malformed.forEach((got: MalformedKey, i) => {
    const want = expected[i]!;
    assert.equal(got.$typeName, MalformedKeySchema.typeName);
    assert.equal(got.bucket, want.bucket);
    if (typeof want.reason === "string") {
      assert.equal(got.reason, want.reason);
    } else {
      assert.match(got.reason, want.reason);
    }
    assert.ok(got.revision > 0n && got.revision <= answer.revision, `revision ${got.revision} of ${got.key}, answer at ${answer.revision}`);
  });
}

/** Asserts that a call is refused with a ProvisionerError of this code and sentence. */
async function assertRefused(call: Promise<unknown>, code: number, description: string): Promise<void> {
  await assert.rejects(call, (err) => {
    assert.ok(err instanceof ProvisionerError, `want a ProvisionerError, got ${String(err)}`);
    assert.equal(err.code, code);
    assert.equal(err.description, description);
    return true;
  });
}


/** A refusal the compose verb should give, its detail exact or a pattern. */
interface ExpectedRefusal {
  key: string;
  module: string;
  kind: string;
  name: string;
  reason: RefusalReason;
  detail: string | RegExp;
}

/** What a composition should hold, but for its phases and revisions. */
interface Composition {
  node: string;
  module?: string;
  plans: MessageInitShape<typeof ModulePlanSchema>[];
  provisions: MessageInitShape<typeof ProvisionSchema>[];
  refusals: ExpectedRefusal[];
}

/** The revision at which each seeded need and item was written, as the provisioning verb reports it. */
const needRevision = {} as Record<NeedKey, bigint>;
const itemRevision = {} as Record<ItemKey, bigint>;
/** The revision of the registry's copy, as the provisioning verb reports it. */
let registryRevision = 0n;

/**
 * The plan item of a seeded need: its kind, name, placeholder and revision,
 * with who answers it and where; for a collection kind, the collection and
 * the seeded items it holds, in contributor order.
 */
function planItem(
  key: NeedKey,
  owner: string,
  location: MessageInitShape<typeof PlanItemSchema>["location"],
  collection?: { name: string; items: ItemKey[] },
): MessageInitShape<typeof PlanItemSchema> {
  const { kind, name, need: { placeholder } } = need[key];
  return {
    kind, name, placeholder, owner, location, revision: needRevision[key],
    ...(collection && {
      collection: collection.name,
      items: collection.items.map((k) => ({ contributor: item[k].contributor, item: item[k].item, revision: itemRevision[k] })),
    }),
  };
}

const inBucket = (bucket: string, key: string) => ({ case: "bucket" as const, value: { bucket, key } });
const byVerb = (seat: string, subject: string) => ({ case: "verb" as const, value: { seat, subject } });

// The plans of node ace's modules, and its refusals, by module. A function:
// the revisions are known once the compose tests have asked for them.
const acePlans = () => ({
  web: {
    module: "web",
    items: [
      // The bound need's owner is its provider, its bucket the provider's.
      planItem("ace.web.bound.db", "postgres", inBucket("postgres_bound", "ace.web.database.web")),
      planItem("ace.web.config.db_url", "mesh-config", inBucket("mesh-config_values", "ace.web.db_url")),
      planItem("ace.web.port.http", "mesh-controller", inBucket("mesh-controller_assignments", "ace.web")),
      planItem("ace.web.secret.api_token", "mesh-vault", byVerb("mesh-vault", "mesh-vault.secret")),
      // A collection's key is a filter of its items: every contributor.
      planItem("ace.web.shell.zsh=3Anormal", "mesh-provisioner", inBucket(COLLECT, "ace.shell=3Azsh=3Anormal.*"),
        { name: "shell:zsh:normal", items: ["ace.shell=3Azsh=3Anormal.web", "ace.shell=3Azsh=3Anormal.worker"] }),
    ],
  },
  worker: {
    module: "worker",
    items: [planItem("ace.worker.dir.state", "mesh-controller", inBucket("mesh-controller_assignments", "ace.worker"))],
  },
});
const postgresProvision = {
  provider: "postgres", bucket: "postgres_bound", key: "ace.web.database.web", module: "web", provision: "database", local: "web", name: "db",
};
const aceRefusals = {
  ml: [
    { key: "ace.ml.gpu.cuda", module: "ml", kind: "gpu", name: "cuda", reason: RefusalReason.NO_DOMAIN, detail: `no registry entry answers kind "gpu"` },
  ],
  web: [
    { key: "ace.web.port", module: "web", kind: "port", name: "", reason: RefusalReason.MALFORMED_NEED, detail: malformed["ace.web.port"].reason },
  ],
  worker: [
    {
      key: "ace.worker.bound.cache", module: "worker", kind: "bound", name: "cache", reason: RefusalReason.UNFILLABLE_KEY_SHAPE,
      detail: `kind "bound" is answered by each provider in bucket <provider>_bound, and the need's provider "" is empty`,
    },
    {
      key: "ace.worker.port.metrics", module: "worker", kind: "port", name: "metrics", reason: RefusalReason.MALFORMED_NEED,
      detail: malformed["ace.worker.port.metrics"].reason,
    },
  ],
} satisfies Record<string, ExpectedRefusal[]>;

/**
 * Asserts a composition field by field: node, module, plans, provisions and
 * refusals in order; the phases wait, read, resolve and items; and the
 * revisions of the seeded copy.
 */
function assertComposition(answer: ComposeResponse, want: Composition): void {
  assert.equal(answer.$typeName, ComposeResponseSchema.typeName);
  assert.equal(answer.node, want.node);
  assert.equal(answer.module, want.module ?? "");
  assert.deepStrictEqual(answer.plans, want.plans.map((p) => create(ModulePlanSchema, p)));
  assert.deepStrictEqual(answer.provisions, want.provisions.map((p) => create(ProvisionSchema, p)));
  assert.deepStrictEqual(answer.refusals.map((r) => r.key), want.refusals.map((r) => r.key));
  answer.refusals.forEach((got, i) => {
    const { detail, ...fields } = want.refusals[i]!;
    assert.deepStrictEqual({ ...got, detail: "" }, create(RefusalSchema, fields));
    if (typeof detail === "string") {
      assert.equal(got.detail, detail);
    } else {
      assert.match(got.detail, detail);
    }
  });
  assertPhases(answer);
  assert.deepStrictEqual(answer.revisions, create(RevisionsSchema, {
    registry: registryRevision, needs: seeded[NEEDS]!, applied: seeded[APPLIED]!, collect: seeded[COLLECT]!,
  }));
}

/** Asserts that a composition timed the phases wait, read, resolve and items, in order. */
function assertPhases(answer: ComposeResponse): void {
  assert.deepStrictEqual(answer.phases.map((p) => p.name), ["wait", "read", "resolve", "items"]);
  for (const { name, duration } of answer.phases) {
    assert.ok(duration && duration.seconds >= 0n && duration.nanos >= 0, `duration of phase ${name}`);
  }
}

/** Milliseconds a phase took. */
function phaseMillis(answer: ComposeResponse, name: string): number {
  const d = answer.phases.find((p) => p.name === name)?.duration;
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : Number.NaN;
}

/** The service's endpoints, in the order discovery lists them: name and subject. */
const endpoints = [
  [PROVISIONING_ENDPOINT, PROVISIONING_SUBJECT],
  [COMPOSE_ENDPOINT, COMPOSE_SUBJECT],
  [PROVISIONING_NODE_ENDPOINT, `${PROVISIONING_SUBJECT}.*`],
  [COMPOSE_NODE_ENDPOINT, `${COMPOSE_SUBJECT}.*`],
  [PROVISIONS_ENDPOINT, `${PROVISIONS_SUBJECT}.*`],
  [PUT_ENDPOINT, `${PUT_SUBJECT}.*`],
  [DELETE_ENDPOINT, `${DELETE_SUBJECT}.*`],
  [APPLY_ENDPOINT, `${APPLY_SUBJECT}.*`],
  [DECLARE_ENDPOINT, `${DECLARE_SUBJECT}.*.*`],
  [BIND_ENDPOINT, `${BIND_SUBJECT}.*`],
] as const;

/** Returns the $SRV.STATS of the one instance's endpoints, by name, checking their names and subjects. */
async function endpointStats(): Promise<Record<(typeof endpoints)[number][0], EndpointStats>> {
  const [stats, ...others] = await client.stats();
  assert.ok(stats && others.length === 0, "want the stats of one instance");
  assert.deepStrictEqual(stats.endpoints.map((e) => [e.name, e.subject, e.queue_group]), endpoints.map(([name, subject]) => [name, subject, "q"]));
  return Object.fromEntries(stats.endpoints.map((e) => [e.name, e])) as Record<(typeof endpoints)[number][0], EndpointStats>;
}

describe("registry", () => {
  it("an empty request answers the 13 kinds with their owners and sources", async () => {
    const answer = await client.provisioning();
    assert.equal(answer.what, What.REGISTRY);
    assert.deepStrictEqual(answer.registry.map((r) => r.kind), Object.keys(registry));
    assert.deepStrictEqual(
      answer.registry.map(({ kind, entry }) => ({ kind, entryKind: entry?.kind, owner: entry?.owner, where: entry && whereOf(entry) })),
      Object.entries(registry).map(([kind, { owner, where }]) => ({ kind, entryKind: kind, owner, where })),
    );
    for (const record of answer.registry) {
      assert.ok(record.revision > 0n, `revision of ${record.kind}`);
      assert.notEqual(record.entry?.description ?? "", "", `description of ${record.kind}`);
    }
    assert.equal(answer.revision, answer.registry.reduce((max, r) => (r.revision > max ? r.revision : max), 0n));
    assertMalformed(answer, []);
  });

  it("a bucket source, a collection's and a verb source, field by field", async () => {
    const answer = await client.provisioning({ what: What.REGISTRY });
    const byKind = (kind: string) => answer.registry.filter((r) => r.kind === kind);
    assertRecords(RegistryRecordSchema, answer, byKind("bound"), [{
      kind: "bound",
      entry: {
        kind: "bound",
        owner: "<provider>",
        source: { case: "bucket", value: { bucket: "<provider>_bound", keyShape: "<node>.<module>.<provision>[.<local>]" } },
        description: "What a provider module bound for a consumer module, in the provider's own bucket.",
      },
    }]);
    assertRecords(RegistryRecordSchema, answer, byKind("shell"), [{
      kind: "shell",
      entry: {
        kind: "shell",
        owner: "mesh-provisioner",
        source: { case: "bucket", value: { bucket: COLLECT, keyShape: "<node>.<collection>.<contributor>", collection: "<kind>:<name>" } },
        description: "Shell snippets, read as the collection of the same name (${shell:zsh:normal} reads shell:zsh:normal).",
      },
    }]);
    assertRecords(RegistryRecordSchema, answer, byKind("secret"), [{
      kind: "secret",
      entry: {
        kind: "secret",
        owner: "mesh-vault",
        source: { case: "verb", value: { seat: "mesh-vault", subject: "mesh-vault.secret" } },
        description: "A secret, asked of the vault on request; a secret is never in a bucket.",
      },
    }]);
  });
});

describe("needs", () => {
  it("every need of every node, names unescaped, and every malformed key", async () => {
    const answer = await client.provisioning({ what: What.NEEDS });
    assert.equal(answer.what, What.NEEDS);
    assert.equal(answer.revision, seeded[NEEDS]);
    assertRecords(NeedRecordSchema, answer, answer.needs, Object.values(need));
    assertMalformed(answer, [malformed["ace.web.port"], malformed["ace.worker.port.metrics"], malformed.novox]);
    assert.deepStrictEqual([answer.registry, answer.applied, answer.collect], [[], [], []]);
  });

  it("of a node", async () => {
    const answer = await client.provisioning({ what: What.NEEDS, node: "ace" });
    assertRecords(NeedRecordSchema, answer, answer.needs, Object.entries(need).filter(([k]) => k.startsWith("ace.")).map(([, n]) => n));
    assertMalformed(answer, [malformed["ace.web.port"], malformed["ace.worker.port.metrics"]]);
  });

  it("of a node's module, with the bound need's provider, provision and local", async () => {
    const answer = await client.provisioning({ what: What.NEEDS, node: "ace", module: "web" });
    assertRecords(NeedRecordSchema, answer, answer.needs, [
      need["ace.web.bound.db"], need["ace.web.config.db_url"], need["ace.web.port.http"], need["ace.web.secret.api_token"], need["ace.web.shell.zsh=3Anormal"],
    ]);
    assertMalformed(answer, [malformed["ace.web.port"]]);
  });

  it("of a module on any node keeps a malformed key too short to name a module", async () => {
    const answer = await client.provisioning({ what: What.NEEDS, module: "api" });
    assertRecords(NeedRecordSchema, answer, answer.needs, [need["novox.api.collected.plugins"], need["novox.api.port.grpc"]]);
    assertMalformed(answer, [malformed.novox]);
  });

  it("of a node that wrote nothing: no records, the bucket's revision", async () => {
    const answer = await client.provisioning({ what: What.NEEDS, node: "nobody" });
    assert.deepStrictEqual([answer.needs, answer.malformed], [[], []]);
    assert.equal(answer.revision, seeded[NEEDS]);
  });
});

describe("applied", () => {
  it("everything applied, with timestamps and placeholders", async () => {
    const answer = await client.provisioning({ what: What.APPLIED });
    assert.equal(answer.what, What.APPLIED);
    assert.equal(answer.revision, seeded[APPLIED]);
    assertRecords(AppliedRecordSchema, answer, answer.applied, Object.values(applied));
    assertMalformed(answer, [malformed["novox.api.v2"]]);
  });

  it("of a node's module keeps a malformed key whose module token matches", async () => {
    const answer = await client.provisioning({ what: What.APPLIED, node: "novox", module: "api" });
    assertRecords(AppliedRecordSchema, answer, answer.applied, [applied["novox.api"]]);
    assertMalformed(answer, [malformed["novox.api.v2"]]);
  });

  it("of a module", async () => {
    const answer = await client.provisioning({ what: What.APPLIED, module: "web" });
    assertRecords(AppliedRecordSchema, answer, answer.applied, [applied["ace.web"]]);
    assertMalformed(answer, []);
  });
});

describe("collect", () => {
  it("every item, collections by their readable names", async () => {
    const answer = await client.provisioning({ what: What.COLLECT });
    assert.equal(answer.what, What.COLLECT);
    assert.equal(answer.revision, seeded[COLLECT]);
    assertRecords(CollectRecordSchema, answer, answer.collect, Object.values(item));
    assertMalformed(answer, [malformed["ace.shell=3a.web"]]);
  });

  it("of a collection by its readable name, which the key holds escaped", async () => {
    const answer = await client.provisioning({ what: What.COLLECT, collection: "shell:zsh:normal" });
    assertRecords(CollectRecordSchema, answer, answer.collect, [
      item["ace.shell=3Azsh=3Anormal.web"], item["ace.shell=3Azsh=3Anormal.worker"], item["novox.shell=3Azsh=3Anormal.api"],
    ]);
    assertMalformed(answer, []);
  });

  it("of a node's contributor keeps a malformed key that matches", async () => {
    const answer = await client.provisioning({ what: What.COLLECT, node: "ace", contributor: "web" });
    assertRecords(CollectRecordSchema, answer, answer.collect, [item["ace.environment.web"], item["ace.shell=3Azsh=3Anormal.web"]]);
    assertMalformed(answer, [malformed["ace.shell=3a.web"]]);
  });

  it("with every filter", async () => {
    const answer = await client.provisioning({ what: What.COLLECT, node: "novox", collection: "environment", contributor: "api" });
    assertRecords(CollectRecordSchema, answer, answer.collect, [item["novox.environment.api"]]);
    assertMalformed(answer, []);
  });
});

describe("compose", () => {
  before(async () => {
    const [registryAnswer, needs, items] = await Promise.all([
      client.provisioning({ what: What.REGISTRY }),
      client.provisioning({ what: What.NEEDS }),
      client.provisioning({ what: What.COLLECT }),
    ]);
    registryRevision = registryAnswer.revision;
    assert.ok(registryRevision > 0n);
    // The needs and items tests check that these are the seeded records, in this order.
    assert.equal(needs.needs.length, Object.keys(need).length);
    Object.keys(need).forEach((key, i) => { needRevision[key as NeedKey] = needs.needs[i]!.revision; });
    assert.equal(items.collect.length, Object.keys(item).length);
    Object.keys(item).forEach((key, i) => { itemRevision[key as ItemKey] = items.collect[i]!.revision; });
    // The server follows a provider's bucket from the first request that
    // names it, and that request waits for its first read (docs/protocol.md,
    // "Providers' entries and manifests"): ask postgres's provisions first,
    // so that the compositions below wait for nothing.
    await client.provisions({ provider: "postgres" });
  });

  it("a node: a plan per module in module order, the bound need's provision, and every refusal in key order", async () => {
    const answer = await client.compose({ node: "ace" });
    const plans = acePlans();
    assertComposition(answer, {
      node: "ace",
      // Module ml has no plan: its one need is refused.
      plans: [plans.web, plans.worker],
      provisions: [postgresProvision],
      refusals: [...aceRefusals.ml, ...aceRefusals.web, ...aceRefusals.worker],
    });
    // Waiting for nothing (postgres_bound is followed already) takes no time.
    assert.equal(phaseMillis(answer, "wait"), 0);
  });

  it("a collected need reads the collection its name names, with the node's items in contributor order", async () => {
    const answer = await client.compose({ node: "novox" });
    assertComposition(answer, {
      node: "novox",
      plans: [{
        module: "api",
        items: [
          planItem("novox.api.collected.plugins", "mesh-provisioner", inBucket(COLLECT, "novox.plugins.*"),
            { name: "plugins", items: ["novox.plugins.api", "novox.plugins.auth"] }),
          planItem("novox.api.port.grpc", "mesh-controller", inBucket("mesh-controller_assignments", "novox.api")),
        ],
      }],
      provisions: [],
      // A key too short to name a module, kind or name leaves them empty.
      refusals: [{ key: "novox", module: "", kind: "", name: "", reason: RefusalReason.MALFORMED_NEED, detail: malformed.novox.reason }],
    });
  });

  it("a module narrows the plans, provisions and refusals; a malformed key whose module token differs is left out", async () => {
    const plans = acePlans();
    assertComposition(await client.compose({ node: "ace", module: "web" }), {
      node: "ace", module: "web", plans: [plans.web], provisions: [postgresProvision], refusals: aceRefusals.web,
    });
    assertComposition(await client.compose({ node: "ace", module: "worker" }), {
      node: "ace", module: "worker", plans: [plans.worker], provisions: [], refusals: aceRefusals.worker,
    });
  });

  it("a module or a node with no needs composes to nothing, at the copy's revisions", async () => {
    assertComposition(await client.compose({ node: "ace", module: "api" }), { node: "ace", module: "api", plans: [], provisions: [], refusals: [] });
    assertComposition(await client.compose({ node: "nobody" }), { node: "nobody", plans: [], provisions: [], refusals: [] });
  });

  it("a module whose every need is refused has no plan, only its refusals", async () => {
    assertComposition(await client.compose({ node: "ace", module: "ml" }), {
      node: "ace", module: "ml", plans: [], provisions: [], refusals: aceRefusals.ml,
    });
  });
});

describe("refusals", () => {
  it("a filter that does not apply to the registry is a 400", () =>
    assertRefused(client.provisioning({ node: "ace" }), 400, "filter node does not apply to WHAT_REGISTRY, which is narrowed by nothing; leave node out"));

  it("a contributor filter on needs is a 400", () =>
    assertRefused(client.provisioning({ what: What.NEEDS, contributor: "x" }), 400,
      "filter contributor does not apply to WHAT_NEEDS, which is narrowed by node, module; leave contributor out"));

  it("a node no key can hold is a 400", () =>
    assertRefused(client.provisioning({ what: What.APPLIED, node: "a.b" }), 400,
      `filter node "a.b" can match no key: it holds '.' at byte 1; a token holds only A-Z a-z 0-9 - _ = /`));

  it("a what this contract does not define is a 400", () =>
    assertRefused(client.provisioning({ what: 9 as What }), 400, "what 9 is not one of WHAT_REGISTRY, WHAT_NEEDS, WHAT_APPLIED, WHAT_COLLECT, WHAT_MANIFESTS"));

  it("compose without a node is a 400", () =>
    assertRefused(client.compose({}), 400, "node is required: the node to compose"));

  it("compose of a node or a module no key can hold is a 400", async () => {
    await assertRefused(client.compose({ node: "a.b" }), 400,
      `node "a.b" can match no key: it holds '.' at byte 1; a token holds only A-Z a-z 0-9 - _ = /`);
    await assertRefused(client.compose({ node: "ace", module: "*" }), 400,
      `module "*" can match no key: it holds '*' at byte 0; a token holds only A-Z a-z 0-9 - _ = /`);
  });

  it("a binary compose request with a field the contract does not define is answered as without it", async () => {
    const h = headers();
    h.set("Content-Type", CONTENT_TYPE_PROTOBUF);
    // node "ace", then field 9 (varint 1), which ComposeRequest does not define:
    // a newer client's field, which an older instance ignores during a rollout.
    const body = new Uint8Array([...toBinary(ComposeRequestSchema, create(ComposeRequestSchema, { node: "ace" })), 0x48, 0x01]);
    const reply = await nc!.request(COMPOSE_SUBJECT, body, { timeout: 5000, headers: h });
    assert.equal(reply.headers?.get("Content-Type"), CONTENT_TYPE_PROTOBUF);
    assert.equal(errorOf(reply), undefined);
    const answer = fromBinary(ComposeResponseSchema, reply.data);
    const plain = await client.compose({ node: "ace" });
    answer.phases = [];
    plain.phases = [];
    assert.ok(equals(ComposeResponseSchema, answer, plain), "the answer differs from the one without the unknown field");
  });

  it("the service still answers after refusals", async () => {
    const answer = await client.provisioning({ what: What.NEEDS, node: "novox" });
    assert.equal(answer.needs.length, 2);
    assert.equal((await client.compose({ node: "novox" })).plans.length, 1);
  });
});

describe("encodings", () => {
  it("a JSON body is answered in protobuf JSON, uint64 revisions as strings", async () => {
    const request = { what: "WHAT_COLLECT", node: "ace", collection: "shell:zsh:normal" };
    const reply = await nc!.request(PROVISIONING_SUBJECT, JSON.stringify(request), { timeout: 5000 });
    assert.equal(errorOf(reply), undefined);
    assert.equal(reply.headers?.get("Content-Type"), "application/json");
    const json = reply.json<{ revision: JsonValue; collect: { collection: JsonValue; revision: JsonValue }[] }>();
    assert.equal(json.revision, String(seeded[COLLECT]));
    assert.deepStrictEqual(json.collect.map((r) => [r.collection, typeof r.revision]), [["shell:zsh:normal", "string"], ["shell:zsh:normal", "string"]]);

    const binary = await client.provisioning(fromJson(ProvisioningRequestSchema, request));
    assert.ok(equals(ProvisioningResponseSchema, fromJson(ProvisioningResponseSchema, json), binary), "the JSON answer differs from the binary one");
  });

  it("a JSON compose, after leading whitespace, is answered in protobuf JSON like the binary one", async () => {
    const request = { node: "ace", minRevisions: { needs: String(seeded[NEEDS]) } };
    const reply = await nc!.request(COMPOSE_SUBJECT, ` \n\t${JSON.stringify(request)}`, { timeout: 5000 });
    assert.equal(errorOf(reply), undefined);
    assert.equal(reply.headers?.get("Content-Type"), "application/json");
    type JsonItem = { kind: string; bucket?: { bucket: string; key: string }; verb?: { seat: string; subject: string }; revision: JsonValue };
    const json = reply.json<{
      plans: { module: string; items: JsonItem[] }[];
      refusals: { reason: JsonValue }[];
      phases: { name: string; duration: JsonValue }[];
      revisions: Record<string, JsonValue>;
    }>();
    // The location is "bucket" or "verb"; enums by name; uint64 and durations as strings.
    const web = json.plans[0]!.items;
    assert.deepStrictEqual(web.map((i) => [i.kind, i.bucket !== undefined, i.verb !== undefined, typeof i.revision]), [
      ["bound", true, false, "string"], ["config", true, false, "string"], ["port", true, false, "string"], ["secret", false, true, "string"], ["shell", true, false, "string"],
    ]);
    assert.deepStrictEqual(json.refusals.map((r) => r.reason), [
      "REFUSAL_REASON_NO_DOMAIN", "REFUSAL_REASON_MALFORMED_NEED", "REFUSAL_REASON_UNFILLABLE_KEY_SHAPE", "REFUSAL_REASON_MALFORMED_NEED",
    ]);
    assert.ok(json.phases.every((p) => typeof p.duration === "string" && /^\d+(\.\d+)?s$/u.test(p.duration)), JSON.stringify(json.phases));
    assert.equal(json.revisions["needs"], String(seeded[NEEDS]));

    const binary = await client.compose(fromJson(ComposeRequestSchema, request));
    const fromText = fromJson(ComposeResponseSchema, json);
    // Phases time each composition: compare the rest.
    fromText.phases = [];
    binary.phases = [];
    assert.ok(equals(ComposeResponseSchema, fromText, binary), "the JSON answer differs from the binary one");
  });

  it("Content-Type application/json with parameters and an empty body is the registry, in JSON", async () => {
    const h = headers();
    h.set("Content-Type", "application/json; charset=utf-8");
    const reply = await nc!.request(PROVISIONING_SUBJECT, Empty, { timeout: 5000, headers: h });
    assert.equal(reply.headers?.get("Content-Type"), "application/json");
    const answer = fromJson(ProvisioningResponseSchema, reply.json());
    assert.equal(answer.what, What.REGISTRY);
    assert.equal(answer.registry.length, Object.keys(registry).length);
  });

  it("the Content-Type header is found in any letter case", async () => {
    const h = headers();
    h.set("content-type", "Application/JSON");
    const reply = await nc!.request(COMPOSE_SUBJECT, '{"node":"novox"}', { timeout: 5000, headers: h });
    assert.equal(errorOf(reply), undefined);
    assert.equal(reply.headers?.get("Content-Type"), "application/json");
    assert.equal(fromJson(ComposeResponseSchema, reply.json()).plans[0]?.module, "api");
  });

  it("an empty or whitespace body without headers is the registry, in protobuf binary", async () => {
    for (const body of [Empty, " \r\n\t "]) {
      const reply = await nc!.request(PROVISIONING_SUBJECT, body, { timeout: 5000 });
      assert.equal(reply.headers?.get("Content-Type"), CONTENT_TYPE_PROTOBUF);
      assert.equal(fromBinary(ProvisioningResponseSchema, reply.data).registry.length, Object.keys(registry).length);
    }
  });

  it("any Content-Type but application/json means protobuf binary, whatever the body", async () => {
    for (const [subject, type, schema] of [
      [PROVISIONING_SUBJECT, CONTENT_TYPE_PROTOBUF, ProvisioningRequestSchema],
      [COMPOSE_SUBJECT, "text/plain", ComposeRequestSchema],
    ] as const) {
      const h = headers();
      h.set("Content-Type", type);
      const reply = await nc!.request(subject, '{"node":"ace"}', { timeout: 5000, headers: h });
      assert.equal(reply.headers?.get("Content-Type"), CONTENT_TYPE_PROTOBUF);
      const err = errorOf(reply);
      assert.ok(err instanceof ProvisionerError);
      assert.equal(err.code, 400);
      assert.match(err.description, new RegExp(`^the request does not decode as protobuf ${schema.typeName.replaceAll(".", "\\.")} \\(.*\\); send protobuf binary, or JSON with header Content-Type: application/json$`, "u"));
    }
  });

  it("a JSON request with a field the contract does not define is answered as without it, in JSON", async () => {
    // A newer client's field is ignored, as binary protobuf ignores an unknown field number.
    const needs = await nc!.request(PROVISIONING_SUBJECT, '{"what":"WHAT_NEEDS","node":"novox","since":"yesterday"}', { timeout: 5000 });
    assert.equal(needs.headers?.get("Content-Type"), "application/json");
    assert.equal(errorOf(needs), undefined);
    assert.deepStrictEqual(fromJson(ProvisioningResponseSchema, needs.json()).needs.map((r) => r.name), ["plugins", "grpc"]);
    const plan = await nc!.request(COMPOSE_SUBJECT, '{"node":"ace","modul":"web"}', { timeout: 5000 });
    assert.equal(errorOf(plan), undefined);
    // "modul" is not module: the whole node is composed.
    assert.deepStrictEqual(fromJson(ComposeResponseSchema, plan.json()).plans.map((p) => p.module), ["web", "worker"]);
  });
});

describe("discovery", () => {
  it("ping, info and stats name one instance of mesh-provisioner", async () => {
    const [pings, infos, stats] = await Promise.all([client.ping(), client.info(), client.stats()]);
    assert.equal(pings.length, 1);
    const { id, version } = pings[0]!;
    assert.equal(pings[0]!.name, SERVICE_NAME);
    assert.match(id, /^\w+$/u);
    assert.match(version, /^\d+\.\d+\.\d+/u);
    for (const answer of [...infos, ...stats]) {
      assert.deepStrictEqual([answer.name, answer.id, answer.version], [SERVICE_NAME, id, version]);
    }
    assert.deepStrictEqual((await client.ping({ id })).map((p) => p.id), [id]);
    assert.deepStrictEqual(await client.ping({ id: "no-such-instance", maxWait: 500 }), []);
  });

  it("stats read a newer instance's data, skipping the fields this client does not know", async () => {
    // An instance of a later version, with a statistic this version does
    // not define, asked by its id: the answer is its alone.
    const newer = nc!.subscribe("$SRV.STATS.mesh-provisioner.newer", {
      callback: (_err, msg) => void msg.respond(JSON.stringify({
        type: "io.nats.micro.v1.stats_response", name: SERVICE_NAME, id: "newer", version: "9.0.0", started: "2026-12-01T00:00:00Z",
        endpoints: [{ name: "compose", subject: COMPOSE_SUBJECT, queue_group: "q", num_requests: 3, num_errors: 0, last_error: "",
          processing_time: 0, average_processing_time: 0, data: { answered: 3, seat: "held", sections: { hits: 2 } } }],
      })),
    });
    try {
      await nc!.flush();
      const stats = await client.stats({ id: "newer" });
      assert.deepStrictEqual(stats.map((s) => s.id), ["newer"]);
      const data = stats[0]?.endpoints[0]?.data;
      assert.deepStrictEqual([data?.answered, data?.seat], [3n, "held"]);
    } finally {
      newer.unsubscribe();
    }
  });

  it("info describes every endpoint and the messages each takes and gives", async () => {
    const [info] = await client.info();
    assert.equal(info?.type, "io.nats.micro.v1.info_response");
    assert.notEqual(info?.description, "");
    const contentTypes = "application/protobuf, application/json";
    const messages = (request: DescMessage, response: DescMessage) => ({ request: request.typeName, response: response.typeName, content_types: contentTypes });
    const provisioning = messages(ProvisioningRequestSchema, ProvisioningResponseSchema);
    const compose = messages(ComposeRequestSchema, ComposeResponseSchema);
    const provisions = messages(ProvisionsRequestSchema, ProvisionsResponseSchema);
    const put = messages(PutRequestSchema, WriteResponseSchema);
    const del = messages(DeleteRequestSchema, WriteResponseSchema);
    const apply = messages(ApplyRequestSchema, ApplyResponseSchema);
    const declare = messages(DeclareRequestSchema, WriteResponseSchema);
    const bind = messages(BindRequestSchema, WriteResponseSchema);
    assert.deepStrictEqual(info?.endpoints, endpoints.map(([name, subject], i) => ({
      name, subject, queue_group: "q", metadata: [provisioning, compose, provisioning, compose, provisions, put, del, apply, declare, bind][i],
    })));
    assert.deepStrictEqual([PROVISIONING_SUBJECT, COMPOSE_SUBJECT, PROVISIONS_SUBJECT], ["mesh-provisioner.provisioning", "mesh-provisioner.compose", "mesh-provisioner.provisions"]);
    assert.deepStrictEqual([nodeSubject(COMPOSE_SUBJECT, "ace"), providerSubject("postgres")], ["mesh-provisioner.compose.ace", "mesh-provisioner.provisions.postgres"]);
    assert.deepStrictEqual([nodeSubject(PUT_SUBJECT, "ace"), declareSubject("ace", "pg"), bindSubject("pg")],
      ["mesh-provisioner.put.ace", "mesh-provisioner.declare.ace.pg", "mesh-provisioner.bind.pg"]);
    assert.deepStrictEqual([ComposeRequestSchema.typeName, ComposeResponseSchema.typeName], ["mesh.provisioner.v1.ComposeRequest", "mesh.provisioner.v1.ComposeResponse"]);
  });

  it("stats count each endpoint's requests, refusals and answers", async () => {
    const before = await endpointStats();
    for (const e of Object.values(before)) {
      assert.deepStrictEqual(e.data?.loading, [], `loading of ${e.name}`);
    }

    await client.provisioning({ what: What.APPLIED });
    await assert.rejects(client.provisioning({ what: What.APPLIED, collection: "environment" }), ProvisionerError);
    await client.compose({ node: "ace" });
    await client.compose({ node: "novox", module: "api" });
    await assert.rejects(client.compose({ module: "web" }), ProvisionerError);

    // The answers are counted just after they are sent: ask until they are.
    let now = await endpointStats();
    for (const deadline = Date.now() + 2000; Date.now() < deadline &&
      (now.provisioning.data!.answered < before.provisioning.data!.answered + 1n || now.compose.data!.answered < before.compose.data!.answered + 2n);) {
      now = await endpointStats();
    }
    // serve sends refusals on a connection of their own, so micro does not
    // see them: the refusals on arrival are num_errors plus data.refused.
    const refusals = (e: EndpointStats) => BigInt(e.num_errors) + e.data!.refused;
    const counts = (e: EndpointStats) => [e.num_requests, refusals(e), e.data?.answered, e.data?.answerErrors];
    const plus = (e: EndpointStats, requests: number, errors: bigint, answered: bigint) =>
      [e.num_requests + requests, refusals(e) + errors, e.data!.answered + answered, e.data!.answerErrors];
    assert.deepStrictEqual(counts(now.provisioning), plus(before.provisioning, 2, 1n, 1n));
    assert.deepStrictEqual(counts(now.compose), plus(before.compose, 3, 1n, 2n));
  });
});

describe("pages", () => {
  it("the pages of an answer, asked one by one or joined, make the whole answer", async () => {
    const whole = await client.provisioning({ what: What.NEEDS });
    const pages: ProvisioningResponse[] = [];
    for await (const page of client.provisioningPages({ what: What.NEEDS, pageSize: 3 })) {
      pages.push(page);
    }
    assert.ok(pages.slice(0, -1).every((p) => p.nextPageToken !== "") && pages.at(-1)!.nextPageToken === "");
    assert.equal(pages.reduce((n, p) => n + p.needs.length + p.malformed.length, 0), whole.needs.length + whole.malformed.length);
    assert.ok(equals(ProvisioningResponseSchema, await client.provisioningAll({ what: What.NEEDS, pageSize: 3 }), whole));

    const composed = await client.compose({ node: "ace" });
    const joined = await client.composeAll({ node: "ace", pageSize: 2 });
    composed.phases = [];
    joined.phases = [];
    assert.ok(equals(ComposeResponseSchema, joined, composed), "the joined pages differ from the whole composition");
  });
});

/**
 * Runs fn on a connection of its own with a mesh identity's inbox prefix,
 * as that identity's process connects, and closes it.
 */
async function asIdentity<T>(prefix: string, fn: (conn: NatsConnection) => Promise<T>): Promise<T> {
  const conn = await connect({ servers: natsUrl, name: `mesh-provisioner e2e ${prefix}`, inboxPrefix: prefix });
  try {
    return await fn(conn);
  } finally {
    await conn.close();
  }
}

describe("inbox prefixes", () => {
  it("a mesh identity's prefix is _INBOX_MESH.<role>.<name>", () => {
    assert.equal(inboxPrefix("node", "ace"), "_INBOX_MESH.node.ace");
    assert.equal(inboxPrefix("provider", "postgres"), "_INBOX_MESH.provider.postgres");
    assert.equal(inboxPrefix("operator", "alice"), "_INBOX_MESH.operator.alice");
  });

  it("a name that is not one subject token is refused", () => {
    for (const name of ["", "a.b", "*", ">", "a b"]) {
      assert.throws(() => inboxPrefix("node", name), TypeError, JSON.stringify(name));
      assert.throws(() => new ProvisionerClient(nc!, { node: name }), TypeError, JSON.stringify(name));
    }
  });

  it("nats.js asks with it: the request's reply subject is under the prefix", async () => {
    await asIdentity(inboxPrefix("node", "ace"), async (conn) => {
      // A subject of the test's own, which no instance answers.
      const seen = conn.subscribe("e2e.probe", { max: 1 });
      const replies = (async () => {
        for await (const m of seen) {
          return m.reply ?? "";
        }
        return "";
      })();
      await conn.flush();
      await conn.request("e2e.probe", Empty, { timeout: 200 }).catch(() => undefined);
      assert.match(await replies, /^_INBOX_MESH\.node\.ace\./u);
    });
  });
});

describe("as a node", () => {
  const ace = inboxPrefix("node", "ace");

  it("asks on the node's own subjects", () => {
    const asAce = new ProvisionerClient(nc!, { node: "ace" });
    assert.deepStrictEqual([asAce.node, asAce.subject, asAce.composeSubject], ["ace", "mesh-provisioner.provisioning.ace", "mesh-provisioner.compose.ace"]);
    assert.deepStrictEqual([client.node, client.subject, client.composeSubject], [undefined, PROVISIONING_SUBJECT, COMPOSE_SUBJECT]);
  });

  it("reads its own needs, applied records, collection items and plan, and the registry, as an operator reads them", () =>
    asIdentity(ace, async (conn) => {
      const asAce = new ProvisionerClient(conn, { node: "ace" });
      for (const request of [{}, { what: What.NEEDS, node: "ace" }, { what: What.APPLIED, node: "ace", module: "web" }, { what: What.COLLECT, node: "ace" }]) {
        assert.ok(equals(ProvisioningResponseSchema, await asAce.provisioning(request), await client.provisioning(request)), JSON.stringify(request));
      }
      const mine = await asAce.composeAll({ node: "ace", pageSize: 2 });
      const operators = await client.compose({ node: "ace" });
      mine.phases = [];
      operators.phases = [];
      assert.ok(equals(ComposeResponseSchema, mine, operators), "ace's own plan differs from the one an operator reads");
      const pages: ProvisioningResponse[] = [];
      for await (const page of asAce.provisioningPages({ what: What.NEEDS, node: "ace", pageSize: 2 })) {
        pages.push(page);
      }
      assert.ok(pages.length > 1);
      assert.ok(equals(ProvisioningResponseSchema, await asAce.provisioningAll({ what: What.NEEDS, node: "ace", pageSize: 2 }), await client.provisioning({ what: What.NEEDS, node: "ace" })));
    }));

  it("another node's records or plan, or every node's, is a ProvisionerError of code 403", () =>
    asIdentity(ace, async (conn) => {
      const asAce = new ProvisionerClient(conn, { node: "ace" });
      const theirs = (what: string) =>
        `${what} on mesh-provisioner.provisioning.ace: node "ace" reads its own records only, and the request names node "novox"; ask mesh-provisioner.provisioning.<node> as that node`;
      await assertRefused(asAce.provisioning({ what: What.NEEDS, node: "novox" }), 403, theirs("WHAT_NEEDS"));
      await assertRefused(asAce.provisioning({ what: What.APPLIED, node: "novox" }), 403, theirs("WHAT_APPLIED"));
      await assertRefused(asAce.provisioning({ what: What.COLLECT, node: "novox", collection: "environment" }), 403, theirs("WHAT_COLLECT"));
      await assertRefused(asAce.provisioning({ what: What.NEEDS }), 403,
        `WHAT_NEEDS on mesh-provisioner.provisioning.ace: a node reads its own records only: set node to "ace" (every node's records are for operators, on mesh-provisioner.provisioning)`);
      await assertRefused(asAce.compose({ node: "novox" }), 403,
        `compose on mesh-provisioner.compose.ace composes node "ace" only, and the request names node "novox"; ask mesh-provisioner.compose.<node> as that node`);
      // Page by page too: the first page is refused.
      await assert.rejects(asAce.composeAll({ node: "novox", pageSize: 1 }), (err) => err instanceof ProvisionerError && err.code === 403);
      await assert.rejects(async () => {
        for await (const _ of asAce.provisioningPages({ what: What.NEEDS, node: "novox" })) {
          assert.fail("a page of novox's needs");
        }
      }, (err) => err instanceof ProvisionerError && err.code === 403);
    }));

  /** A compose request on node's own subject, answered (or not) on the connection's own inbox. */
  const composeOn = (conn: NatsConnection, node: string) =>
    conn.request(nodeSubject(COMPOSE_SUBJECT, node), toBinary(ComposeRequestSchema, create(ComposeRequestSchema, { node })), { timeout: 500 });

  it("a request on ace's subject with another node's inbox gets no answer", () =>
    asIdentity(inboxPrefix("node", "bob"), async (conn) => {
      await assert.rejects(composeOn(conn, "ace"), (err) =>
        !(err instanceof ProvisionerError) && err instanceof Error && /timeout/iu.test(`${err.name} ${err.message}`));
    }));

  it("an operator asks the unscoped subjects with its own inbox, and gets no answer on a node's", () =>
    asIdentity(inboxPrefix("operator", "alice"), async (conn) => {
      const operator = new ProvisionerClient(conn);
      const needs = await operator.provisioning({ what: What.NEEDS });
      assert.deepStrictEqual(new Set(needs.needs.map((r) => r.node)), new Set(["ace", "novox"]));
      assert.equal((await operator.compose({ node: "novox" })).node, "novox");
      await assert.rejects(composeOn(conn, "novox"), (err) => !(err instanceof ProvisionerError));
    }));
});

// Last: the final test writes a need, which the tests above do not expect.
describe("read your writes", () => {
  it("compose and provisioning answer at once a revision the copy has reached", async () => {
    const minRevisions = { registry: registryRevision, needs: seeded[NEEDS]!, applied: seeded[APPLIED]!, collect: seeded[COLLECT]! };
    const composed = await client.compose({ node: "ace", minRevisions });
    assert.ok(composed.revisions!.needs >= seeded[NEEDS]!, `revisions.needs ${composed.revisions?.needs}, asked ${seeded[NEEDS]}`);
    assert.ok(composed.revisions!.collect >= seeded[COLLECT]!);
    assert.deepStrictEqual(composed.plans.map((p) => p.module), ["web", "worker"]);
    assert.deepStrictEqual(composed.refusals.map((r) => r.key), ["ace.ml.gpu.cuda", "ace.web.port", "ace.worker.bound.cache", "ace.worker.port.metrics"]);
    assert.equal(phaseMillis(composed, "wait"), 0);

    const needs = await client.provisioning({ what: What.NEEDS, node: "ace", minRevision: seeded[NEEDS]! });
    assert.ok(needs.revision >= seeded[NEEDS]!);
  });

  it("a revision the copy does not reach within 5s is a 503 naming the bucket, counted as an answer error", async () => {
    const before = await endpointStats();
    const started = Date.now();
    await Promise.all([
      assertRefused(client.provisioning({ what: What.APPLIED, minRevision: seeded[APPLIED]! + 100n }), 503,
        `the server's copy of ${APPLIED} is at revision ${seeded[APPLIED]}, behind the ${seeded[APPLIED]! + 100n} asked for, after waiting 5s; ask again shortly`),
      // Zero for a bucket is any revision: only collect is waited for.
      assertRefused(client.compose({ node: "ace", minRevisions: { collect: seeded[COLLECT]! + 100n } }), 503,
        `the server's copy of ${COLLECT} is at revision ${seeded[COLLECT]}, behind the ${seeded[COLLECT]! + 100n} asked for, after waiting 5s; ask again shortly`),
    ]);
    assert.ok(Date.now() - started >= 4900, `refused after ${Date.now() - started}ms, want the server's 5s wait`);

    // Sent off the micro callback: answer_errors counts them, num_errors does not.
    const now = await endpointStats();
    for (const name of ["provisioning", "compose"] as const) {
      assert.deepStrictEqual(
        [now[name].num_requests, now[name].num_errors, now[name].last_error, now[name].data?.answered, now[name].data?.answerErrors],
        [before[name].num_requests + 1, before[name].num_errors, before[name].last_error, before[name].data?.answered, before[name].data!.answerErrors + 1n],
        name,
      );
    }
  });

  it("a request for a revision not yet written waits for the write, then answers with it", async () => {
    // The next write to the needs bucket gets the next revision.
    const next = seeded[NEEDS]! + 1n;
    const answer = client.compose({ node: "zed", minRevisions: { needs: next } });
    answer.catch(() => {}); // awaited below
    await sleep(200); // the request is waiting
    // A KV put is a JetStream publish to $KV.<bucket>.<key>; the ack names the revision.
    const ack = await nc!.request(`$KV.${NEEDS}.zed.api.port.http`,
      toBinary(NeedSchema, create(NeedSchema, { placeholder: "${port:http}", required: true })), { timeout: 5000 });
    assert.equal(BigInt(ack.json<{ seq: number }>().seq), next);

    const composed = await answer;
    assert.ok(phaseMillis(composed, "wait") > 0, "the request did not wait");
    assert.equal(composed.revisions?.needs, next);
    assert.deepStrictEqual(composed.plans, [create(ModulePlanSchema, {
      module: "api",
      items: [{
        kind: "port", name: "http", placeholder: "${port:http}", owner: "mesh-controller",
        location: inBucket("mesh-controller_assignments", "zed.api"), revision: next,
      }],
    })]);
  });
});

// After read your writes: it writes needs of a node of its own, yan.
describe("provisions", () => {
  const postgres = inboxPrefix("provider", "postgres");

  it("a provider reads what it must provision, each provision with its node", () =>
    asIdentity(postgres, async (conn) => {
      const provider = new ProvisionerClient(conn);
      const answer = await provider.provisions({ provider: "postgres" });
      assert.equal(answer.$typeName, ProvisionsResponseSchema.typeName);
      assert.equal(answer.provider, "postgres");
      assert.deepStrictEqual(answer.provisions, [create(ProvisionSchema, { ...postgresProvision, node: "ace" })]);
      assert.equal(answer.nextPageToken, "");
      assert.ok(answer.revisions!.registry > 0n && answer.revisions!.needs >= seeded[NEEDS]!);
      // A provider no need binds: none. Asked with postgres's inbox, it gets no answer at all.
      assert.deepStrictEqual((await client.provisions({ provider: "redis" })).provisions, []);
      await assert.rejects(conn.request(providerSubject("redis"), toBinary(ProvisionsRequestSchema, create(ProvisionsRequestSchema, { provider: "redis" })), { timeout: 500 }),
        (err) => !(err instanceof ProvisionerError));
    }));

  it("page by page, and joined, in the order of the needs' keys", async () => {
    let needs = 0n;
    for (const [key, local] of [["yan.api.bound.db", "api"], ["yan.web.bound.db", ""]] as const) {
      const ack = await nc!.request(`$KV.${NEEDS}.${key}`, toBinary(NeedSchema, create(NeedSchema, {
        placeholder: "${bound:db}", provider: "postgres", provision: "database", local,
      })), { timeout: 5000 });
      needs = BigInt(ack.json<{ seq: number }>().seq);
    }
    const request = { provider: "postgres", minRevisions: { needs }, pageSize: 1 };
    const pages = [];
    for await (const page of client.provisionsPages(request)) {
      pages.push(page);
    }
    assert.deepStrictEqual(pages.map((p) => p.provisions.map((x) => x.key)), [["ace.web.database.web"], ["yan.api.database.api"], ["yan.web.database"]]);
    assert.ok(pages.slice(0, -1).every((p) => p.nextPageToken !== "") && pages.at(-1)!.nextPageToken === "");
    const whole = await client.provisions({ provider: "postgres", minRevisions: { needs } });
    assert.deepStrictEqual(whole.provisions.map((x) => x.node), ["ace", "yan", "yan"]);
    assert.ok(equals(ProvisionsResponseSchema, await client.provisionsAll(request), whole));
    assert.ok(equals(ProvisionsResponseSchema, joinProvisionsPages(pages), whole));
  });

  it("a request without a provider is refused before it is sent", async () => {
    await assert.rejects(client.provisions({}), TypeError);
    await assert.rejects(client.provisionsAll({ provider: "" }), TypeError);
  });

  it("another provider's provisions on a provider's subject are a 403", async () => {
    const h = headers();
    h.set("Content-Type", CONTENT_TYPE_PROTOBUF);
    // On postgres's subject, answered on postgres's inbox only.
    const reply = await nc!.request(providerSubject("postgres"), toBinary(ProvisionsRequestSchema, create(ProvisionsRequestSchema, { provider: "redis" })),
      { timeout: 5000, headers: h, noMux: true, reply: createInbox(inboxPrefix("provider", "postgres")) });
    assert.deepStrictEqual(errorOf(reply), new ProvisionerError(403,
      `mesh-provisioner.provisions.postgres lists provider "postgres"'s provisions only, and the request names provider "redis"; ask mesh-provisioner.provisions.<provider> as that provider`));
  });
});

// After the provisions: it writes needs of a node of its own, wes.
describe("watchPlan", () => {
  /** Writes a need of wes as its client does, through the put verb (key `<module>.<kind>.<name>`); returns its revision. */
  async function putNeed(key: string, need: MessageInitShape<typeof NeedSchema>): Promise<bigint> {
    const [module, kind, name] = key.split(".") as [string, string, string];
    return new ProvisionerClient(nc!, { node: "wes" }).putNeed(module, kind, name, need, { timeout: 5000 });
  }
  /**
   * wes's key of the plans bucket as it holds it, or undefined: a direct get
   * of the key's last message (a fixture on a server without authorization;
   * a node may not).
   */
  async function planOfWes(): Promise<{ digest: string; revision: number } | undefined> {
    const reply = await nc!.request(`$JS.API.DIRECT.GET.KV_${PLANS_BUCKET}.$KV.${PLANS_BUCKET}.wes`, Empty, { timeout: 5000 });
    const sequence = reply.headers?.get("Nats-Sequence") ?? "";
    if (sequence === "" || reply.headers?.get("KV-Operation")) {
      return undefined; // no message (a 404 status), or a delete marker
    }
    return { digest: fromBinary(PlanDigestSchema, reply.data).digest, revision: Number(sequence) };
  }
  /** The next composition, failing after 10 s. */
  async function next(plans: AsyncIterator<ComposeResponse>, what: string): Promise<IteratorResult<ComposeResponse>> {
    const late = sleep(10_000, "late" as const, { ref: false });
    const got = await Promise.race([plans.next(), late]);
    assert.notEqual(got, "late", `${what}: nothing within 10s`);
    return got as IteratorResult<ComposeResponse>;
  }

  it("yields the composition, then a new one when the plan changes, none when a write changes nothing; stops on abort", async () => {
    await putNeed("web.port.http", { placeholder: "${port:http}", required: true });
    const stop = new AbortController();
    const plans = client.watchPlan("wes", { signal: stop.signal })[Symbol.asyncIterator]();
    const first = await next(plans, "the current plan");
    assert.equal(first.done, false);
    assert.match(first.value!.planDigest, /^xxh3:[0-9a-f]{32}$/u);
    assert.equal(first.value!.node, "wes");

    const revision = await putNeed("web.port.admin", { placeholder: "${port:admin}" });
    let changed = await next(plans, "after a need written");
    // The first composition may have been read before the first need was in the copy.
    while (!changed.done && !changed.value.plans.some((p) => p.items.some((i) => i.name === "admin"))) {
      changed = await next(plans, "after a need written");
    }
    assert.equal(changed.done, false);
    const second = changed.value!;
    assert.notEqual(second.planDigest, first.value!.planDigest);
    assert.ok(second.revisions!.needs >= revision, `composed at needs ${second.revisions!.needs}, the need written at ${revision}`);
    assert.deepStrictEqual(second.plans.map((p) => [p.module, p.items.map((i) => i.name)]), [["web", ["admin", "http"]]]);

    // Written again unchanged: the digest holds, nothing is yielded.
    await putNeed("web.port.admin", { placeholder: "${port:admin}" });
    const pending = plans.next();
    assert.equal(await Promise.race([pending, sleep(300, "nothing" as const)]), "nothing");

    // Aborted, the pending next ends the iteration, and nothing arrives on the connection any more.
    stop.abort();
    assert.deepStrictEqual(await Promise.race([pending, sleep(2000, "late" as const, { ref: false })]), { done: true, value: undefined });
    // A write of wes's key the server sent before it read the watch's
    // unsubscribe arrives before the flush's answer: counted out, it is not
    // the watch running.
    await nc!.flush();
    const before = nc!.stats().inMsgs;
    await putNeed("web.port.metrics", { placeholder: "${port:metrics}" }); // changes the plan: the seat writes wes's key
    await sleep(300);
    assert.equal(nc!.stats().inMsgs, before + 1, "a message other than the put's answer arrived: the watch still runs");
  });

  it("breaking out of the loop stops the watch", async () => {
    let got: ComposeResponse | undefined;
    for await (const plan of client.watchPlan("wes")) {
      got = plan;
      break;
    }
    assert.ok(got?.plans.some((p) => p.items.some((i) => i.name === "admin")));
    // A write of wes's key the server sent before it read the watch's
    // unsubscribe arrives before the flush's answer: counted out, it is not
    // the watch running.
    await nc!.flush();
    const before = nc!.stats().inMsgs;
    await putNeed("web.port.debug", { placeholder: "${port:debug}" });
    await sleep(300);
    assert.equal(nc!.stats().inMsgs, before + 1, "a message other than the put's answer arrived: the watch still runs");
  });

  it("asks JetStream nothing: no consumer, no direct get, no stream info; it composes through the verb", async () => {
    // The spy sees the whole account's asks, the server's too.
    const spy = await connect({ servers: natsUrl, name: "mesh-provisioner e2e spy" });
    const asked: string[] = [];
    const sub = spy.subscribe("$JS.API.>", { callback: (_err, msg) => void asked.push(msg.subject) });
    await spy.flush();
    try {
      for await (const plan of client.watchPlan("wes")) {
        assert.equal(plan.node, "wes");
        break;
      }
      await spy.flush();
    } finally {
      sub.unsubscribe();
      await spy.close();
    }
    const plans = asked.filter((s) => s.includes(`.KV_${PLANS_BUCKET}`));
    assert.deepStrictEqual(plans.filter((s) => s.startsWith("$JS.API.CONSUMER.")), [], JSON.stringify(asked));
    assert.deepStrictEqual(plans.filter((s) => s.startsWith(`$JS.API.DIRECT.GET.KV_${PLANS_BUCKET}`)), [], JSON.stringify(asked));
    assert.deepStrictEqual(plans.filter((s) => s.startsWith("$JS.API.STREAM.")), [], JSON.stringify(asked));
  });

  it("hears only writes of its own key: a message JetStream answers there, or one of another key, is not a change", async () => {
    const stop = new AbortController();
    const plans = client.watchPlan("wes", { signal: stop.signal })[Symbol.asyncIterator]();
    try {
      const first = await next(plans, "the current plan");
      assert.equal(first.done, false);
      const subject = `$KV.${PLANS_BUCKET}.wes`;
      // A digest that is not wes's plan, as an answer of JetStream's aimed
      // at wes's key would carry it: with Nats-Stream, or naming another
      // key in Nats-Subject; and bytes that are no digest.
      const forged = toBinary(PlanDigestSchema, create(PlanDigestSchema, { digest: "sha256:forged", revisions: { needs: 1n } }));
      const answered = headers();
      answered.set("Nats-Stream", `KV_${PLANS_BUCKET}`);
      const otherKey = headers();
      otherKey.set("Nats-Subject", `$KV.${PLANS_BUCKET}.novox`);
      const before = await endpointStats();
      const composed = before.compose.num_requests + before["compose-node"].num_requests;
      nc!.publish(subject, forged, { headers: answered });
      nc!.publish(subject, forged, { headers: otherKey });
      nc!.publish(subject, new TextEncoder().encode('{"stream":"KV_mesh-provisioner_plans","seq":7}'));
      nc!.publish(subject, toBinary(PlanDigestSchema, create(PlanDigestSchema, { digest: "" })));
      assert.equal(await Promise.race([plans.next(), sleep(500, "nothing" as const)]), "nothing", "a composition after a message that is no write of wes's key");
      const now = await endpointStats();
      assert.equal(now.compose.num_requests + now["compose-node"].num_requests, composed, "the watch composed again");
    } finally {
      stop.abort();
    }
  });

  it("refuses a node that is not one token: a wildcard would subscribe to every node's key", async () => {
    for (const node of ["*", ">", "ace.web", ""]) {
      await assert.rejects(client.watchPlan(node).next(), TypeError, node);
    }
  });

  it("an aborted signal yields nothing", async () => {
    const plans = [];
    for await (const plan of client.watchPlan("wes", { signal: AbortSignal.abort() })) {
      plans.push(plan);
    }
    assert.deepStrictEqual(plans, []);
  });

  it("composes again once reconnected: a change written while the connection was lost is yielded", async () => {
    const proxy = await cuttableProxy(natsUrl);
    const conn = await connect({ servers: proxy.address, name: "mesh-provisioner e2e reconnecting", reconnectTimeWait: 50, maxReconnectAttempts: -1 });
    const events: string[] = [];
    void (async () => {
      for await (const s of conn.status()) {
        events.push(s.type);
      }
    })();
    const stop = new AbortController();
    try {
      const plans = new ProvisionerClient(conn).watchPlan("wes", { signal: stop.signal })[Symbol.asyncIterator]();
      const first = await next(plans, "the current plan");
      assert.equal(first.done, false);
      const pending = plans.next();

      proxy.cut();
      for (let waited = 0; !events.includes("disconnect"); waited += 10) {
        assert.ok(waited < 5000, `no disconnect within 5s: ${events.join(", ")}`);
        await sleep(10);
      }
      const revision = await putNeed("web.port.grpc", { placeholder: "${port:grpc}" });
      const want = (await client.composeAll({ node: "wes", minRevisions: { needs: revision } })).planDigest;
      assert.notEqual(want, first.value!.planDigest);
      // The seat's holder writes it to wes's key while the watch cannot hear it.
      let written: number | undefined;
      for (let waited = 0; written === undefined; waited += 50) {
        assert.ok(waited < 10_000, "the seat's holder did not write wes's new digest within 10s");
        await sleep(50);
        const entry = await planOfWes();
        if (entry?.digest === want) {
          written = entry.revision;
        }
      }
      assert.equal(await Promise.race([pending, sleep(300, "nothing" as const)]), "nothing", "a composition while disconnected");

      proxy.resume();
      const changed = await next({ next: () => pending }, "after the reconnect");
      assert.ok(events.includes("reconnect"), events.join(", "));
      assert.equal(changed.done, false);
      assert.equal(changed.value!.planDigest, want);
      assert.ok(changed.value!.revisions!.needs >= revision, `composed at needs ${changed.value!.revisions!.needs}, the need written at ${revision}`);
      assert.ok(changed.value!.plans.some((p) => p.items.some((i) => i.name === "grpc")));
      // Not a write heard after the reconnect: the key's last is the one
      // written while the connection was lost.
      assert.equal((await planOfWes())?.revision, written);
    } finally {
      stop.abort();
      await conn.close();
      await proxy.close();
    }
  });

  it("throws a WatchStoppedError when the connection closes", async () => {
    const conn = await connect({ servers: natsUrl, name: "mesh-provisioner e2e closing" });
    const plans = new ProvisionerClient(conn).watchPlan("wes")[Symbol.asyncIterator]();
    try {
      assert.equal((await next(plans, "the current plan")).done, false);
      const pending = plans.next();
      await conn.close();
      await assert.rejects(pending, WatchStoppedError);
    } finally {
      await conn.close();
    }
  });

  it("waits for the service: a watch started before any instance serves yields the first composition once one does", async () => {
    // A nats-server of its own (authnats, the service's and ace's grants)
    // whose buckets a first instance creates, then stops: no instance
    // serves mesh-provisioner.compose.ace when ace starts watching.
    const nats = await startProgram(fromMake("MESH_PROVISIONER_AUTHNATS_BIN"), [], "stdout", () => true);
    const urls = JSON.parse(nats.line) as Record<string, string>;
    const dir = await mkdtemp(join(tmpdir(), "mesh-provisioner-e2e-late-"));
    const serveArgs = [
      "--nats-url", urls["mesh-provisioner"]!, "--writer-nats-url", urls["mesh-provisioner-writer"]!,
      "--log-format", "json", "--state-dir", dir,
    ];
    const serving = (line: string) => line.includes('"msg":"serving"');
    let instance: ChildProcess | undefined;
    let conn: NatsConnection | undefined;
    const stopWatch = new AbortController();
    try {
      instance = (await startProgram(fromMake("MESH_PROVISIONER_BIN"), serveArgs, "stderr", serving)).child;
      assert.equal(await stop(instance), 0, "the first instance did not exit with 0 on SIGTERM");
      instance = undefined;

      // nats.js takes no credentials from a URL: they are given apart.
      const ace = new URL(urls["ace"]!);
      conn = await connect({ servers: ace.host, user: ace.username, pass: ace.password, inboxPrefix: inboxPrefix("node", "ace"), name: "ace" });
      const plans = new ProvisionerClient(conn, { node: "ace" }).watchPlan("ace", { signal: stopWatch.signal })[Symbol.asyncIterator]();
      // Its first composition asked with no responders: asked again, not thrown.
      const pending = plans.next();
      pending.catch(() => {}); // awaited below
      assert.equal(await Promise.race([pending, sleep(500, "nothing" as const)]), "nothing", "with no instance serving");

      instance = (await startProgram(fromMake("MESH_PROVISIONER_BIN"), serveArgs, "stderr", serving)).child;
      const first = await next({ next: () => pending }, "once an instance serves");
      assert.equal(first.done, false);
      assert.equal(first.value!.node, "ace");
      assert.match(first.value!.planDigest, /^xxh3:[0-9a-f]{32}$/u);
    } finally {
      stopWatch.abort();
      await conn?.close();
      if (instance !== undefined) {
        await stop(instance);
      }
      if (nats.child.exitCode === null && nats.child.signalCode === null) {
        const exited = once(nats.child, "exit");
        nats.child.stdin!.end(); // authnats serves until its stdin closes
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    }
  });
});

/**
 * Starts a program and resolves, with it, to the first of its lines on
 * stream that match; the stream is read until the program exits, so that
 * it never blocks on a full pipe. Its standard input stays open.
 */
function startProgram(bin: string, args: string[], stream: "stdout" | "stderr", match: (line: string) => boolean): Promise<{ child: ChildProcess; line: string }> {
  const child = spawn(bin, args, { stdio: ["pipe", stream === "stdout" ? "pipe" : "ignore", stream === "stderr" ? "pipe" : "ignore"] });
  // Should this process end before the test stops it, the program ends with it.
  process.once("exit", () => child.kill("SIGKILL"));
  const seen: string[] = [];
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${bin}: no expected line within 20s:\n${seen.join("\n")}`));
    }, 20_000);
    const fail = (err: Error) => {
      clearTimeout(timer);
      reject(err);
    };
    child.once("error", fail);
    child.once("exit", (code, signal) => fail(new Error(`${bin} exited (${code ?? signal}):\n${seen.join("\n")}`)));
    createInterface({ input: child[stream]! }).on("line", (line) => {
      seen.push(line);
      if (match(line)) {
        clearTimeout(timer);
        resolve({ child, line });
      }
    });
  });
}

/**
 * A TCP proxy to a NATS server's URL, listening on a free port of its own,
 * that the test cuts: its connections dropped and new ones closed at once,
 * until resumed.
 */
async function cuttableProxy(url: string): Promise<{ address: string; cut(): void; resume(): void; close(): Promise<void> }> {
  const target = new URL(url.includes("://") ? url : `nats://${url}`);
  const sockets = new Set<Socket>();
  let cut = false;
  const track = (socket: Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  };
  const server = createServer((client) => {
    track(client);
    if (cut) {
      client.destroy();
      return;
    }
    const upstream = createConnection({ host: target.hostname, port: Number(target.port) });
    track(upstream);
    for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
      from.pipe(to);
      from.once("error", () => to.destroy());
      from.once("close", () => to.destroy());
    }
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as { port: number };
  const dropAll = () => {
    for (const socket of sockets) {
      socket.destroy();
    }
  };
  return {
    address: `127.0.0.1:${port}`,
    cut: () => {
      cut = true;
      dropAll();
    },
    resume: () => {
      cut = false;
    },
    close: async () => {
      const closed = once(server, "close");
      server.close();
      dropAll();
      await closed;
    },
  };
}

// A node's and a provider's writes through the verbs, on the server without
// authorization: node zoe and provider zpg, whose records no test above reads.
describe("writes", () => {
  let zoe: ProvisionerClient;
  let zpg: ProvisionerClient;
  before(() => {
    zoe = new ProvisionerClient(nc!, { node: "zoe" });
    zpg = new ProvisionerClient(nc!, { provider: "zpg" });
  });

  it("keys are the Go keys package's: names escaped byte by byte of their UTF-8, = and two upper-case hex digits", () => {
    assert.equal(escapeName("zsh:normal"), "zsh=3Anormal");
    assert.equal(escapeName("a.b=c d/e-f_g"), "a=2Eb=3Dc=20d/e-f_g");
    assert.equal(escapeName("café"), "caf=C3=A9");
    assert.equal(needKey("ace", "web", "shell", "zsh:normal"), "ace.web.shell.zsh=3Anormal");
    assert.equal(appliedKey("ace", "web"), "ace.web");
    assert.equal(collectKey("ace", "shell:zsh:normal", "web"), "ace.shell=3Azsh=3Anormal.web");
    assert.equal(manifestKey("ace", "pg"), "ace.pg");
    for (const build of [
      () => needKey("ace", "we.b", "port", "http"), () => needKey("ace", "web", "port", ""), () => needKey("", "web", "port", "http"),
      () => appliedKey("ace", "web:1"), () => collectKey("ace", "", "web"), () => collectKey("ace", "env", "w*"), () => manifestKey("ace", "p g"),
    ]) {
      assert.throws(build, TypeError, String(build));
    }
  });

  it("encodes values as Go's deterministic encoding does: map entries by key bytes, whatever order they were set in", () => {
    // Go sorts "10" before "9"; a JavaScript object lists integer-like keys
    // in numeric order, so protobuf-es alone writes "9" first.
    // A map entry of field 2 (Manifest.attributes; Offer's is field 3).
    const entry = (key: string, value: string, tag = 0x12) => {
      const [k, v] = [Buffer.from(key), Buffer.from(value)];
      return [tag, 4 + k.length + v.length, 0x0a, k.length, ...k, 0x12, v.length, ...v];
    };
    const want = Uint8Array.from([...entry("10", "b"), ...entry("9", "a"), ...entry("a\u00e9", "x"), ...entry("b", "y")]);
    const forward = { attributes: { "9": "a", "10": "b", "b": "y", "a\u00e9": "x" } };
    const backward = { attributes: { "a\u00e9": "x", "b": "y", "10": "b", "9": "a" } };
    assert.deepStrictEqual(encodeDeterministic(ManifestSchema, forward), want);
    assert.deepStrictEqual(encodeDeterministic(ManifestSchema, backward), want);
    assert.notDeepStrictEqual(toBinary(ManifestSchema, create(ManifestSchema, forward)), want);
    // Maps in messages in lists too; the message given is left as it was.
    const manifest = create(ManifestSchema, { offers: [{ provision: "db", attributes: { "9": "a", "10": "b" } }] });
    const bytes = encodeDeterministic(ManifestSchema, manifest);
    assert.deepStrictEqual(bytes.slice(-17), Uint8Array.from([...entry("10", "b", 0x1a), ...entry("9", "a", 0x1a)]));
    assert.deepStrictEqual(Object.keys(manifest.offers[0]!.attributes), ["9", "10"]);
    assert.ok(equals(ManifestSchema, fromBinary(ManifestSchema, bytes), manifest));
  });

  it("a node puts, reads back and deletes its need, applied record and collection item, by their readable names", async () => {
    const needAt = await zoe.putNeed("web", "shell", "zsh:normal", { placeholder: "${shell:zsh:normal}", required: true });
    const needs = await zoe.provisioning({ what: What.NEEDS, node: "zoe", minRevision: needAt });
    assert.deepStrictEqual(needs.needs.map((r) => [r.module, r.kind, r.name, r.need?.placeholder, r.need?.required, r.revision]),
      [["web", "shell", "zsh:normal", "${shell:zsh:normal}", true, needAt]]);
    assert.deepStrictEqual(needs.malformed, []);

    const appliedAt = await zoe.putApplied("web", { planDigest: "sha256:0a", placeholders: ["${shell:zsh:normal}"], wantedBuild: "b1" });
    const applied = await zoe.provisioning({ what: What.APPLIED, node: "zoe", minRevision: appliedAt });
    assert.deepStrictEqual(applied.applied.map((r) => [r.module, r.applied?.planDigest, r.applied?.placeholders, r.applied?.wantedBuild, r.revision]),
      [["web", "sha256:0a", ["${shell:zsh:normal}"], "b1", appliedAt]]);

    const itemAt = await zoe.putCollectItem("shell:zsh:normal", "web", { value: "export A=1", order: 3, attributes: { b: "2", a: "1" } });
    const items = await zoe.provisioning({ what: What.COLLECT, node: "zoe", collection: "shell:zsh:normal", minRevision: itemAt });
    assert.deepStrictEqual(items.collect.map((r) => [r.collection, r.contributor, r.item?.value, r.item?.order, r.item?.attributes, r.revision]),
      [["shell:zsh:normal", "web", "export A=1", 3, { a: "1", b: "2" }, itemAt]]);

    // Each delete answers its marker's revision, after the write it deletes.
    const needGone = await zoe.deleteNeed("web", "shell", "zsh:normal");
    const appliedGone = await zoe.deleteApplied("web");
    const itemGone = await zoe.deleteCollectItem("shell:zsh:normal", "web");
    assert.ok(needGone > needAt && appliedGone > appliedAt && itemGone > itemAt, `${needGone} ${appliedGone} ${itemGone}`);
    assert.deepStrictEqual((await zoe.provisioning({ what: What.NEEDS, node: "zoe", minRevision: needGone })).needs, []);
    assert.deepStrictEqual((await zoe.provisioning({ what: What.APPLIED, node: "zoe", minRevision: appliedGone })).applied, []);
    assert.deepStrictEqual((await zoe.provisioning({ what: What.COLLECT, node: "zoe", minRevision: itemGone })).collect, []);
  });

  it("applies a module's whole set: what is new or changed written, what is missing deleted, the same left", async () => {
    const first = await zoe.applyNeeds("api", [
      { kind: "port", name: "http", need: { placeholder: "${port:http}" } },
      { kind: "port", name: "admin", need: { placeholder: "${port:admin}" } },
      { kind: "config", name: "db:url", need: { placeholder: "${config:db:url}" } },
    ]);
    assert.deepStrictEqual([first.written, first.deleted, first.unchanged], [3, 0, 0]);
    // Each apply after the first names the module's last write it was
    // answered, so the service does not ask the bucket for it.
    let directGets = 0;
    const gets = nc!.subscribe("$JS.API.DIRECT.GET.KV_mesh-provisioner_needs", { callback: () => { directGets++; } });
    const second = await zoe.applyNeeds("api", [
      { kind: "port", name: "http", need: { placeholder: "${port:http}" } },
      { kind: "port", name: "admin", need: { placeholder: "${port:admin}", required: true } },
    ]);
    assert.deepStrictEqual([second.written, second.deleted, second.unchanged], [1, 1, 1]);
    assert.ok(second.revision > first.revision);
    const needs = await zoe.provisioning({ what: What.NEEDS, node: "zoe", module: "api", minRevision: second.revision });
    assert.deepStrictEqual(needs.needs.map((r) => [r.kind, r.name, r.need?.required]), [["port", "admin", true], ["port", "http", false]]);
    // The same set again changes nothing: its values are the same bytes.
    const again = await zoe.applyNeeds("api", [
      { kind: "port", name: "admin", need: { required: true, placeholder: "${port:admin}" } },
      { kind: "port", name: "http", need: { placeholder: "${port:http}" } },
    ]);
    assert.deepStrictEqual([again.written, again.deleted, again.unchanged], [0, 0, 2]);
    const none = await zoe.applyNeeds("api", []);
    assert.deepStrictEqual([none.written, none.deleted, none.unchanged], [0, 2, 0]);
    await nc!.flush();
    gets.unsubscribe();
    assert.equal(directGets, 0, `the applies after the first asked the bucket ${directGets} times`);
    assert.deepStrictEqual((await zoe.provisioning({ what: What.NEEDS, node: "zoe", minRevision: none.revision })).needs, []);
  });

  it("declares a manifest, whose digest is the SHA-256 of its deterministic bytes, and withdraws it", async () => {
    const manifest = { offers: [{ provision: "database", attributes: { "9": "a", "10": "b" } }], attributes: { version: "16" } };
    const declared = await zoe.putManifest("zpg", manifest);
    const digest = `sha256:${createHash("sha256").update(encodeDeterministic(ManifestSchema, manifest)).digest("hex")}`;
    assert.equal(declared.digest, digest);
    const stored = await zoe.provisioning({ what: What.MANIFESTS, node: "zoe", minRevision: declared.revision });
    assert.deepStrictEqual(stored.manifests.map((r) => [r.provider, r.digest, r.revision]), [["zpg", digest, declared.revision]]);
    // The same manifest, its maps set in another order: the same bytes.
    const again = await zoe.putManifest("zpg", { attributes: { version: "16" }, offers: [{ attributes: { "10": "b", "9": "a" }, provision: "database" }] });
    assert.equal(again.digest, digest);

    const withdrawn = await zoe.deleteManifest("zpg");
    assert.ok(withdrawn > again.revision);
    assert.deepStrictEqual((await zoe.provisioning({ what: What.MANIFESTS, node: "zoe", minRevision: withdrawn })).manifests, []);
  });

  it("a provider binds a key through the bind verb, and the node's composition sees it bound at that revision", async () => {
    const declared = await zoe.putManifest("zpg", { offers: [{ provision: "database" }] });
    const needAt = await zoe.putNeed("shop", "bound", "db", { placeholder: "${bound:db}", provider: "zpg", provision: "database", local: "main" });
    const pending = await zoe.composeAll({ node: "zoe", module: "shop", minRevisions: { needs: needAt, manifests: declared.revision } });
    assert.deepStrictEqual(pending.provisions.map((p) => [p.provider, p.bucket, p.key, isBound(p)]), [["zpg", "zpg_bound", "zoe.shop.database.main", false]]);

    const bound = await zpg.bind("zoe.shop.database.main", new TextEncoder().encode("postgres://db"));
    const composed = await zoe.composeAll({ node: "zoe", module: "shop", minRevisions: { needs: needAt, bound: { zpg_bound: bound } } });
    assert.deepStrictEqual(composed.provisions.map((p) => [p.key, p.boundRevision, isBound(p), p.manifestDigest]),
      [["zoe.shop.database.main", bound, true, declared.digest]]);

    const unbound = await zpg.unbind("zoe.shop.database.main");
    assert.ok(unbound > bound);
    const after = await zoe.composeAll({ node: "zoe", module: "shop", minRevisions: { bound: { zpg_bound: unbound } } });
    assert.deepStrictEqual(after.provisions.map((p) => isBound(p)), [false]);
    await zoe.applyNeeds("shop", []);
    await zoe.deleteManifest("zpg");
  });

  it("a refused write is a ProvisionerError with the service's code; a client without its node or provider, or a bad key part, throws a TypeError before sending", async () => {
    await assert.rejects(zoe.putNeed("web", "config", "big", { placeholder: "x".repeat(70 * 1024) }), (err) =>
      err instanceof ProvisionerError && err.code === 413);
    await assert.rejects(zpg.bind("zoe", new Uint8Array([1])), (err) => err instanceof ProvisionerError && err.code === 400);
    const before = nc!.stats().outMsgs;
    await assert.rejects(client.putNeed("web", "port", "http", {}), TypeError);
    await assert.rejects(client.bind("zoe.web.database", new Uint8Array()), TypeError);
    await assert.rejects(zpg.putApplied("web", {}), TypeError);
    await assert.rejects(zoe.putNeed("w.eb", "port", "http", {}), TypeError);
    await assert.rejects(zoe.deleteCollectItem("", "web"), TypeError);
    await assert.rejects(zoe.putManifest("z.pg", {}), TypeError);
    assert.equal(nc!.stats().outMsgs, before, "a refused call sent a request");
    assert.deepStrictEqual((await zoe.provisioning({ what: What.NEEDS, node: "zoe" })).needs, []);
  });
});

// After every other test: it writes 5,000 needs of nodes of its own.
describe("an answer of 5 MB", () => {
  it("arrives whole, page by page, each page under max_payload", async () => {
    const placeholder = "${config:" + "x".repeat(1000) + "}";
    const value = toBinary(NeedSchema, create(NeedSchema, { placeholder }));
    let revision = 0n;
    // Five nodes of 1,000 needs: within each node's budget in the copy.
    for (let node = 0; node < 5; node++) {
      const acks = await Promise.all(Array.from({ length: 1000 }, (_, i) =>
        nc!.request(`$KV.${NEEDS}.big${node}.m.config.k${String(i).padStart(4, "0")}`, value, { timeout: 10_000 })));
      for (const ack of acks) {
        revision = BigInt(Math.max(Number(revision), (ack.json() as { seq: number }).seq));
      }
    }
    const maxPayload = nc!.info!.max_payload;
    let pages = 0;
    let bytes = 0;
    const keys: string[] = [];
    for await (const page of client.provisioningPages({ what: What.NEEDS, minRevision: revision }, { timeout: 10_000 })) {
      const size = toBinary(ProvisioningResponseSchema, page).length;
      assert.ok(size <= maxPayload, `page ${pages + 1} is ${size} bytes, over max_payload ${maxPayload}`);
      pages++;
      bytes += size;
      keys.push(...page.needs.filter((r) => r.node.startsWith("big")).map((r) => `${r.node}.${r.name}`));
    }
    assert.ok(pages >= 5, `${pages} pages, want several for ${bytes} bytes`);
    assert.ok(bytes > 5_000_000, `${bytes} bytes in all, want over 5 MB`);
    assert.equal(keys.length, 5000);
    assert.deepStrictEqual(keys, [...keys].sort());
  });
});
