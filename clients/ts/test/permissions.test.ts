// A node's and a provider's writes and a node's watch of its plan on a
// nats-server whose authorization is what `mesh-provisioner permissions`
// prints (the Go tool internal/testkit/e2e/authnats, built by `make test`), with the
// service as its two identities. Node ace writes its records only through
// the service's verbs (put, delete, apply, declare for its provider pg) and
// watches its own plan; nats-server refuses it every JetStream publish (a KV
// put of its own key, stream info, a direct get of its own plan, any
// consumer), the declare of a provider its grant does not name, and the
// watch of novox's plan; the verbs refuse what is not ace's or not well
// formed, and answer only into ace's own inbox. Provider pg binds through
// mesh-provisioner.bind.pg and publishes nothing into its bucket. Twice: in
// one account, and in the runs-as set-up (authnats -runs-as: the service in
// its account PROVISIONER, ace, novox and pg each in an account of its own,
// which imports its own verbs and, a node's, its plan key's writes under
// RUNS_AS_API_PREFIX).
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Empty, PermissionViolationError, type NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";

import {
  errorOf,
  inboxPrefix,
  isBound,
  nodeSubject,
  NeedSchema,
  PLANS_BUCKET,
  ProvisionerClient,
  ProvisionerError,
  PUT_SUBJECT,
  PutRequestSchema,
  RUNS_AS_API_PREFIX,
  What,
  WriteResponseSchema,
  type ComposeResponse,
} from "../src/index.js";

/** Returns an environment variable that `make test` sets, or throws saying so. */
function fromMake(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run this test with \`make test\`, which builds the binaries and sets it`);
  }
  return value;
}

/** A program started, with how it is stopped: authnats when its stdin closes, serve on SIGTERM. */
type Program = { child: ChildProcess; stop: (child: ChildProcess) => void };

/** Starts a program into children and resolves to the first of its lines (on stdout or stderr) that match. */
function start(children: Program[], bin: string, args: string[], stream: "stdout" | "stderr", match: (line: string) => boolean): Promise<string> {
  const child = spawn(bin, args, { stdio: ["pipe", stream === "stdout" ? "pipe" : "ignore", stream === "stderr" ? "pipe" : "ignore"] });
  children.push({ child, stop: stream === "stdout" ? (c) => c.stdin!.end() : (c) => c.kill("SIGTERM") });
  process.once("exit", () => child.kill("SIGKILL"));
  const seen: string[] = [];
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${bin}: no expected line within 20s:\n${seen.join("\n")}`)), 20_000);
    child.once("exit", (code, signal) => reject(new Error(`${bin} exited (${code ?? signal}):\n${seen.join("\n")}`)));
    createInterface({ input: child[stream]! }).on("line", (line) => {
      seen.push(line);
      if (match(line)) {
        clearTimeout(timer);
        resolve(line);
      }
    });
  });
}

/**
 * Reports whether err is a permission violation: nats.js rejects a refused
 * request with a RequestError caused by it.
 */
function violation(err: unknown): boolean {
  return err instanceof PermissionViolationError || (err instanceof Error && err.cause instanceof PermissionViolationError);
}

for (const { name, authnatsArgs, apiPrefix } of [
  { name: "in one account", authnatsArgs: [], apiPrefix: "" },
  { name: "runs-as: each identity in an account of its own", authnatsArgs: ["-runs-as"], apiPrefix: RUNS_AS_API_PREFIX },
]) {
  describe(name, () => {
    const children: Program[] = [];
    let stateDir: string | undefined;
    let ace: NatsConnection | undefined;
    let novox: NatsConnection | undefined;
    let pg: NatsConnection | undefined;
    /** The permission violations nats-server reported to ace's connection. */
    const violations: PermissionViolationError[] = [];
    /** Those reported to pg's. */
    const pgViolations: PermissionViolationError[] = [];
    /** The provisioner's JetStream API as ace reaches it. */
    const api = apiPrefix === "" ? "$JS.API" : apiPrefix;
    /** A key's subject of the provisioner's buckets as ace reaches it. */
    const key = (subject: string) => (apiPrefix === "" ? subject : `${apiPrefix}.${subject}`);
    /** The direct get of the plans' stream, whose subject may name the key after it. */
    const directGet = `${api}.DIRECT.GET.KV_${PLANS_BUCKET}`;

    before(async () => {
      // authnats prints each identity's URL, and serves until its stdin closes.
      const urls = JSON.parse(await start(children, fromMake("MESH_PROVISIONER_AUTHNATS_BIN"), authnatsArgs, "stdout", () => true)) as Record<string, string>;
      stateDir = await mkdtemp(join(tmpdir(), "mesh-provisioner-permissions-"));
      await start(children, fromMake("MESH_PROVISIONER_BIN"), [
        "--nats-url", urls["mesh-provisioner"]!, "--writer-nats-url", urls["mesh-provisioner-writer"]!,
        "--log-format", "json", "--plans-interval", "10ms", "--state-dir", stateDir,
      ], "stderr", (line) => line.includes('"msg":"serving"'));
      // nats.js takes no credentials from a URL: they are given apart.
      const as = async (user: string, role: "node" | "provider", seen: PermissionViolationError[]) => {
        const url = new URL(urls[user]!);
        const nc = await connect({ servers: url.host, user: url.username, pass: url.password, inboxPrefix: inboxPrefix(role, user), name: user });
        void (async () => {
          for await (const s of nc.status()) {
            if (s.type === "error" && s.error instanceof PermissionViolationError) {
              seen.push(s.error);
            }
          }
        })();
        return nc;
      };
      ace = await as("ace", "node", violations);
      novox = await as("novox", "node", []);
      pg = await as("pg", "provider", pgViolations);
    });

    after(async () => {
      await ace?.close();
      await novox?.close();
      await pg?.close();
      for (const { child, stop } of children.reverse()) {
        child.removeAllListeners("exit");
        if (child.exitCode === null && child.signalCode === null) {
          const exited = once(child, "exit");
          stop(child);
          await exited;
        }
      }
      if (stateDir) {
        await rm(stateDir, { recursive: true, force: true });
      }
    });

    /** Reports whether nats-server refused ace (or those who saw seen) an operation on subject. */
    const refused = (operation: "publish" | "subscription", subject: string, seen = violations) =>
      seen.some((v) => v.operation === operation && v.subject === subject);
    const reported = (seen = violations) => seen.map((v) => v.message).join("; ");
    /**
     * Waits, up to 2 s, for nats-server to report that it refused an
     * operation on subject: nats.js tells of a violation on the connection's
     * status a little after the flush that follows it.
     */
    const refusedSoon = async (operation: "publish" | "subscription", subject: string, nc = ace!, seen = violations) => {
      await nc.flush();
      for (let waited = 0; !refused(operation, subject, seen) && waited < 2000; waited += 10) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      return refused(operation, subject, seen);
    };

    /** Asks JetStream's API as ace, and resolves to the JSON answer. */
    const askJS = async (subject: string, body: unknown): Promise<Record<string, unknown>> => {
      const reply = await ace!.request(subject, body === undefined ? Empty : JSON.stringify(body), { timeout: 2000 });
      return reply.json<Record<string, unknown>>();
    };

    /**
     * Sends ace's put verb a need record as given (what the client would not
     * build), and resolves to the refusal's code, or 0 for an answer.
     */
    const rawPut = async (key: string, value: Uint8Array): Promise<number> => {
      const request = toBinary(PutRequestSchema, create(PutRequestSchema, { record: { what: What.NEEDS, key, value } }));
      const reply = await ace!.request(nodeSubject(PUT_SUBJECT, "ace"), request, { timeout: 5000 });
      const refusal = errorOf(reply);
      if (refusal === undefined) {
        fromBinary(WriteResponseSchema, reply.data);
      }
      return refusal?.code ?? 0;
    };

    it("a node writes its records through the verbs and reads them back, and its watch hears its plan change", async () => {
      const client = new ProvisionerClient(ace!, { node: "ace", apiPrefix });
      await client.putNeed("web", "port", "http", { placeholder: "${port:http}" });
      const plans = client.watchPlan("ace");
      const next = async (): Promise<ComposeResponse> => {
        const { value, done } = await plans.next();
        assert.ok(!done && value, "the watch ended");
        return value;
      };
      try {
        let first = await next();
        while (first.plans.length === 0) { // asked before the need reached the service's copy
          first = await next();
        }
        // The module's whole set: http unchanged, admin new.
        const applied = await client.applyNeeds("web", [
          { kind: "port", name: "http", need: { placeholder: "${port:http}" } },
          { kind: "port", name: "admin", need: { placeholder: "${port:admin}" } },
        ]);
        assert.deepStrictEqual([applied.written, applied.deleted, applied.unchanged], [1, 0, 1]);
        let second = await next();
        while (second.revisions!.needs < applied.revision) {
          second = await next();
        }
        assert.notEqual(second.planDigest, first.planDigest);
        assert.deepStrictEqual(second.plans.map((p) => p.items.map((i) => i.name)), [["admin", "http"]]);

        const deleted = await client.deleteNeed("web", "port", "admin");
        let third = await next();
        while (third.revisions!.needs < deleted) {
          third = await next();
        }
        assert.deepStrictEqual(third.plans.map((p) => p.items.map((i) => i.name)), [["http"]]);
      } finally {
        await plans.return(undefined);
      }

      // Its applied record, a collection item, and the manifest of pg, the
      // provider its grant names: each read back on its own subject.
      const appliedAt = await client.putApplied("web", { planDigest: "sha256:0a", placeholders: ["${port:http}"] });
      const itemAt = await client.putCollectItem("shell:zsh:normal", "web", { value: "export A=1" });
      const manifest = await client.putManifest("pg", { offers: [{ provision: "database" }] });
      const [applieds, items, manifests] = await Promise.all([
        client.provisioning({ what: What.APPLIED, node: "ace", minRevision: appliedAt }),
        client.provisioning({ what: What.COLLECT, node: "ace", minRevision: itemAt }),
        client.provisioning({ what: What.MANIFESTS, node: "ace", minRevision: manifest.revision }),
      ]);
      assert.deepStrictEqual(applieds.applied.map((r) => [r.module, r.applied?.planDigest, r.revision]), [["web", "sha256:0a", appliedAt]]);
      assert.deepStrictEqual(items.collect.map((r) => [r.collection, r.contributor, r.item?.value]), [["shell:zsh:normal", "web", "export A=1"]]);
      assert.deepStrictEqual(manifests.manifests.map((r) => [r.provider, r.digest, r.revision]), [["pg", manifest.digest, manifest.revision]]);
      assert.match(manifest.digest, /^sha256:[0-9a-f]{64}$/u);
      const gone = await client.deleteCollectItem("shell:zsh:normal", "web");
      assert.deepStrictEqual((await client.provisioning({ what: What.COLLECT, node: "ace", minRevision: gone })).collect, []);
      await ace!.flush();
      assert.equal(violations.length, 0, reported());
    });

    it("a node publishes nothing into JetStream, nor declares a provider its grant does not name, nor watches another node's plan", async () => {
      const client = new ProvisionerClient(ace!, { node: "ace", apiPrefix });
      // A put of its own need into the bucket, whose acknowledgement it
      // could aim at any key; the needs' stream information, which lists
      // every node's keys; the direct get of its own plan.
      const ownNeed = key("$KV.mesh-provisioner_needs.ace.web.port.http");
      ace!.publish(ownNeed, toBinary(NeedSchema, create(NeedSchema, { placeholder: "${port:forged}" })));
      assert.ok(await refusedSoon("publish", ownNeed), reported());
      const needsInfo = `${api}.STREAM.INFO.KV_mesh-provisioner_needs`;
      await assert.rejects(askJS(needsInfo, { subjects_filter: ">" }), violation);
      assert.ok(await refusedSoon("publish", needsInfo), reported());
      const ownPlan = `${directGet}.$KV.${PLANS_BUCKET}.ace`;
      await assert.rejects(ace!.request(ownPlan, Empty, { timeout: 2000 }), violation);
      assert.ok(await refusedSoon("publish", ownPlan), reported());

      // The declare of redis, which ace does not run: refused by nats-server,
      // so never answered.
      await assert.rejects(client.putManifest("redis", { offers: [{ provision: "cache" }] }, { timeout: 1000 }));
      assert.ok(await refusedSoon("publish", "mesh-provisioner.declare.ace.redis"), reported());

      // novox's key: nats-server refuses the subscription to its subject,
      // and no plan comes.
      await assert.rejects(client.watchPlan("novox", { timeout: 1000 }).next());
      assert.ok(await refusedSoon("subscription", key(`$KV.${PLANS_BUCKET}.novox`)), reported());

      // None of it was written: the need is what ace put, no manifest of redis.
      const needs = await client.provisioning({ what: What.NEEDS, node: "ace" });
      assert.deepStrictEqual(needs.needs.map((r) => r.need?.placeholder), ["${port:http}"]);
      const manifests = await client.provisioning({ what: What.MANIFESTS, node: "ace" });
      assert.deepStrictEqual(manifests.manifests.map((r) => r.provider), ["pg"]);
    });

    it("the verbs refuse another node's key, a malformed key, a value that does not decode or is too large, and answer no other identity's inbox", async () => {
      const client = new ProvisionerClient(ace!, { node: "ace", apiPrefix });
      const need = toBinary(NeedSchema, create(NeedSchema, { placeholder: "${port:grpc}" }));
      assert.equal(await rawPut("novox.web.port.grpc", need), 403);
      assert.equal(await rawPut("ace.web.port", need), 400);
      assert.equal(await rawPut("ace.web.port.grpc", Uint8Array.from([0xff, 0xff, 0xff])), 400);
      await assert.rejects(client.putNeed("web", "config", "big", { placeholder: "x".repeat(65 * 1024) }),
        (err) => err instanceof ProvisionerError && err.code === 413);

      // A put whose reply subject is novox's inbox (or an operator's): not
      // answered there. In one account the service refuses it, storing
      // nothing; runs-as, it sees only nats-server's _R_ reply, stores
      // ace's own record and answers, and nats-server delivers the answer
      // in ace's own account, where no one else is.
      const heard: string[] = [];
      const theirs = novox!.subscribe(`${inboxPrefix("node", "novox")}.>`, { callback: (_err, msg) => void heard.push(msg.subject) });
      await novox!.flush();
      const stolen = toBinary(PutRequestSchema, create(PutRequestSchema, { record: { what: What.NEEDS, key: "ace.web.port.stolen", value: need } }));
      ace!.publish(nodeSubject(PUT_SUBJECT, "ace"), stolen, { reply: `${inboxPrefix("node", "novox")}.stolen` });
      ace!.publish(nodeSubject(PUT_SUBJECT, "ace"), stolen, { reply: `${inboxPrefix("operator", "alice")}.stolen` });
      await ace!.flush();
      // A write after them, answered: the copy read at its revision holds
      // whatever the two would have written.
      const after = await client.putNeed("web", "port", "after", { placeholder: "${port:after}" });
      await new Promise((resolve) => setTimeout(resolve, 500));
      theirs.unsubscribe();
      const needs = await client.provisioning({ what: What.NEEDS, node: "ace", minRevision: after });
      await client.deleteNeed("web", "port", "after");
      for (const name of needs.needs.map((r) => r.name).filter((n) => n === "stolen")) {
        await client.deleteNeed("web", "port", name); // the next test reads ace's needs
      }
      assert.deepStrictEqual({ heardByNovox: heard, stored: needs.needs.map((r) => r.name) }, { heardByNovox: [], stored: apiPrefix === "" ? ["after", "http"] : ["after", "http", "stolen"] });
      assert.deepStrictEqual(needs.malformed, []);
    });

    it("a provider binds through its bind verb and publishes nothing into its bucket", async () => {
      const node = new ProvisionerClient(ace!, { node: "ace", apiPrefix });
      const provider = new ProvisionerClient(pg!, { provider: "pg" });
      const needAt = await node.putNeed("shop", "bound", "db", { placeholder: "${bound:db}", provider: "pg", provision: "database", local: "main" });
      const offered = (await node.provisioning({ what: What.MANIFESTS, node: "ace" })).manifests.map((r) => r.digest);
      const provisions = await provider.provisionsAll({ provider: "pg", minRevisions: { needs: needAt } });
      assert.deepStrictEqual(provisions.provisions.map((p) => [p.node, p.key]), [["ace", "ace.shop.database.main"]]);

      const bound = await provider.bind("ace.shop.database.main", new TextEncoder().encode("postgres://db"));
      const composed = await node.composeAll({ node: "ace", module: "shop", minRevisions: { needs: needAt, bound: { pg_bound: bound } } });
      assert.deepStrictEqual(composed.provisions.map((p) => [p.key, p.boundRevision, isBound(p), p.manifestDigest]),
        [["ace.shop.database.main", bound, true, offered[0]]]);

      const own = "$KV.pg_bound.ace.shop.database.main";
      pg!.publish(own, new TextEncoder().encode("forged"));
      assert.ok(await refusedSoon("publish", own, pg!, pgViolations), reported(pgViolations));
      const info = "$JS.API.STREAM.INFO.KV_pg_bound";
      pg!.publish(info, Empty);
      assert.ok(await refusedSoon("publish", info, pg!, pgViolations), reported(pgViolations));
      const again = await node.composeAll({ node: "ace", module: "shop" });
      assert.equal(again.provisions[0]?.boundRevision, bound);

      const unbound = await provider.unbind("ace.shop.database.main");
      assert.ok(unbound > bound);
      assert.equal(pgViolations.length, 2, reported(pgViolations));
    });

    it("a node makes no consumer of the plans' stream, even of its own key, nor reads a key a direct get's body names", async () => {
      const stream = `KV_${PLANS_BUCKET}`;
      const own = `$KV.${PLANS_BUCKET}.ace`;
      // Nor the stream's information, whose subjects_filter would list
      // every node's key.
      await assert.rejects(askJS(`${api}.STREAM.INFO.${stream}`, { subjects_filter: ">" }), violation);
      assert.ok(await refusedSoon("publish", `${api}.STREAM.INFO.${stream}`), reported());

      // One consumer a node may make is one more it may make (a durable
      // outlives its connection), until the stream holds no more and every
      // node's watch fails: durable or named, filtered on its own key or not,
      // by today's subject or the older durable one, each is refused.
      const tries: [string, Record<string, unknown>][] = [
        [`${api}.CONSUMER.CREATE.${stream}.greedy.${own}`, { durable_name: "greedy", filter_subject: own, ack_policy: "none" }],
        [`${api}.CONSUMER.CREATE.${stream}.greedy.${own}`, { name: "greedy", filter_subject: own, ack_policy: "none", inactive_threshold: 3_600_000_000_000 }],
        [`${api}.CONSUMER.CREATE.${stream}.greedy`, { durable_name: "greedy", filter_subject: own, ack_policy: "none" }],
        [`${api}.CONSUMER.DURABLE.CREATE.${stream}.greedy`, { durable_name: "greedy", filter_subject: own, ack_policy: "none" }],
        [`${api}.CONSUMER.CREATE.${stream}`, { filter_subject: own, ack_policy: "none" }],
      ];
      for (const [subject, config] of tries) {
        await assert.rejects(askJS(subject, { stream_name: stream, config }), violation, `${subject} ${JSON.stringify(config)}`);
        assert.ok(await refusedSoon("publish", subject), `no permission violation for ${subject}: ${reported()}`);
      }

      // Nor the direct get whose body names the key, novox's or its own.
      for (const node of ["novox", "ace"]) {
        await assert.rejects(askJS(directGet, { last_by_subj: `$KV.${PLANS_BUCKET}.${node}` }), violation, node);
      }
      assert.ok(await refusedSoon("publish", directGet), reported());
    });
  });
}
