// A node's watch of its plan on a nats-server whose authorization is what
// `mesh-provisioner permissions` prints (the Go tool internal/e2e/authnats,
// built by `make test`), with the service as its two identities: ace
// watches its own plan, and nats-server refuses ace's watch of novox's and
// any consumer of the plans' stream, even of ace's own key. Twice: in one
// account, and in the runs-as set-up (authnats -runs-as: the service in its
// account PROVISIONER, the nodes in MESH, which imports the provisioner's
// JetStream API and key writes under RUNS_AS_API_PREFIX).
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
  NeedSchema,
  PLANS_BUCKET,
  ProvisionerClient,
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
  { name: "runs-as: the nodes in an account of their own", authnatsArgs: ["-runs-as"], apiPrefix: RUNS_AS_API_PREFIX },
]) {
  describe(name, () => {
    const children: Program[] = [];
    let stateDir: string | undefined;
    let ace: NatsConnection | undefined;
    /** The permission violations nats-server reported to ace's connection. */
    const violations: PermissionViolationError[] = [];
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
      const aceURL = new URL(urls["ace"]!);
      ace = await connect({ servers: aceURL.host, user: aceURL.username, pass: aceURL.password, inboxPrefix: inboxPrefix("node", "ace"), name: "ace" });
      void (async () => {
        for await (const s of ace!.status()) {
          if (s.type === "error" && s.error instanceof PermissionViolationError) {
            violations.push(s.error);
          }
        }
      })();
    });

    after(async () => {
      await ace?.close();
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

    /** Reports whether nats-server refused ace an operation on subject. */
    const refused = (operation: "publish" | "subscription", subject: string) =>
      violations.some((v) => v.operation === operation && v.subject === subject);
    const reported = () => violations.map((v) => v.message).join("; ");

    /** Asks JetStream's API as ace, and resolves to the JSON answer. */
    const askJS = async (subject: string, body: unknown): Promise<Record<string, unknown>> => {
      const reply = await ace!.request(subject, body === undefined ? Empty : JSON.stringify(body), { timeout: 2000 });
      return reply.json<Record<string, unknown>>();
    };

    /**
     * Puts ace's need through the service's put verb, the only way a node
     * writes (it publishes nothing into JetStream), and resolves to the
     * revision written.
     */
    const putNeed = async (key: string, placeholder: string): Promise<bigint> => {
      const request = create(PutRequestSchema, {
        record: { what: What.NEEDS, key, value: toBinary(NeedSchema, create(NeedSchema, { placeholder })) },
      });
      const reply = await ace!.request("mesh-provisioner.put.ace", toBinary(PutRequestSchema, request), { timeout: 5000 });
      const refusal = errorOf(reply);
      if (refusal !== undefined) {
        throw refusal;
      }
      return fromBinary(WriteResponseSchema, reply.data).revision;
    };

    it("a node watches its own plan under its own permissions, and no other node's", async () => {
      await putNeed("ace.web.port.http", "${port:http}");
      const client = new ProvisionerClient(ace!, { node: "ace", apiPrefix });
      const plans = client.watchPlan("ace");
      const next = async (): Promise<ComposeResponse> => {
        const { value, done } = await plans.next();
        assert.ok(!done && value, "the watch ended");
        return value;
      };
      let first = await next();
      while (first.plans.length === 0) { // asked before the need reached the service's copy
        first = await next();
      }
      const rev = await putNeed("ace.web.port.admin", "${port:admin}");
      const second = await next();
      assert.equal(violations.length, 0, reported());
      await plans.return(undefined);
      assert.ok(second.revisions!.needs >= rev);
      assert.notEqual(second.planDigest, first.planDigest);
      assert.equal(second.plans[0]!.items.length, 2);

      // novox's key: nats-server refuses the subscription to its subject,
      // and no plan comes.
      const theirs = client.watchPlan("novox", { timeout: 1000 });
      await assert.rejects(theirs.next());
      await ace!.flush(); // the violations reported before the flush's answer
      assert.ok(refused("subscription", key(`$KV.${PLANS_BUCKET}.novox`)), reported());

      // A node publishes nothing into JetStream: not a put of its own need,
      // whose acknowledgement it could aim at any key, nor a direct get of
      // its own plan.
      const ownNeed = key("$KV.mesh-provisioner_needs.ace.web.port.http");
      ace!.publish(ownNeed, toBinary(NeedSchema, create(NeedSchema, { placeholder: "${port:http}" })));
      const ownPlan = `${directGet}.$KV.${PLANS_BUCKET}.ace`;
      ace!.publish(ownPlan, Empty);
      await ace!.flush();
      assert.ok(refused("publish", ownNeed), reported());
      assert.ok(refused("publish", ownPlan), reported());
    });

    it("a node makes no consumer of the plans' stream, even of its own key, nor reads a key a direct get's body names", async () => {
      const stream = `KV_${PLANS_BUCKET}`;
      const own = `$KV.${PLANS_BUCKET}.ace`;
      // Nor the stream's information, whose subjects_filter would list
      // every node's key.
      await assert.rejects(askJS(`${api}.STREAM.INFO.${stream}`, { subjects_filter: ">" }), violation);
      await ace!.flush();
      assert.ok(refused("publish", `${api}.STREAM.INFO.${stream}`), reported());

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
        await ace!.flush();
        assert.ok(refused("publish", subject), `no permission violation for ${subject}: ${reported()}`);
      }

      // Nor the direct get whose body names the key, novox's or its own.
      for (const node of ["novox", "ace"]) {
        await assert.rejects(askJS(directGet, { last_by_subj: `$KV.${PLANS_BUCKET}.${node}` }), violation, node);
      }
      await ace!.flush();
      assert.ok(refused("publish", directGet), reported());
    });
  });
}
