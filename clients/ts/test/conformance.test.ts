// The TypeScript runner of the conformance suite: every case of
// conformance/cases against the real binary, each on a fresh server, reported
// by the case's name. conformance/README.md describes the cases.
//
// Run by `make test-ts`, which builds the binaries and sets
// MESH_PROVISIONER_BIN and MESH_PROVISIONER_APPLY_BIN.
import assert from "node:assert/strict";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { clone, equals, fromBinary, fromJson, toBinary, toJson, toJsonString, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";
import { headers, type NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";

import {
  ComposeRequestSchema,
  ComposeResponseSchema,
  EndpointStatsDataSchema,
  errorOf,
  inboxPrefix,
  joinComposePages,
  joinProvisioningPages,
  joinProvisionsPages,
  ProvisioningRequestSchema,
  ProvisioningResponseSchema,
  ProvisionsRequestSchema,
  ProvisionsResponseSchema,
  PutRequestSchema,
  DeleteRequestSchema,
  ApplyRequestSchema,
  ApplyResponseSchema,
  DeclareRequestSchema,
  BindRequestSchema,
  WriteResponseSchema,
} from "../src/index.js";

// build-test/test/ -> the repository's root.
const repo = resolve(fileURLToPath(import.meta.url), "../../../../..");
const casesDir = join(repo, "conformance", "cases");
// The flags every conformance runner serves with, after --state-dir.
const serveArgs = ["--listen", "127.0.0.1:0", "--log-format", "json", "--revision-wait", "1s"];
const contentTypes = { binary: "application/protobuf", json: "application/json" } as const;
type Encoding = keyof typeof contentTypes;

interface ExpectedError {
  code: number;
  sentence?: string;
  sentence_prefix?: string;
}
interface Expect {
  answer?: JsonValue;
  pages?: JsonValue[];
  error?: ExpectedError;
  content_type?: string;
}
interface Case {
  about: string;
  pending?: string;
  verb: "provisioning" | "compose" | "provisions" | "put" | "delete" | "apply" | "declare" | "bind";
  /** The request goes to mesh-provisioner.<verb>.<address>: a node's or a provider's own subject. */
  address?: string;
  request?: JsonValue;
  body?: { text?: string; base64?: string; content_type?: string };
  /** With body: first sent with this reply subject, where nothing may arrive; then as usual. */
  reply?: string;
  /** Flags added after serveArgs, for a limit of the case's own. */
  server_args?: string[];
  expect: Expect;
  then?: { request: JsonValue; expect: Expect };
}

const schemas = {
  provisioning: { request: ProvisioningRequestSchema, answer: ProvisioningResponseSchema },
  compose: { request: ComposeRequestSchema, answer: ComposeResponseSchema },
  provisions: { request: ProvisionsRequestSchema, answer: ProvisionsResponseSchema },
  put: { request: PutRequestSchema, answer: WriteResponseSchema },
  delete: { request: DeleteRequestSchema, answer: WriteResponseSchema },
  apply: { request: ApplyRequestSchema, answer: ApplyResponseSchema },
  declare: { request: DeclareRequestSchema, answer: WriteResponseSchema },
  bind: { request: BindRequestSchema, answer: WriteResponseSchema },
} as const;
type AnswerSchema =
  | typeof ProvisioningResponseSchema
  | typeof ComposeResponseSchema
  | typeof ProvisionsResponseSchema
  | typeof WriteResponseSchema
  | typeof ApplyResponseSchema;
type Answer =
  | MessageShape<typeof ProvisioningResponseSchema>
  | MessageShape<typeof ComposeResponseSchema>
  | MessageShape<typeof ProvisionsResponseSchema>
  | MessageShape<typeof WriteResponseSchema>
  | MessageShape<typeof ApplyResponseSchema>;

/** What a request got: an answer, or a refusal's code and sentence. */
interface Reply {
  answer?: Answer;
  contentType: string;
  code: number;
  sentence: string;
}

function fromMake(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run this test with \`make test-ts\`, which builds the binaries and sets MESH_PROVISIONER_BIN and MESH_PROVISIONER_APPLY_BIN`);
  }
  return value;
}

/** A server on a fresh state directory: its URL, and how to stop it. */
async function serve(extra: string[] = []): Promise<{ url: string; stop: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "mesh-provisioner-conformance-"));
  const child: ChildProcess = spawn(fromMake("MESH_PROVISIONER_BIN"), ["--state-dir", dir, ...serveArgs, ...extra], { stdio: ["ignore", "ignore", "pipe"] });
  const log: string[] = [];
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = once(child, "exit");
      child.kill("SIGTERM");
      await exited;
    }
    await rm(dir, { recursive: true, force: true });
  };
  try {
    const url = await new Promise<string>((resolveUrl, reject) => {
      const timer = setTimeout(() => reject(new Error(`the server did not serve within 20s:\n${log.join("\n")}`)), 20_000);
      child.once("error", reject);
      child.once("exit", () => reject(new Error(`the server exited before serving:\n${log.join("\n")}`)));
      createInterface({ input: child.stderr! }).on("line", (line) => {
        log.push(line);
        try {
          const record = JSON.parse(line) as { msg?: unknown; nats_url?: unknown };
          if (record.msg === "serving" && typeof record.nats_url === "string") {
            clearTimeout(timer);
            resolveUrl(record.nats_url);
          }
        } catch {
          // not a log record: shown if the server fails
        }
      });
    });
    return { url, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The subject a case's request goes to: the verb's, addressed when the case says so. */
function subjectOf(c: Case): string {
  return c.address === undefined ? `mesh-provisioner.${c.verb}` : `mesh-provisioner.${c.verb}.${c.address}`;
}

async function ask(nc: NatsConnection, c: Case, body: Uint8Array, contentType?: string): Promise<Reply> {
  const verb = c.verb;
  const h = headers();
  if (contentType !== undefined) {
    h.set("Content-Type", contentType);
  }
  const msg = await nc.request(subjectOf(c), body, { timeout: 10_000, headers: h });
  const replyType = msg.headers?.get("Content-Type") ?? "";
  const refusal = errorOf(msg);
  if (refusal) {
    return { contentType: replyType, code: refusal.code, sentence: refusal.description };
  }
  const schema: AnswerSchema = schemas[verb].answer;
  const answer = replyType === "application/json" ? fromJson(schema, msg.json<JsonValue>()) : fromBinary(schema, msg.data);
  return { answer, contentType: replyType, code: 0, sentence: "" };
}

function encode(verb: Case["verb"], fields: JsonValue | undefined, pageToken: string, encoding: Encoding): Uint8Array {
  const schema = schemas[verb].request;
  const request = fromJson(schema as DescMessage, fields ?? {}) as MessageShape<typeof schema>;
  if (pageToken !== "") {
    if (!("pageToken" in request)) {
      throw new Error(`a ${verb} request has no page_token: its answer has no pages`);
    }
    request.pageToken = pageToken;
  }
  return encoding === "json"
    ? new TextEncoder().encode(toJsonString(schema as DescMessage, request))
    : toBinary(schema as DescMessage, request);
}

/** An answer's next page token: empty for a write verb's, which has no pages. */
function nextPageTokenOf(answer: Answer | undefined): string {
  return answer !== undefined && "nextPageToken" in answer ? answer.nextPageToken : "";
}

/** The answer without the opaque page token and compose's timings. */
function comparable(schema: AnswerSchema, answer: Answer): Answer {
  const copy = clone(schema as DescMessage, answer) as Answer;
  if ("nextPageToken" in copy) {
    copy.nextPageToken = "";
  }
  if (copy.$typeName === "mesh.provisioner.v1.ComposeResponse") {
    copy.phases = [];
  }
  return copy;
}

/** Compares replies with the case's expectation; more: pages follow the last one expected. */
function check(verb: Case["verb"], expect: Expect, got: Reply[], more = false): void {
  if (expect.error) {
    const [reply] = got;
    assert.equal(reply!.answer, undefined, `answered, want error ${expect.error.code}`);
    assert.equal(reply!.code, expect.error.code, `code ${reply!.code} (${reply!.sentence}), want ${expect.error.code}`);
    if (expect.error.sentence !== undefined) {
      assert.equal(reply!.sentence, expect.error.sentence);
    }
    if (expect.error.sentence_prefix !== undefined) {
      assert.ok(reply!.sentence.startsWith(expect.error.sentence_prefix), reply!.sentence);
    }
    return;
  }
  const schema: AnswerSchema = schemas[verb].answer;
  const pages = expect.pages ?? [expect.answer ?? {}];
  got.forEach((r, i) => assert.ok(r.answer, `page ${i + 1}: refused with ${r.code}: ${r.sentence}`));
  assert.equal(got.length, pages.length, `${got.length} pages, want ${pages.length}`);
  got.forEach((reply, i) => {
    const last = i === pages.length - 1 && !more;
    const token = nextPageTokenOf(reply.answer);
    assert.equal(token === "", last, `page ${i + 1} of ${pages.length}: next_page_token ${JSON.stringify(token)}`);
    const expected = comparable(schema, fromJson(schema as DescMessage, pages[i]!) as Answer);
    const actual = comparable(schema, reply.answer!);
    if (!equals(schema as DescMessage, expected, actual)) {
      assert.deepStrictEqual(toJson(schema as DescMessage, actual), toJson(schema as DescMessage, expected), `page ${i + 1}`);
    }
  });
}

async function runRequest(nc: NatsConnection, c: Case, encoding: Encoding): Promise<void> {
  const contentType = contentTypes[encoding];
  const got: Reply[] = [];
  let token = "";
  for (;;) {
    const reply = await ask(nc, c, encode(c.verb, c.request, token, encoding), contentType);
    assert.equal(reply.contentType, contentType, `${encoding}: answered with Content-Type ${reply.contentType}`);
    got.push(reply);
    token = nextPageTokenOf(reply.answer);
    if (c.expect.pages === undefined || token === "" || got.length > c.expect.pages.length || c.then !== undefined) {
      break;
    }
  }
  check(c.verb, c.expect, got, c.then !== undefined);
  if (c.then) {
    const first = nextPageTokenOf(got[0]!.answer);
    assert.notEqual(first, "", "then: the first page has no next_page_token");
    check(c.verb, c.then.expect, [await ask(nc, c, encode(c.verb, c.then.request, first, encoding), contentType)]);
  }
}

async function runRaw(nc: NatsConnection, c: Case): Promise<void> {
  const body = c.body!;
  const data = body.text !== undefined ? new TextEncoder().encode(body.text) : Buffer.from(body.base64 ?? "", "base64");
  // Sent first with a reply that is not the asker's inbox: the service
  // handles requests in order, so by the time the second is answered the
  // first was refused or answered.
  const heard: string[] = [];
  const foreign = c.reply === undefined ? undefined : nc.subscribe(c.reply, { callback: (_err, msg) => void heard.push(msg.subject) });
  if (c.reply !== undefined) {
    const h = headers();
    if (body.content_type !== undefined) {
      h.set("Content-Type", body.content_type);
    }
    nc.publish(subjectOf(c), data, { reply: c.reply, headers: h });
  }
  const reply = await ask(nc, c, data, body.content_type);
  if (foreign !== undefined) {
    await nc.flush();
    foreign.unsubscribe();
    assert.deepStrictEqual(heard, [], `messages reached ${c.reply}, the reply subject that is not the asker's inbox`);
  }
  if (c.expect.content_type !== undefined) {
    assert.equal(reply.contentType, c.expect.content_type);
  }
  check(c.verb, c.expect, [reply]);
}

const files = (await readdir(casesDir)).filter((f) => f.endsWith(".json")).sort();
const cases = await Promise.all(files.map(async (file) => ({
  name: basename(file, ".json"),
  path: join(casesDir, file),
  c: JSON.parse(await readFile(join(casesDir, file), "utf8")) as Case,
})));

/**
 * Asks $SRV.STATS.mesh-provisioner and decodes every endpoint's data as an
 * EndpointStatsData, refusing fields the message does not define.
 */
async function checkStats(nc: NatsConnection): Promise<void> {
  const reply = await nc.request("$SRV.STATS.mesh-provisioner", undefined, { timeout: 10_000 });
  const stats = reply.json<{ type: string; endpoints: { name: string; data: JsonValue }[] }>();
  assert.equal(stats.type, "io.nats.micro.v1.stats_response");
  assert.ok(stats.endpoints.length > 0, "stats list no endpoint");
  for (const e of stats.endpoints) {
    let data;
    try {
      data = fromJson(EndpointStatsDataSchema, e.data, { ignoreUnknownFields: false });
    } catch (err) {
      assert.fail(`endpoint ${e.name}: data is not a mesh.provisioner.v1.EndpointStatsData: ${String(err)}\n${JSON.stringify(e.data)}`);
    }
    assert.equal(data.buckets.length, 5, `endpoint ${e.name}: buckets (the five provisioning buckets)`);
    assert.ok(data.answerCache !== undefined, `endpoint ${e.name}: answer_cache`);
  }
}

/**
 * The inbox prefix of the identity an addressed case asks as (the provider
 * for provisions and bind, else the node): the service answers a request on
 * an identity's own subject only on that identity's inbox. Undefined for a
 * bare subject: nats.js's own.
 */
function askerInbox(c: Case): string | undefined {
  if (c.address === undefined) {
    return undefined;
  }
  return c.verb === "provisions" || c.verb === "bind" ? inboxPrefix("provider", c.address) : inboxPrefix("node", c.address.split(".")[0]!);
}

describe("conformance", () => {
  it("has at least 40 cases", () => assert.ok(cases.length >= 40, `${cases.length} cases`));

  for (const { name, path, c } of cases) {
    const skip = c.pending !== undefined && !process.env["CONFORMANCE_RUN_PENDING"] ? `pending: ${c.pending}` : false;
    it(name, { skip }, async () => {
      const server = await serve(c.server_args);
      let nc: NatsConnection | undefined;
      try {
        await promisify(execFile)(fromMake("MESH_PROVISIONER_APPLY_BIN"), ["--nats-url", server.url, path], { timeout: 60_000 });
        const inbox = askerInbox(c);
        nc = await connect({ servers: server.url, name: `mesh-provisioner conformance ${name}`, ...(inbox === undefined ? {} : { inboxPrefix: inbox }) });
        if (c.body !== undefined) {
          await runRaw(nc, c);
        } else {
          for (const encoding of ["binary", "json"] as const) {
            await runRequest(nc, c, encoding);
          }
        }
        await checkStats(nc);
      } finally {
        await nc?.close();
        await server.stop();
      }
    });
  }
});

// Joining pages, checked with the suite's own data: the pages a page case
// expects join to the whole answer its unpaged twin expects.
describe("joining pages", () => {
  const expectOf = (name: string) => cases.find((x) => x.name === name)!.c.expect;
  for (const [paged, whole] of [["page-compose-plan-continues", "compose-node"], ["page-compose-module", "compose-module"]] as const) {
    it(`${paged} joins to ${whole}`, () => {
      const pages = expectOf(paged).pages!.map((p) => fromJson(ComposeResponseSchema, p));
      assert.ok(pages.length > 1);
      assert.ok(equals(ComposeResponseSchema, joinComposePages(pages), fromJson(ComposeResponseSchema, expectOf(whole).answer!)));
    });
  }
  for (const [paged, whole] of [["page-needs-records-and-malformed", "needs-all"], ["page-registry", "registry-empty-request"]] as const) {
    it(`${paged} joins to ${whole}`, () => {
      const pages = expectOf(paged).pages!.map((p) => fromJson(ProvisioningResponseSchema, p));
      assert.ok(pages.length > 1);
      assert.ok(equals(ProvisioningResponseSchema, joinProvisioningPages(pages), fromJson(ProvisioningResponseSchema, expectOf(whole).answer!)));
    });
  }
  it("provisions-provider-paged joins to provisions-provider", () => {
    const pages = expectOf("provisions-provider-paged").pages!.map((p) => fromJson(ProvisionsResponseSchema, p));
    assert.ok(pages.length > 1);
    assert.ok(equals(ProvisionsResponseSchema, joinProvisionsPages(pages), fromJson(ProvisionsResponseSchema, expectOf("provisions-provider").answer!)));
  });
});
