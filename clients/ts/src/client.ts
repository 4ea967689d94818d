/**
 * A typed client of the mesh-provisioner NATS micro service, on nats.js v3
 * and protobuf-es. The wire contract is docs/protocol.md in the repository.
 *
 * @module
 */
import { clone, create, fromBinary, fromJson, ScalarType, toBinary, type DescMessage, type JsonValue, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import {
  createInbox,
  Empty,
  errors,
  headers,
  type Msg,
  type MsgHdrs,
  type NatsConnection,
  type QueuedIterator,
  type Status,
  type Subscription,
} from "@nats-io/nats-core";

import {
  ComposeRequestSchema,
  ComposeResponseSchema,
  type ComposeResponse,
  ModulePlanSchema,
  PlanDigestSchema,
  type ModulePlan,
  type PlanDigest,
  type Revisions,
  type PlanItem,
  type Provision,
} from "./gen/mesh/provisioner/v1/compose_pb.js";
import {
  ProvisioningRequestSchema,
  ProvisioningResponseSchema,
  type ProvisioningResponse,
} from "./gen/mesh/provisioner/v1/provisioning_pb.js";
import {
  ProvisionsRequestSchema,
  ProvisionsResponseSchema,
  type ProvisionsResponse,
} from "./gen/mesh/provisioner/v1/provisions_pb.js";
import { What } from "./gen/mesh/provisioner/v1/provisioning_pb.js";
import { AppliedSchema, CollectItemSchema, ManifestSchema, NeedSchema } from "./gen/mesh/provisioner/v1/state_pb.js";
import { EndpointStatsDataSchema, type EndpointStatsData } from "./gen/mesh/provisioner/v1/stats_pb.js";
import {
  ApplyRequestSchema,
  ApplyResponseSchema,
  BindRequestSchema,
  DeclareRequestSchema,
  DeleteRequestSchema,
  PutRequestSchema,
  WriteResponseSchema,
  type ApplyResponse,
} from "./gen/mesh/provisioner/v1/write_pb.js";

/** The micro service's name, as discovery shows it. */
export const SERVICE_NAME = "mesh-provisioner";
/** The name of the endpoint that reads the registry and the state buckets. */
export const PROVISIONING_ENDPOINT = "provisioning";
/** The subject the provisioning endpoint answers. */
export const PROVISIONING_SUBJECT = `${SERVICE_NAME}.${PROVISIONING_ENDPOINT}`;
/** The name of the endpoint that composes a node. */
export const COMPOSE_ENDPOINT = "compose";
/** The subject the compose endpoint answers. */
export const COMPOSE_SUBJECT = `${SERVICE_NAME}.${COMPOSE_ENDPOINT}`;
/**
 * The name of the endpoint that answers the provisioning verb for one node,
 * on {@link nodeSubject}(PROVISIONING_SUBJECT, node).
 */
export const PROVISIONING_NODE_ENDPOINT = `${PROVISIONING_ENDPOINT}-node`;
/**
 * The name of the endpoint that answers the compose verb for one node, on
 * {@link nodeSubject}(COMPOSE_SUBJECT, node).
 */
export const COMPOSE_NODE_ENDPOINT = `${COMPOSE_ENDPOINT}-node`;
/** The name of the endpoint that tells a provider what it must provision. */
export const PROVISIONS_ENDPOINT = "provisions";
/**
 * The provisions verb's subject before the provider's token: a provider asks
 * {@link providerSubject}(provider), `mesh-provisioner.provisions.<provider>`.
 */
export const PROVISIONS_SUBJECT = `${SERVICE_NAME}.${PROVISIONS_ENDPOINT}`;
/** The name of the endpoint that writes one record of a node. */
export const PUT_ENDPOINT = "put";
/** The put verb's subject before the node's token: a node writes on `mesh-provisioner.put.<node>`. */
export const PUT_SUBJECT = `${SERVICE_NAME}.${PUT_ENDPOINT}`;
/** The name of the endpoint that deletes one record of a node. */
export const DELETE_ENDPOINT = "delete";
/** The delete verb's subject before the node's token: `mesh-provisioner.delete.<node>`. */
export const DELETE_SUBJECT = `${SERVICE_NAME}.${DELETE_ENDPOINT}`;
/** The name of the endpoint that replaces the whole set of a module's needs. */
export const APPLY_ENDPOINT = "apply";
/** The apply verb's subject before the node's token: `mesh-provisioner.apply.<node>`. */
export const APPLY_SUBJECT = `${SERVICE_NAME}.${APPLY_ENDPOINT}`;
/** The name of the endpoint that declares the manifest of a provider a node runs. */
export const DECLARE_ENDPOINT = "declare";
/**
 * The declare verb's subject before the node's and the provider's tokens:
 * `mesh-provisioner.declare.<node>.<provider>`.
 */
export const DECLARE_SUBJECT = `${SERVICE_NAME}.${DECLARE_ENDPOINT}`;
/** The name of the endpoint that writes a provider's bucket `<provider>_bound`. */
export const BIND_ENDPOINT = "bind";
/** The bind verb's subject before the provider's token: `mesh-provisioner.bind.<provider>`. */
export const BIND_SUBJECT = `${SERVICE_NAME}.${BIND_ENDPOINT}`;

/**
 * The bucket where the seat's holder keeps each node's plan digest: key
 * `<node>`, value a {@link PlanDigest}. {@link ProvisionerClient.watchPlan}
 * hears the writes of a node's key (it reads nothing of the bucket).
 */
export const PLANS_BUCKET = `${SERVICE_NAME}_plans`;
/** The Content-Type of a protobuf binary request and answer. */
export const CONTENT_TYPE_PROTOBUF = "application/protobuf";

/**
 * Returns a verb's node-addressed subject: `nodeSubject(COMPOSE_SUBJECT,
 * "ace")` is `"mesh-provisioner.compose.ace"`. A node's permissions grant its
 * own, and the service answers there only what is the node's (and the
 * registry); it refuses the rest with a 403.
 */
export function nodeSubject(verbSubject: string, node: string): string {
  return `${verbSubject}.${node}`;
}

/** Returns the provisions verb's subject of a provider: `mesh-provisioner.provisions.<provider>`. */
export function providerSubject(provider: string): string {
  return `${PROVISIONS_SUBJECT}.${provider}`;
}

/**
 * Whether byte b may stand in a key's token as itself (A-Z a-z 0-9 - _ /,
 * and `=` unless escaped: in an escaped token `=` starts an escape), as the
 * Go keys package says.
 */
function tokenByte(b: number, escaped: boolean): boolean {
  return (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || (b >= 0x30 && b <= 0x39) ||
    b === 0x2d || b === 0x5f || b === 0x2f || (b === 0x3d && !escaped);
}

/**
 * Returns the token that stands for a need's or a collection's readable
 * name in a key, as the Go keys.Escape writes it: every byte of the name's
 * UTF-8 outside A-Z a-z 0-9 - _ / (so also `.`, `:` and `=`) is written `=`
 * and two upper-case hex digits. `escapeName("zsh:normal")` is
 * `"zsh=3Anormal"`.
 */
export function escapeName(name: string): string {
  let token = "";
  for (const b of new TextEncoder().encode(name)) {
    token += tokenByte(b, true) ? String.fromCharCode(b) : `=${b.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return token;
}

/**
 * Joins the parts of a key, each checked as the Go keys.CheckToken does: not
 * empty, and only A-Z a-z 0-9 - _ = /.
 *
 * @throws {TypeError} naming the first part that is not a token.
 */
function keyOf(parts: [name: string, value: string][]): string {
  for (const [name, value] of parts) {
    const bad = [...new TextEncoder().encode(value)].findIndex((b) => !tokenByte(b, false));
    if (value === "" || bad >= 0) {
      throw new TypeError(`invalid key part: ${name} ${JSON.stringify(value)} ${value === "" ? "is empty" : `holds a byte it may not at byte ${bad}`}; a token holds only A-Z a-z 0-9 - _ = /`);
    }
  }
  return parts.map(([, value]) => value).join(".");
}

/**
 * Returns the key of a need in the needs bucket, as the Go keys.NeedKey
 * builds it: `<node>.<module>.<kind>.<name>`, the name (the placeholder's
 * readable name, `"zsh:normal"` of `${shell:zsh:normal}`) escaped by
 * {@link escapeName}.
 *
 * @throws {TypeError} when the name is empty or another part is not a token
 *   (empty, or holding a byte other than A-Z a-z 0-9 - _ = /).
 */
export function needKey(node: string, module: string, kind: string, name: string): string {
  if (name === "") {
    throw new TypeError("invalid key part: name is empty");
  }
  return keyOf([["node", node], ["module", module], ["kind", kind], ["name", escapeName(name)]]);
}

/**
 * Returns the key of a module's applied record: `<node>.<module>`.
 *
 * @throws {TypeError} when a part is not a token.
 */
export function appliedKey(node: string, module: string): string {
  return keyOf([["node", node], ["module", module]]);
}

/**
 * Returns the key of a contributor's item of a collection:
 * `<node>.<collection>.<contributor>`, the collection's readable name
 * escaped by {@link escapeName}.
 *
 * @throws {TypeError} when the collection is empty or another part is not a
 *   token.
 */
export function collectKey(node: string, collection: string, contributor: string): string {
  if (collection === "") {
    throw new TypeError("invalid key part: collection is empty");
  }
  return keyOf([["node", node], ["collection", escapeName(collection)], ["contributor", contributor]]);
}

/**
 * Returns the key of a node's manifest of a provider it runs:
 * `<node>.<provider>`.
 *
 * @throws {TypeError} when a part is not a token.
 */
export function manifestKey(node: string, provider: string): string {
  return keyOf([["node", node], ["provider", provider]]);
}

/**
 * Orders a map's keys (an object's keys, so strings) as Go's deterministic
 * encoding does: by their bytes when the map's keys are strings, by value
 * when they are numbers, false before true.
 */
function compareMapKeys(keyType: ScalarType): (a: string, b: string) => number {
  if (keyType === ScalarType.STRING) {
    return (a, b) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
  }
  if (keyType === ScalarType.BOOL) {
    return (a, b) => Number(a === "true") - Number(b === "true");
  }
  return (a, b) => {
    const [x, y] = [BigInt(a), BigInt(b)];
    return x < y ? -1 : x > y ? 1 : 0;
  };
}

/**
 * Makes message's maps, and those of the messages it holds, list their keys
 * in order: a view whose own keys come sorted (a plain object lists
 * integer-like keys first, whatever the order they were set in).
 */
function sortMaps(schema: DescMessage, message: Record<string, unknown>): void {
  for (const field of schema.fields) {
    let value: unknown;
    if (field.oneof !== undefined) {
      const oneof = message[field.oneof.localName] as { case?: string; value?: unknown };
      value = oneof.case === field.localName ? oneof.value : undefined;
    } else {
      value = message[field.localName];
    }
    if (value === undefined || value === null) {
      continue;
    }
    switch (field.fieldKind) {
      case "message":
        sortMaps(field.message, value as Record<string, unknown>);
        break;
      case "list":
        if (field.listKind === "message") {
          for (const m of value as Record<string, unknown>[]) {
            sortMaps(field.message, m);
          }
        }
        break;
      case "map": {
        const record = value as Record<string, unknown>;
        if (field.mapKind === "message") {
          for (const m of Object.values(record)) {
            sortMaps(field.message, m as Record<string, unknown>);
          }
        }
        const keys = Object.keys(record).sort(compareMapKeys(field.mapKey));
        message[field.localName] = new Proxy(record, { ownKeys: () => keys });
        break;
      }
    }
  }
}

/**
 * Encodes a record's value in protobuf binary, deterministically as Go's
 * `proto.MarshalOptions{Deterministic: true}` does (fields by number, map
 * entries by key): the same record is the same bytes, which an apply finds
 * unchanged and a manifest's digest names. The message given is left as it
 * is.
 */
export function encodeDeterministic<Desc extends DescMessage>(schema: Desc, value: MessageInitShape<Desc>): Uint8Array {
  const message = clone(schema, create(schema, value));
  sortMaps(schema, message as unknown as Record<string, unknown>);
  return toBinary(schema, message);
}

/**
 * Returns the declare verb's subject of a node's manifest of a provider it
 * runs: `mesh-provisioner.declare.<node>.<provider>`.
 */
export function declareSubject(node: string, provider: string): string {
  return `${DECLARE_SUBJECT}.${node}.${provider}`;
}

/** Returns the bind verb's subject of a provider: `mesh-provisioner.bind.<provider>`. */
export function bindSubject(provider: string): string {
  return `${BIND_SUBJECT}.${provider}`;
}

/** Starts every inbox prefix of the mesh's identities; not nats.js's default `_INBOX`, which no generated permission set grants. */
export const INBOX_ROOT = "_INBOX_MESH";

/**
 * What an identity on the mesh is: its inbox prefix and its permissions
 * follow from it (`mesh-provisioner permissions --node`, `--provider`,
 * `--operator`).
 */
export type Role = "node" | "provider" | "operator";

/**
 * The most bytes a name may take: a node's, a provider's, or any other a
 * request gives (the Go keys.MaxNameLen); the service refuses a longer one.
 */
const MAX_NAME_LEN = 256;
/** The most characters of a name an error echoes (the Go keys.MaxEchoed). */
const MAX_ECHOED = 64;

/** Returns name as an error echoes it: its first 64 characters and "…" when longer (the Go keys.Echo). */
function echo(name: string): string {
  const chars = [...name];
  return chars.length > MAX_ECHOED ? `${chars.slice(0, MAX_ECHOED).join("")}…` : name;
}

/**
 * Returns why name cannot be the name of a node, a provider or any identity
 * of the mesh, or undefined when it can: it must be a key's token (not
 * empty, and only the bytes A-Z a-z 0-9 - _ = /) of at most 256 bytes, the
 * rule of docs/protocol.md ("Buckets and keys") that the Go keys.NodeFilter
 * checks and the service holds every name to.
 */
function nameError(name: string): string | undefined {
  const bytes = new TextEncoder().encode(name);
  if (bytes.length > MAX_NAME_LEN) {
    return `is ${bytes.length} bytes, more than the ${MAX_NAME_LEN} a name may take: shorten it`;
  }
  if (bytes.length === 0) {
    return "is empty";
  }
  const bad = bytes.findIndex((b) => !tokenByte(b, false));
  if (bad >= 0) {
    const b = bytes[bad]!;
    const shown = b > 0x20 && b < 0x7f ? JSON.stringify(String.fromCharCode(b)) : `byte 0x${b.toString(16).padStart(2, "0")}`;
    return `holds ${shown} at byte ${bad}; a token holds only A-Z a-z 0-9 - _ = /`;
  }
  return undefined;
}

/**
 * Throws a TypeError, starting with where, when name cannot be the name of
 * what ("node", "provider", "a node's name"...): see {@link nameError}.
 */
function checkName(where: string, what: string, name: string): void {
  const why = nameError(name);
  if (why !== undefined) {
    throw new TypeError(`${where}: ${what} ${JSON.stringify(echo(name))} ${why}`);
  }
}

/**
 * Returns the inbox prefix of a mesh identity, `_INBOX_MESH.<role>.<name>`:
 * the one its permissions let it subscribe to. Give it to nats.js when you
 * connect, or no answer can reach you:
 *
 * ```ts
 * const nc = await connect({ servers, inboxPrefix: inboxPrefix("node", "ace"), ...credentials });
 * ```
 *
 * The service answers a request on a node's (or provider's) own subject only
 * to that identity's inbox (or an operator's, or nats.js's default
 * `_INBOX`): a node asking with another node's prefix gets no answer.
 *
 * @throws {TypeError} if name is not an identity's name: a key's token (not
 *   empty, only A-Z a-z 0-9 - _ = /) of at most 256 bytes, as the
 *   permissions (`mesh-provisioner permissions`) and the service hold it.
 */
export function inboxPrefix(role: Role, name: string): string {
  checkName("inboxPrefix", `a ${role}'s name`, name);
  return `${INBOX_ROOT}.${role}.${name}`;
}

/** The NATS service API headers of a refused request. */
const ERROR_HEADER = "Nats-Service-Error";
const ERROR_CODE_HEADER = "Nats-Service-Error-Code";

/**
 * ProvisionerError is a request the service refused: its numeric code (400
 * bad request, 403 forbidden, 413 too large, 503 not ready, 500 internal)
 * and its sentence, from the Nats-Service-Error-Code and Nats-Service-Error
 * headers.
 */
export class ProvisionerError extends Error {
  /**
   * The code: 400 bad request (do not retry as is); 403 forbidden: a request
   * on a node's (or provider's) own subject asked for what is not that
   * node's (another node's records or plan, or every node's, or a write of
   * another node's key); 413 too large: a write's value over the bucket's
   * largest, or over the node's budget of keys or bytes; 503 not ready: the
   * server's copy is loading, did not reach the revisions asked for in time,
   * or the server is stopping (ask again shortly); 500 internal, such as an
   * answer too large for NATS (narrow the request); 0 if the reply's code is
   * not a number.
   */
  readonly code: number;
  /** The service's sentence: what is wrong and what to do. */
  readonly description: string;

  constructor(code: number, description: string) {
    super(`${SERVICE_NAME}: ${code}: ${description}`);
    this.name = "ProvisionerError";
    this.code = code;
    this.description = description;
  }
}

/** Options of a {@link ProvisionerClient}. */
export interface ProvisionerClientOptions {
  /**
   * The provisioning verb's subject, for a service behind a subject mapping
   * or an account import. Default {@link PROVISIONING_SUBJECT}.
   */
  subject?: string;
  /**
   * The compose verb's subject, for a service behind a subject mapping or an
   * account import. Default {@link COMPOSE_SUBJECT}.
   */
  composeSubject?: string;
  /**
   * The provisions verb's subject before the provider's token, for a
   * service behind a subject mapping or an account import. Default
   * {@link PROVISIONS_SUBJECT}.
   */
  provisionsSubject?: string;
  /**
   * Ask as this node: provisioning and compose go to the node's own
   * subjects, `mesh-provisioner.provisioning.<node>` and
   * `mesh-provisioner.compose.<node>`, which is all a node's permissions
   * grant. The service answers there only the node's own records, its own
   * composition and the registry, and refuses the rest with a
   * {@link ProvisionerError} of code 403: requests still name the node
   * (`{ what: What.NEEDS, node: "ace" }`, `{ node: "ace" }`). Connect with
   * the node's {@link inboxPrefix}. Unset (an operator), the unscoped
   * subjects.
   */
  node?: string;
  /**
   * Write as this provider: {@link ProvisionerClient.bind} and
   * {@link ProvisionerClient.unbind} go to `mesh-provisioner.bind.<provider>`,
   * which is all of the write verbs a provider's permissions grant. Connect
   * with the provider's {@link inboxPrefix}.
   */
  provider?: string;
  /**
   * Milliseconds to wait for the answer of every verb this client asks,
   * reads and writes alike; a call's own `timeout` takes precedence. Unset,
   * a read waits {@link DEFAULT_READ_TIMEOUT} (10 000: more than the time a
   * server waits for the revisions a request asks for, 5 s by default, its
   * --revision-wait, so that its 503 arrives before the client gives up)
   * and a write {@link DEFAULT_WRITE_TIMEOUT} (5 000), as the Go client's.
   * It does not bound {@link ProvisionerClient.watchPlan}'s compositions
   * ({@link WATCH_COMPOSE_TIMEOUT}).
   */
  timeout?: number;
  /**
   * Where the provisioner's JetStream is reached: `RUNS_AS_API_PREFIX`
   * (`"$PROVISIONER.API"`) when the server runs in an account of its own
   * and each node's account imports its plan key under that prefix.
   * {@link ProvisionerClient.watchPlan} then subscribes to
   * `<apiPrefix>.$KV.mesh-provisioner_plans.<node>`, where the provisioner's
   * account exports the key's writes; the verbs, writes included, are
   * imported at their own subjects. Empty or unset, the connection's own
   * account.
   */
  apiPrefix?: string;
}

/** Options of one call of a verb. */
export interface RequestOptions {
  /**
   * Milliseconds to wait for the answer: by default the client's timeout,
   * else {@link DEFAULT_READ_TIMEOUT} for a read and
   * {@link DEFAULT_WRITE_TIMEOUT} for a write.
   */
  timeout?: number;
}

/**
 * One need of a module's whole set ({@link ProvisionerClient.applyNeeds}):
 * the placeholder `${kind:name}` and what the module needs for it.
 */
export interface ModuleNeed {
  /** The placeholder's kind: `port` of `${port:http}`. */
  kind: string;
  /** The placeholder's readable name, escaped in the key: `zsh:normal` of `${shell:zsh:normal}`. */
  name: string;
  /** What the module needs. */
  need: MessageInitShape<typeof NeedSchema>;
}

/** Where {@link ProvisionerClient.putManifest} stored a manifest. */
export interface DeclaredManifest {
  /**
   * `"sha256:<hex>"` of the manifest's bytes as stored: what compositions
   * name in `Provision.manifestDigest`.
   */
  digest: string;
  /** The revision of the manifests bucket it was written at. */
  revision: bigint;
}

/** Options of {@link ProvisionerClient.watchPlan}. */
export interface WatchPlanOptions extends RequestOptions {
  /** Stops the watch: the iteration ends, and the subscription to the node's key with it. */
  signal?: AbortSignal;
  /**
   * Milliseconds one composition the watch asks may take, every page of it,
   * before it is asked again: {@link WATCH_COMPOSE_TIMEOUT} (30 000) by
   * default, whatever the client's own timeout.
   */
  timeout?: number;
}

/**
 * WatchStoppedError ends {@link ProvisionerClient.watchPlan} when the
 * connection closes before the watch is stopped.
 */
export class WatchStoppedError extends Error {
  /** The node whose plan was watched. */
  readonly node: string;

  constructor(node: string) {
    super(`${SERVICE_NAME}: the watch of ${node}'s plan (key ${node} of ${PLANS_BUCKET}) stopped: the connection closed`);
    this.name = "WatchStoppedError";
    this.node = node;
  }
}

// How long the client waits, in milliseconds, each the Go client's
// (conformance/clients/timeouts.json holds the three clients to them).

/**
 * Milliseconds a read (provisioning, compose, provisions) waits for its
 * answer when neither the call nor the client sets a `timeout`: more than
 * the time a server waits for the revisions a request asks for (5 s by
 * default, its --revision-wait), so that its 503 arrives before the client
 * gives up. The Go client's reads take their bound from their context.
 */
export const DEFAULT_READ_TIMEOUT = 10_000;
/**
 * Milliseconds a write (a node's put, delete, apply, declare; a provider's
 * bind) waits for its answer when neither the call nor the client sets a
 * `timeout`: the Go nodeclient.DefaultTimeout.
 */
export const DEFAULT_WRITE_TIMEOUT = 5_000;
/**
 * Milliseconds one composition that {@link ProvisionerClient.watchPlan}
 * asks may take, every page of it, unless its `timeout` option says
 * otherwise: one lost with its connection, or with the instance that took
 * it, is asked again, not waited for as long as the watch lasts. The Go
 * client's watchComposeTimeout.
 */
export const WATCH_COMPOSE_TIMEOUT = 30_000;
/**
 * Milliseconds {@link ProvisionerClient.watchPlan} waits for its
 * subscription to be in place at the NATS server (the round trip of a
 * flush) before its first composition. The Go client's watchFlushTimeout.
 */
export const WATCH_FLUSH_TIMEOUT = 5_000;
/**
 * Milliseconds {@link ProvisionerClient.watchPlan} pauses first before it
 * asks a composition again, after a 503 or no answer; each pause doubles
 * the one before, up to {@link WATCH_RETRY_MAX} (docs/protocol.md: "backing
 * off from 100 ms to 2 s"). The Go client's watchRetryMin.
 */
export const WATCH_RETRY_MIN = 100;
/** The longest pause of {@link ProvisionerClient.watchPlan} between two asks of a composition, in milliseconds. The Go client's watchRetryMax. */
export const WATCH_RETRY_MAX = 2_000;

/**
 * Reports whether a request got no answer, and may get one if asked again:
 * no instance served its subject (one starting, or the node up before the
 * service), or it timed out (lost with its connection, or with the instance
 * that took it). nats.js rejects the first with a RequestError caused by a
 * NoRespondersError, the second with a TimeoutError; a request made while
 * the connection is lost is sent once reconnected, or times out.
 */
function unanswered(err: unknown): boolean {
  const cause = err instanceof errors.RequestError ? err.cause : undefined;
  return [err, cause].some((e) => e instanceof errors.NoRespondersError || e instanceof errors.TimeoutError);
}

/** Resolves to true after ms, or to false as soon as signal aborts. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve(false);
      return;
    }
    const done = (slept: boolean) => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", aborted);
      resolve(slept);
    };
    const aborted = () => done(false);
    const timer = setTimeout(() => done(true), ms);
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

/**
 * Settles as promise does, or rejects with nats.js's TimeoutError once ms
 * have passed (the promise's outcome is then ignored).
 */
function within<T>(promise: Promise<T>, ms: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      promise.catch(() => {});
      reject(new errors.TimeoutError());
    }, ms);
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}

/**
 * Resolves as promise does, or to undefined as soon as signal aborts (the
 * promise's outcome is then ignored).
 */
function abortable<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T | undefined> {
  if (signal === undefined) {
    return promise;
  }
  if (signal.aborted) {
    promise.catch(() => {});
    return Promise.resolve(undefined);
  }
  return new Promise((resolve, reject) => {
    const aborted = () => {
      promise.catch(() => {});
      resolve(undefined);
    };
    signal.addEventListener("abort", aborted, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", aborted);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener("abort", aborted);
        reject(err);
      },
    );
  });
}

/** Returns the subject of a key of a KV bucket, `$KV.<bucket>.<key>`: each write of the key is a message there. */
function kvSubject(bucket: string, key: string): string {
  return `$KV.${bucket}.${key}`;
}

/**
 * Reports whether a KV message's headers say it removes its key: a delete
 * or purge marker, written by a client (KV-Operation) or by the server (a
 * marker's reason).
 */
function removesKey(h: MsgHdrs | undefined): boolean {
  const operation = h?.get("KV-Operation");
  const reason = h?.get("Nats-Marker-Reason");
  return operation === "DEL" || operation === "PURGE" || reason === "MaxAge" || reason === "Purge" || reason === "Remove";
}

/** Decodes a record of the plans bucket, or undefined for one that is not a digest: the next write will be. */
function decodePlanDigest(value: Uint8Array): PlanDigest | undefined {
  try {
    const digest = fromBinary(PlanDigestSchema, value);
    return digest.digest === "" ? undefined : digest;
  } catch {
    return undefined;
  }
}

/**
 * Reports whether msg is a write of the key whose subject is subject, as the
 * stream publishes it: not an answer of JetStream's aimed there (a direct
 * get's carries Nats-Stream; a publish's acknowledgement is JSON that
 * decodes as no digest), nor a message of another key's (another
 * Nats-Subject). A reply subject does not tell: the writer's own write
 * carries one, where JetStream acknowledges it.
 */
function ownWrite(msg: Msg, subject: string): boolean {
  if (msg.subject !== subject) {
    return false;
  }
  const h = msg.headers;
  if (h === undefined) {
    return true;
  }
  if (h.get("Nats-Stream") !== "") {
    return false;
  }
  const other = h.get("Nats-Subject");
  return other === "" || other === subject;
}

/**
 * PlanWatch is what {@link ProvisionerClient.watchPlan} hears of a node's
 * key of the plans bucket, from its subscription to the key's subject and
 * the connection's events: the writes of the key, the latest kept (a burst
 * of writes is one change to compose), the reconnects, the close, and a
 * refusal of the subscription.
 */
class PlanWatch {
  readonly #sub: Subscription;
  readonly #status: AsyncIterable<Status>;
  /** The last write heard and not taken yet. */
  #heard: Msg | undefined;
  #reconnected = false;
  #closed = false;
  #stopped = false;
  #refused: Error | undefined;
  /** Wakes the one waiting in next(). */
  #wake: (() => void) | undefined;

  /**
   * Subscribes to node's key, under apiPrefix when the bucket is another
   * account's (its writes imported there); the caller flushes, so that the
   * server has the subscription before the first composition.
   */
  constructor(nc: NatsConnection, node: string, apiPrefix: string) {
    const key = kvSubject(PLANS_BUCKET, node);
    const subject = apiPrefix === "" ? key : `${apiPrefix}.${key}`;
    this.#sub = nc.subscribe(subject, {
      callback: (err, msg) => {
        if (err !== null) {
          this.#refused = err;
        } else if (ownWrite(msg, subject)) {
          this.#heard = msg;
        } else {
          return;
        }
        this.#wake?.();
      },
    });
    // Right after the subscription, before any event: no reconnect is missed.
    this.#status = nc.status();
    void this.#listen();
  }

  /** The error nats-server refused the subscription with (a PermissionViolationError), if it did. */
  get refused(): Error | undefined {
    return this.#refused;
  }

  /** Whether the connection closed. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Follows the connection's events until it closes or the watch stops. */
  async #listen(): Promise<void> {
    try {
      for await (const status of this.#status) {
        if (this.#stopped || status.type === "close") {
          break;
        }
        if (status.type === "reconnect") {
          this.#reconnected = true;
          this.#wake?.();
        }
      }
    } catch {
      // the events ended with the connection
    }
    if (!this.#stopped) {
      this.#closed = true;
      this.#wake?.();
    }
  }

  /**
   * Resolves to what was heard since the last call, waiting for it if
   * nothing was: "closed" once the connection closed, else "reconnected"
   * after a reconnect, else the last write heard; undefined as soon as
   * signal aborts or the watch stops.
   *
   * @throws the error nats-server refused the subscription with.
   */
  async next(signal: AbortSignal | undefined): Promise<Msg | "reconnected" | "closed" | undefined> {
    for (;;) {
      if (signal?.aborted || this.#stopped) {
        return undefined;
      }
      if (this.#refused !== undefined) {
        throw this.#refused;
      }
      if (this.#closed) {
        return "closed";
      }
      if (this.#reconnected) {
        this.#reconnected = false;
        return "reconnected";
      }
      const heard = this.#heard;
      if (heard !== undefined) {
        this.#heard = undefined;
        return heard;
      }
      await new Promise<void>((resolve) => {
        const woken = () => {
          this.#wake = undefined;
          signal?.removeEventListener("abort", woken);
          resolve();
        };
        this.#wake = woken;
        signal?.addEventListener("abort", woken, { once: true });
      });
    }
  }

  /** Ends the subscription and stops following the connection's events; a pending next() resolves to undefined. */
  stop(): void {
    if (this.#stopped) {
      return;
    }
    this.#stopped = true;
    if (!this.#sub.isClosed()) {
      this.#sub.unsubscribe();
    }
    // nats.js's status iterator is a QueuedIterator: stopped, its pending
    // next() ends at once and the connection forgets it. Otherwise #listen
    // ends at the next event.
    const status = this.#status as Partial<QueuedIterator<Status>>;
    status.stop?.();
    this.#wake?.();
  }
}

/** Options of a discovery call. */
export interface DiscoveryOptions {
  /** Ask only the instance with this id. */
  id?: string;
  /**
   * Milliseconds to wait for the first instance to answer. Once one has,
   * discovery ends when no other answers within 300 ms. Default 2000.
   */
  maxWait?: number;
}

/** What every discovery answer says of the instance that sent it. */
export interface ServiceIdentity {
  /** The service's name: {@link SERVICE_NAME}. */
  name: string;
  /** The instance's id, unique to each running server. */
  id: string;
  /** The server's semantic version. */
  version: string;
  /** The service's metadata. */
  metadata: Record<string, string> | null;
}

/** An answer to $SRV.PING. */
export interface PingResponse extends ServiceIdentity {
  type: "io.nats.micro.v1.ping_response";
}

/** An endpoint as $SRV.INFO describes it. */
export interface EndpointInfo {
  name: string;
  subject: string;
  queue_group: string;
  /**
   * `request` and `response`, the full names of the endpoint's protobuf
   * messages, and `content_types`, the encodings it reads.
   */
  metadata: Record<string, string> | null;
}

/** An answer to $SRV.INFO. */
export interface InfoResponse extends ServiceIdentity {
  type: "io.nats.micro.v1.info_response";
  description: string;
  endpoints: EndpointInfo[];
}

/** An endpoint as $SRV.STATS counts it. */
export interface EndpointStats {
  name: string;
  subject: string;
  queue_group: string;
  /** Requests the endpoint took. */
  num_requests: number;
  /**
   * Requests it refused with a coded error before taking them in: 400s, and
   * 503s while loading or stopping. See {@link EndpointStatsData.answerErrors}.
   */
  num_errors: number;
  /** The last of those errors, as `"<code>:<sentence>"`. */
  last_error: string;
  /** Nanoseconds spent in the endpoint's handler, in total. */
  processing_time: number;
  /** Nanoseconds spent in the endpoint's handler, per request. */
  average_processing_time: number;
  /**
   * The service's own counts of the endpoint and the state of the
   * instance's copy: the JSON `data` decoded as an {@link EndpointStatsData},
   * skipping fields the message does not define (a newer instance's).
   */
  data?: EndpointStatsData;
}

/** An answer to $SRV.STATS. */
export interface StatsResponse extends ServiceIdentity {
  type: "io.nats.micro.v1.stats_response";
  /** When the instance started, as an RFC 3339 timestamp. */
  started: string;
  endpoints: EndpointStats[];
}

/**
 * ProvisionerClient asks the mesh-provisioner service over a connection the
 * caller opened (with its credentials) and owns.
 *
 * ```ts
 * const nc = await connect({ servers, inboxPrefix: inboxPrefix("node", "ace") });
 * const client = new ProvisionerClient(nc, { node: "ace" });
 * const needs = await client.provisioning({ what: What.NEEDS, node: "ace" });
 * const plan = await client.compose({ node: "ace", minRevisions: { needs: revision } });
 * ```
 */
export class ProvisionerClient {
  readonly #nc: NatsConnection;
  readonly #subject: string;
  readonly #composeSubject: string;
  readonly #provisionsSubject: string;
  readonly #node: string | undefined;
  readonly #provider: string | undefined;
  readonly #timeout: number | undefined;
  readonly #apiPrefix: string;
  /**
   * By module, the revision of the last write of its needs this client was
   * answered: an apply names it (`minRevision`), and the service compares
   * the set with its copy once the copy holds it, rather than first asking
   * the bucket.
   */
  readonly #written = new Map<string, bigint>();

  constructor(nc: NatsConnection, opts: ProvisionerClientOptions = {}) {
    if (opts.node !== undefined) {
      checkName("ProvisionerClient", "node", opts.node);
    }
    if (opts.provider !== undefined) {
      checkName("ProvisionerClient", "provider", opts.provider);
    }
    this.#nc = nc;
    this.#node = opts.node;
    this.#provider = opts.provider;
    this.#subject = this.#addressed(opts.subject ?? PROVISIONING_SUBJECT);
    this.#composeSubject = this.#addressed(opts.composeSubject ?? COMPOSE_SUBJECT);
    this.#provisionsSubject = opts.provisionsSubject ?? PROVISIONS_SUBJECT;
    this.#timeout = opts.timeout;
    this.#apiPrefix = opts.apiPrefix ?? "";
  }

  /** The node the client asks as (the {@link ProvisionerClientOptions.node} option), or undefined. */
  get node(): string | undefined {
    return this.#node;
  }

  /** The provider the client binds as (the {@link ProvisionerClientOptions.provider} option), or undefined. */
  get provider(): string | undefined {
    return this.#provider;
  }

  /** The subject the client asks the provisioning verb on: the node's own with the `node` option. */
  get subject(): string {
    return this.#subject;
  }

  /** The subject the client asks the compose verb on: the node's own with the `node` option. */
  get composeSubject(): string {
    return this.#composeSubject;
  }

  /**
   * The identity a read verb asks as: the node, with the `node` option,
   * whose own subjects it asks and whose inbox it is answered on; none, on
   * the verbs' bare subjects.
   */
  #asNode(): [role: Role, name: string] | undefined {
    return this.#node === undefined ? undefined : ["node", this.#node];
  }

  /** A verb's subject as this client asks it: the node's own with the `node` option. */
  #addressed(subject: string): string {
    return this.#node === undefined ? subject : nodeSubject(subject, this.#node);
  }

  /**
   * Asks the provisioning verb, in protobuf binary, and returns its decoded
   * answer. An empty request asks for the registry.
   *
   * @throws {ProvisionerError} when the service refuses the request.
   * @throws the nats.js error of the request otherwise, such as a
   *   RequestError when no instance runs or a TimeoutError.
   */
  provisioning(
    request: MessageInitShape<typeof ProvisioningRequestSchema> = {},
    opts: RequestOptions = {},
  ): Promise<ProvisioningResponse> {
    return this.#call(this.#subject, ProvisioningRequestSchema, ProvisioningResponseSchema, request, opts, this.#asNode());
  }

  /**
   * Asks the compose verb, in protobuf binary, for the composition of a node
   * (or of one module on it), and returns its decoded answer. `node` is
   * required.
   *
   * To read your writes, `minRevisions` names a revision per bucket
   * (`registry`, `needs`, `applied`, `collect`, `manifests`) and, in
   * `bound`, per provider's bucket: `{ bound: { postgres_bound: 7n } }`
   * once the provider bound a key at revision 7. The answer's `revisions`
   * says the same of the copy it read. A module of builds answers its plan
   * at each: {@link planAt}; a provision's state: {@link isBound}, and those not bound yet: {@link pending}.
   *
   * @throws {ProvisionerError} when the service refuses the request.
   * @throws the nats.js error of the request otherwise, such as a
   *   RequestError when no instance runs or a TimeoutError.
   */
  compose(
    request: MessageInitShape<typeof ComposeRequestSchema>,
    opts: RequestOptions = {},
  ): Promise<ComposeResponse> {
    return this.#call(this.#composeSubject, ComposeRequestSchema, ComposeResponseSchema, request, opts, this.#asNode());
  }

  /**
   * Asks the provisions verb of a provider, on
   * `mesh-provisioner.provisions.<provider>` (the request's `provider`,
   * required), for one page of what the provider must provision across the
   * mesh: every provision that any node's bound needs ask of it, in key
   * order, each with its node.
   *
   * @throws {TypeError} when the request names no provider: the provider is
   *   the subject asked.
   * @throws {ProvisionerError} when the service refuses the request.
   * @throws the nats.js error of the request otherwise.
   */
  provisions(
    request: MessageInitShape<typeof ProvisionsRequestSchema>,
    opts: RequestOptions = {},
  ): Promise<ProvisionsResponse> {
    const provider = request.provider ?? "";
    if (provider === "") {
      return Promise.reject(new TypeError("provisions: the request's provider is required: it names the subject asked"));
    }
    return this.#call(`${this.#provisionsSubject}.${provider}`, ProvisionsRequestSchema, ProvisionsResponseSchema, request, opts, ["provider", provider]);
  }

  /**
   * Yields every page of a provider's provisions, asking with each page's
   * next_page_token until a page has none.
   */
  async *provisionsPages(
    request: MessageInitShape<typeof ProvisionsRequestSchema>,
    opts: RequestOptions = {},
  ): AsyncGenerator<ProvisionsResponse> {
    const next = create(ProvisionsRequestSchema, request);
    for (;;) {
      const page = await this.provisions(next, opts);
      yield page;
      if (page.nextPageToken === "") {
        return;
      }
      next.pageToken = page.nextPageToken;
    }
  }

  /** Returns every provision of a provider, its pages joined (see {@link joinProvisionsPages}). */
  async provisionsAll(
    request: MessageInitShape<typeof ProvisionsRequestSchema>,
    opts: RequestOptions = {},
  ): Promise<ProvisionsResponse> {
    const pages: ProvisionsResponse[] = [];
    for await (const page of this.provisionsPages(request, opts)) {
      pages.push(page);
    }
    return joinProvisionsPages(pages);
  }

  /**
   * Yields every page of a provisioning answer, asking with each page's
   * next_page_token until a page has none.
   */
  async *provisioningPages(
    request: MessageInitShape<typeof ProvisioningRequestSchema> = {},
    opts: RequestOptions = {},
  ): AsyncGenerator<ProvisioningResponse> {
    const next = create(ProvisioningRequestSchema, request);
    for (;;) {
      const page = await this.provisioning(next, opts);
      yield page;
      if (page.nextPageToken === "") {
        return;
      }
      next.pageToken = page.nextPageToken;
    }
  }

  /**
   * Yields every page of a composition. A module's plan may continue on the
   * next page: {@link composeAll} joins them.
   */
  async *composePages(
    request: MessageInitShape<typeof ComposeRequestSchema>,
    opts: RequestOptions = {},
  ): AsyncGenerator<ComposeResponse> {
    const next = create(ComposeRequestSchema, request);
    for (;;) {
      const page = await this.compose(next, opts);
      yield page;
      if (page.nextPageToken === "") {
        return;
      }
      next.pageToken = page.nextPageToken;
    }
  }

  /** Returns the whole provisioning answer, its pages joined in order. */
  async provisioningAll(
    request: MessageInitShape<typeof ProvisioningRequestSchema> = {},
    opts: RequestOptions = {},
  ): Promise<ProvisioningResponse> {
    const pages: ProvisioningResponse[] = [];
    for await (const page of this.provisioningPages(request, opts)) {
      pages.push(page);
    }
    return joinProvisioningPages(pages);
  }

  /** Returns the whole composition, its pages joined (see {@link joinComposePages}). */
  async composeAll(
    request: MessageInitShape<typeof ComposeRequestSchema>,
    opts: RequestOptions = {},
  ): Promise<ComposeResponse> {
    const pages: ComposeResponse[] = [];
    for await (const page of this.composePages(request, opts)) {
      pages.push(page);
    }
    return joinComposePages(pages);
  }

  /**
   * Returns the whole composition, its pages joined, every page asked within
   * ms of the first ask: the watch's bound on one composition, which spans
   * its pages as the Go client's context does. Rejects with nats.js's
   * TimeoutError when the composition is not whole by then.
   */
  async #composeWithin(request: MessageInitShape<typeof ComposeRequestSchema>, ms: number): Promise<ComposeResponse> {
    const deadline = Date.now() + ms;
    const next = create(ComposeRequestSchema, request);
    const pages: ComposeResponse[] = [];
    for (;;) {
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new errors.TimeoutError();
      }
      const page = await this.compose(next, { timeout: left });
      pages.push(page);
      if (page.nextPageToken === "") {
        return joinComposePages(pages);
      }
      next.pageToken = page.nextPageToken;
    }
  }

  /**
   * Yields the composition of a node, whole (its pages joined, as
   * {@link composeAll} returns it), then a new one each time the node's plan
   * changes: each yielded composition's `planDigest` differs from the one
   * before. The seat's holder keeps every node's digest in the bucket
   * {@link PLANS_BUCKET} (key `<node>`, a {@link PlanDigest} with the
   * revisions it was composed at). Each write of the node's key is a message
   * on the key's subject, `$KV.mesh-provisioner_plans.<node>` (under the
   * {@link ProvisionerClientOptions.apiPrefix} when set), to which this
   * subscribes (the last message heard kept: a burst of writes is one
   * change); the composition asked first, and again after each reconnect,
   * covers what the subscription cannot have heard. A subscription is all a
   * node's permissions grant of the bucket: no consumer, no direct get,
   * nothing published into JetStream (docs/security.md). Only a write of the
   * node's own key is heard: a message JetStream answered on that subject
   * for someone else (with Nats-Stream, or another key's Nats-Subject) is
   * not. On each new
   * digest it composes with `minRevisions` set to the digest's revisions, so
   * the composition is at least as new. Nothing changed costs no request.
   *
   * ```ts
   * const stop = new AbortController();
   * for await (const plan of client.watchPlan("ace", { signal: stop.signal })) {
   *   await apply(plan);
   * }
   * ```
   *
   * It ends, without an error, when the signal aborts (a request in flight
   * is abandoned) or the loop breaks; either way the subscription ends. A
   * 503 (the server's copy loading, or behind the digest's revisions), and a
   * composition that got no answer (no instance serving yet, as for a node
   * up before the service or every instance restarting; a timeout: each
   * composition, every page of it, is bounded by {@link WATCH_COMPOSE_TIMEOUT}
   * (30 s) or by the `timeout` option, so that one lost with its connection
   * or with the instance that took it is asked again), is asked again,
   * backing off from {@link WATCH_RETRY_MIN} (100 ms) to
   * {@link WATCH_RETRY_MAX} (2 s). A connection lost and found again
   * composes again: a change made meanwhile is not missed. The client's own
   * `timeout` does not bound the watch's compositions, as in the Go client.
   *
   * @throws {ProvisionerError} when a composition is refused otherwise than
   *   with a 503 (a 400, 403 or 500).
   * @throws {TypeError} if node is not a node's name: a key's token (not
   *   empty, only A-Z a-z 0-9 - _ = /) of at most 256 bytes.
   * @throws {WatchStoppedError} when the connection closes.
   * @throws nats.js's TimeoutError when the subscription is not in place at
   *   the server within {@link WATCH_FLUSH_TIMEOUT} (5 s).
   * @throws the nats.js error when the subscription is refused (such as a PermissionViolationError for
   *   another node's key), or of a composition's request otherwise than
   *   unanswered, such as an answer that does not decode.
   */
  async *watchPlan(node: string, opts: WatchPlanOptions = {}): AsyncGenerator<ComposeResponse, void, undefined> {
    // A wildcard would subscribe to every node's key the identity may read.
    checkName("watchPlan", "node", node);
    const { signal } = opts;
    const composeTimeout = opts.timeout ?? WATCH_COMPOSE_TIMEOUT;
    if (signal?.aborted) {
      return;
    }
    const watch = new PlanWatch(this.#nc, node, this.#apiPrefix);
    const stop = () => watch.stop();
    signal?.addEventListener("abort", stop, { once: true });
    try {
      // The subscription in place at the server before the first
      // composition: a write after it is heard.
      await abortable(within(this.#nc.flush(), WATCH_FLUSH_TIMEOUT), signal);
      if (signal?.aborted) {
        return;
      }
      let last = "";
      // The composition at least as new as least, or undefined once the
      // signal aborts; a 503 or no answer is asked again.
      const composeAt = async (least: Revisions | undefined): Promise<ComposeResponse | undefined> => {
        for (let retry = WATCH_RETRY_MIN; ; retry = Math.min(2 * retry, WATCH_RETRY_MAX)) {
          try {
            return await abortable(this.#composeWithin({ node, minRevisions: least }, composeTimeout), signal);
          } catch (err) {
            if (signal?.aborted) {
              return undefined;
            }
            if (this.#nc.isClosed() || watch.closed) {
              throw new WatchStoppedError(node);
            }
            if (!(err instanceof ProvisionerError && err.code === 503) && !unanswered(err)) {
              throw err;
            }
          }
          if (!(await sleep(retry, signal))) {
            return undefined;
          }
        }
      };
      if (watch.refused !== undefined) {
        throw watch.refused; // no write of the key would be heard
      }
      const first = await composeAt(undefined);
      if (first === undefined) {
        return;
      }
      last = first.planDigest;
      yield first;
      for (;;) {
        const heard = await watch.next(signal);
        if (heard === undefined) {
          return;
        }
        if (heard === "closed") {
          throw new WatchStoppedError(node);
        }
        let least: Revisions | undefined;
        if (heard !== "reconnected") {
          // A reconnect composes at once: what was written while the
          // connection was lost was not heard.
          const record = removesKey(heard.headers) ? undefined : decodePlanDigest(heard.data);
          if (record === undefined || record.digest === last) {
            continue; // the node's key removed (its plan is what it was), not a digest, or the same
          }
          least = record.revisions;
        }
        const composition = await composeAt(least);
        if (composition === undefined) {
          return;
        }
        if (composition.planDigest === last) {
          continue;
        }
        last = composition.planDigest;
        yield composition;
      }
    } finally {
      signal?.removeEventListener("abort", stop);
      watch.stop();
    }
  }

  /**
   * Writes what module needs for the placeholder `${kind:name}`, through
   * the put verb on `mesh-provisioner.put.<node>` (the client's
   * {@link ProvisionerClientOptions.node}, required), and resolves to the
   * revision it was written at: ask a verb with it in `minRevisions.needs`
   * to read your write. The service is the only writer of the buckets: a
   * node's permissions grant it no JetStream publish.
   *
   * @throws {TypeError} when the client has no node, or a part of the key
   *   is not a token ({@link needKey}).
   * @throws {ProvisionerError} when the service refuses the write: 400 (a
   *   malformed key, a value that does not decode), 403 (a key of another
   *   node), 413 (a value larger than the bucket's largest, or over the
   *   node's budget of keys or bytes), 503 (ask again).
   * @throws the nats.js error of the request otherwise, such as a
   *   TimeoutError.
   */
  async putNeed(module: string, kind: string, name: string, need: MessageInitShape<typeof NeedSchema>, opts: RequestOptions = {}): Promise<bigint> {
    const node = this.#writer("putNeed");
    const revision = await this.#forgetOnError(module, this.#put(What.NEEDS, needKey(node, module, kind, name), encodeDeterministic(NeedSchema, need), opts));
    this.#wrote(module, revision);
    return revision;
  }

  /**
   * Deletes a need through the delete verb, `mesh-provisioner.delete.<node>`,
   * and resolves to the revision of its delete marker.
   *
   * @throws as {@link putNeed} does.
   */
  async deleteNeed(module: string, kind: string, name: string, opts: RequestOptions = {}): Promise<bigint> {
    const node = this.#writer("deleteNeed");
    const revision = await this.#forgetOnError(module, this.#delete(What.NEEDS, needKey(node, module, kind, name), opts));
    this.#wrote(module, revision);
    return revision;
  }

  /**
   * Makes needs the whole set of module's needs, through the apply verb,
   * `mesh-provisioner.apply.<node>`: the service writes each need that
   * differs from the one stored, deletes each of the module's that the set
   * does not hold, and leaves the others. An empty set deletes every need of
   * the module. The answer says what it changed and at which revision of
   * the needs bucket (`revision`: ask with it to read the set back).
   *
   * @throws as {@link putNeed} does.
   */
  async applyNeeds(module: string, needs: ModuleNeed[], opts: RequestOptions = {}): Promise<ApplyResponse> {
    const node = this.#writer("applyNeeds");
    const records: MessageInitShape<typeof ApplyRequestSchema>["needs"] = needs.map(({ kind, name, need }) => ({
      what: What.NEEDS,
      key: needKey(node, module, kind, name),
      value: encodeDeterministic(NeedSchema, need),
    }));
    const minRevision = this.#written.get(module) ?? 0n;
    const out = await this.#forgetOnError(module, this.#call(nodeSubject(APPLY_SUBJECT, node), ApplyRequestSchema, ApplyResponseSchema, { module, needs: records, minRevision }, opts, ["node", node], DEFAULT_WRITE_TIMEOUT));
    if (out.written + out.deleted > 0) {
      // Else the revision is the copy's, which may be past the module's
      // last write: another instance's copy need not wait for it.
      this.#wrote(module, out.revision);
    }
    return out;
  }

  /**
   * Awaits a write of module's needs. One that fails may have been stored
   * all the same (its answer lost, or an apply stored in part): the
   * module's last write is then unknown, and the next apply has the service
   * read it.
   */
  async #forgetOnError<T>(module: string, write: Promise<T>): Promise<T> {
    try {
      return await write;
    } catch (err) {
      this.#written.delete(module);
      throw err;
    }
  }

  /** Keeps revision as module's last write of needs, if it is newer. */
  #wrote(module: string, revision: bigint): void {
    if (revision > (this.#written.get(module) ?? 0n)) {
      this.#written.set(module, revision);
    }
  }

  /**
   * Writes what is applied of module, through the put verb, and resolves to
   * the revision it was written at.
   *
   * @throws as {@link putNeed} does.
   */
  async putApplied(module: string, applied: MessageInitShape<typeof AppliedSchema>, opts: RequestOptions = {}): Promise<bigint> {
    const node = this.#writer("putApplied");
    return this.#put(What.APPLIED, appliedKey(node, module), encodeDeterministic(AppliedSchema, applied), opts);
  }

  /**
   * Deletes what is applied of module, through the delete verb, and
   * resolves to the revision of its delete marker.
   *
   * @throws as {@link putNeed} does.
   */
  async deleteApplied(module: string, opts: RequestOptions = {}): Promise<bigint> {
    const node = this.#writer("deleteApplied");
    return this.#delete(What.APPLIED, appliedKey(node, module), opts);
  }

  /**
   * Writes contributor's item of a collection, by its readable name such as
   * `"shell:zsh:normal"` (escaped in the key), through the put verb, and
   * resolves to the revision it was written at.
   *
   * @throws as {@link putNeed} does.
   */
  async putCollectItem(collection: string, contributor: string, item: MessageInitShape<typeof CollectItemSchema>, opts: RequestOptions = {}): Promise<bigint> {
    const node = this.#writer("putCollectItem");
    return this.#put(What.COLLECT, collectKey(node, collection, contributor), encodeDeterministic(CollectItemSchema, item), opts);
  }

  /**
   * Deletes contributor's item of a collection, through the delete verb, and
   * resolves to the revision of its delete marker.
   *
   * @throws as {@link putNeed} does.
   */
  async deleteCollectItem(collection: string, contributor: string, opts: RequestOptions = {}): Promise<bigint> {
    const node = this.#writer("deleteCollectItem");
    return this.#delete(What.COLLECT, collectKey(node, collection, contributor), opts);
  }

  /**
   * Declares the manifest of provider, a module this node runs, through the
   * declare verb, `mesh-provisioner.declare.<node>.<provider>`, which only a
   * node whose permissions name the provider may publish to (`permissions
   * --node <node> --providers <provider>`; nats-server refuses the others).
   * It is stored at `<node>.<provider>` of the manifests bucket, encoded
   * deterministically; resolves to its digest and revision.
   *
   * @throws as {@link putNeed} does; a publish the node's permissions do not
   *   grant gets no answer (a nats.js timeout) and a permission violation
   *   on the connection.
   */
  async putManifest(provider: string, manifest: MessageInitShape<typeof ManifestSchema>, opts: RequestOptions = {}): Promise<DeclaredManifest> {
    const node = this.#writer("putManifest");
    manifestKey(node, provider); // a TypeError for a provider that no key may name
    const answer = await this.#call(declareSubject(node, provider), DeclareRequestSchema, WriteResponseSchema,
      { manifest: encodeDeterministic(ManifestSchema, manifest) }, opts, ["node", node], DEFAULT_WRITE_TIMEOUT);
    return { digest: answer.digest, revision: answer.revision };
  }

  /**
   * Withdraws the node's manifest of provider, through the declare verb,
   * and resolves to the revision of its delete marker.
   *
   * @throws as {@link putManifest} does.
   */
  async deleteManifest(provider: string, opts: RequestOptions = {}): Promise<bigint> {
    const node = this.#writer("deleteManifest");
    manifestKey(node, provider); // a TypeError for a provider that no key may name
    const answer = await this.#call(declareSubject(node, provider), DeclareRequestSchema, WriteResponseSchema, { withdraw: true }, opts, ["node", node], DEFAULT_WRITE_TIMEOUT);
    return answer.revision;
  }

  /**
   * Writes key of the provider's bucket `<provider>_bound` through the bind
   * verb, `mesh-provisioner.bind.<provider>` (the client's
   * {@link ProvisionerClientOptions.provider}, required), and resolves to
   * the revision it was written at: compose with it in
   * `minRevisions.bound` (`{ bound: { "<provider>_bound": revision } }`)
   * to see the provision bound. The key is
   * `<node>.<module>.<provision>[.<local>]`, as a `Provision` names it; the
   * value is opaque to the service, which stores it as given and keeps no
   * copy.
   *
   * @throws {TypeError} when the client has no provider.
   * @throws {ProvisionerError} when the service refuses the write: 400 (a
   *   malformed key), 413 (a value larger than the bucket's largest), 503.
   * @throws the nats.js error of the request otherwise.
   */
  async bind(key: string, value: Uint8Array, opts: RequestOptions = {}): Promise<bigint> {
    const provider = this.#binder("bind");
    const answer = await this.#call(bindSubject(provider), BindRequestSchema, WriteResponseSchema, { key, value }, opts, ["provider", provider], DEFAULT_WRITE_TIMEOUT);
    return answer.revision;
  }

  /**
   * Removes key of the provider's bucket through the bind verb (kept as a
   * delete marker), and resolves to the revision of the marker.
   *
   * @throws as {@link bind} does.
   */
  async unbind(key: string, opts: RequestOptions = {}): Promise<bigint> {
    const provider = this.#binder("unbind");
    const answer = await this.#call(bindSubject(provider), BindRequestSchema, WriteResponseSchema, { key, unbind: true }, opts, ["provider", provider], DEFAULT_WRITE_TIMEOUT);
    return answer.revision;
  }

  /** The node a write is for, or a TypeError naming the method when the client has none. */
  #writer(method: string): string {
    if (this.#node === undefined) {
      throw new TypeError(`${method}: the client has no node: a node writes its own records (new ProvisionerClient(nc, { node }))`);
    }
    return this.#node;
  }

  /** The provider a bind is for, or a TypeError naming the method when the client has none. */
  #binder(method: string): string {
    if (this.#provider === undefined) {
      throw new TypeError(`${method}: the client has no provider: a provider writes its own bucket (new ProvisionerClient(nc, { provider }))`);
    }
    return this.#provider;
  }

  /** Puts one record of the client's node and resolves to its revision. */
  async #put(what: What, key: string, value: Uint8Array, opts: RequestOptions): Promise<bigint> {
    const answer = await this.#call(nodeSubject(PUT_SUBJECT, this.#node!), PutRequestSchema, WriteResponseSchema, { record: { what, key, value } }, opts, ["node", this.#node!], DEFAULT_WRITE_TIMEOUT);
    return answer.revision;
  }

  /** Deletes one record of the client's node and resolves to the revision of its marker. */
  async #delete(what: What, key: string, opts: RequestOptions): Promise<bigint> {
    const answer = await this.#call(nodeSubject(DELETE_SUBJECT, this.#node!), DeleteRequestSchema, WriteResponseSchema, { what, key }, opts, ["node", this.#node!], DEFAULT_WRITE_TIMEOUT);
    return answer.revision;
  }

  /**
   * Sends a request in protobuf binary and decodes the answer, waiting the
   * call's timeout, else the client's, else wait (a read's or a write's
   * default). A request on
   * an identity's own subject (asker: a node's or a provider's) is answered
   * only on that identity's inbox, so its reply is one of
   * {@link inboxPrefix}(role, name), whatever the connection's own prefix
   * (a test's or a simulation's connection asks for many).
   */
  async #call<Req extends DescMessage, Res extends DescMessage>(
    subject: string,
    requestSchema: Req,
    responseSchema: Res,
    request: MessageInitShape<Req>,
    opts: RequestOptions,
    asker?: [role: Role, name: string],
    wait: number = DEFAULT_READ_TIMEOUT,
  ): Promise<MessageShape<Res>> {
    const h = headers();
    h.set("Content-Type", CONTENT_TYPE_PROTOBUF);
    const reply = await this.#nc.request(subject, toBinary(requestSchema, create(requestSchema, request)), {
      timeout: opts.timeout ?? this.#timeout ?? wait,
      headers: h,
      ...(asker === undefined ? {} : { noMux: true, reply: createInbox(inboxPrefix(...asker)) }),
    });
    const refusal = errorOf(reply);
    if (refusal) {
      throw refusal;
    }
    return fromBinary(responseSchema, reply.data);
  }

  /** Returns the running instances of the service, each as it answers PING. */
  ping(opts?: DiscoveryOptions): Promise<PingResponse[]> {
    return this.#discover("PING", "io.nats.micro.v1.ping_response", opts);
  }

  /** Returns each running instance's description: its endpoints, their subjects and metadata. */
  info(opts?: DiscoveryOptions): Promise<InfoResponse[]> {
    return this.#discover("INFO", "io.nats.micro.v1.info_response", opts);
  }

  /**
   * Returns each running instance's request counts and the service's own
   * statistics, each endpoint's `data` as an {@link EndpointStatsData}.
   */
  async stats(opts?: DiscoveryOptions): Promise<StatsResponse[]> {
    type Raw = Omit<StatsResponse, "endpoints"> & { endpoints: (Omit<EndpointStats, "data"> & { data?: JsonValue })[] };
    const answers = await this.#discover<Raw>("STATS", "io.nats.micro.v1.stats_response", opts);
    return answers.map((answer) => ({
      ...answer,
      endpoints: answer.endpoints.map(({ data, ...endpoint }) =>
        // A newer instance may report statistics this client does not
        // know: during a rolling upgrade every reader reads every instance's.
        data === undefined || data === null ? endpoint : { ...endpoint, data: fromJson(EndpointStatsDataSchema, data, { ignoreUnknownFields: true }) }),
    }));
  }

  /**
   * Asks $SRV.<verb>.mesh-provisioner[.<id>] and gathers every instance's
   * answer: an empty list when none runs.
   */
  async #discover<T extends { type: string }>(
    verb: "PING" | "INFO" | "STATS",
    type: T["type"],
    { id, maxWait = 2000 }: DiscoveryOptions = {},
  ): Promise<T[]> {
    const subject = ["$SRV", verb, SERVICE_NAME, id].filter((t) => t !== undefined).join(".");
    const replies = await this.#nc.requestMany(subject, Empty, id === undefined
      ? { strategy: "stall", maxWait }
      : { strategy: "count", maxMessages: 1, maxWait });
    const answers: T[] = [];
    try {
      for await (const reply of replies) {
        const answer = reply.json<T>();
        if (answer.type !== type) {
          throw new Error(`${subject}: an answer of type ${JSON.stringify(answer.type)}, want ${type}`);
        }
        answers.push(answer);
      }
    } catch (err) {
      if (!(err instanceof errors.NoRespondersError)) {
        throw err;
      }
    }
    return answers;
  }
}

/**
 * Returns the {@link ProvisionerError} a reply carries in its
 * Nats-Service-Error headers, or undefined when it is an answer.
 */
export function errorOf(reply: Msg): ProvisionerError | undefined {
  const description = reply.headers?.get(ERROR_HEADER) ?? "";
  const code = reply.headers?.get(ERROR_CODE_HEADER) ?? "";
  if (description === "" && code === "") {
    return undefined;
  }
  return new ProvisionerError(Number.parseInt(code, 10) || 0, description);
}

/** Joins the pages of a provisioning answer, in order, into one answer. */
export function joinProvisioningPages(pages: ProvisioningResponse[]): ProvisioningResponse {
  const whole = create(ProvisioningResponseSchema);
  for (const page of pages) {
    whole.what = page.what;
    whole.revision = page.revision;
    whole.registry.push(...page.registry);
    whole.needs.push(...page.needs);
    whole.applied.push(...page.applied);
    whole.collect.push(...page.collect);
    whole.manifests.push(...page.manifests);
    whole.malformed.push(...page.malformed);
    whole.behind.push(...page.behind.filter((b) => !whole.behind.includes(b)));
  }
  return whole;
}

/**
 * Joins the pages of a composition, in order, into one: plans, provisions
 * and refusals concatenated, a plan that continues the previous page's last
 * module merged into it (its `wantedBuild` and `newestBuild` those of the
 * page it starts on); phases are the first page's, revisions and
 * `planDigest` the last's (every page carries the whole composition's
 * digest). The pages are left as they came.
 */
export function joinComposePages(pages: ComposeResponse[]): ComposeResponse {
  const whole = create(ComposeResponseSchema);
  for (const page of pages) {
    const plans = [...page.plans];
    const last = whole.plans.at(-1);
    if (last !== undefined && plans[0]?.module === last.module) {
      // A new plan, so that the pages stay as they came: the module's
      // builds are the page's where its plan starts.
      whole.plans[whole.plans.length - 1] = create(ModulePlanSchema, {
        module: last.module,
        items: [...last.items, ...plans.shift()!.items],
        wantedBuild: last.wantedBuild,
        newestBuild: last.newestBuild,
      });
    }
    whole.plans.push(...plans);
    whole.provisions.push(...page.provisions);
    whole.refusals.push(...page.refusals);
    if (whole.phases.length === 0) {
      whole.phases = page.phases;
    }
    whole.node = page.node;
    whole.module = page.module;
    whole.revisions = page.revisions;
    whole.planDigest = page.planDigest; // every page's is the whole composition's
    whole.behind.push(...page.behind.filter((b) => !whole.behind.includes(b)));
  }
  return whole;
}

/**
 * Joins the pages of a provider's provisions, in order, into one answer:
 * provisions concatenated; the provider and revisions are the last page's.
 */
export function joinProvisionsPages(pages: ProvisionsResponse[]): ProvisionsResponse {
  const whole = create(ProvisionsResponseSchema);
  for (const page of pages) {
    whole.provider = page.provider;
    whole.provisions.push(...page.provisions);
    whole.revisions = page.revisions;
    whole.behind.push(...page.behind.filter((b) => !whole.behind.includes(b)));
  }
  return whole;
}

/**
 * Returns the items of a module's plan at a build: the plan that the module
 * at `build` applies (docs/protocol.md, "Builds").
 *
 * - A plan that names no build (its module's applied record names none:
 *   `wantedBuild` and `newestBuild` empty, and no item has `builds`) is the
 *   same at every build: every item, whatever `build` is.
 * - Otherwise, the items whose `builds` name `build`. A build that is
 *   neither the plan's `wantedBuild` nor its `newestBuild` holds none, nor
 *   does the empty build: the composition did not resolve the module at it.
 *
 * Items keep their order (key order); the array is new, the items are the
 * plan's own. Join a paged composition first ({@link joinComposePages}): a
 * plan split across pages holds only part of its items on each.
 *
 * ```ts
 * const whole = await client.composeAll({ node: "ace", module: "web" });
 * for (const plan of whole.plans) {
 *   const now = planAt(plan, plan.wantedBuild);  // what the node runs, or is moving to
 *   const next = planAt(plan, plan.newestBuild); // what its newest build will need
 * }
 * ```
 */
export function planAt(plan: ModulePlan, build: string): PlanItem[] {
  if (plan.wantedBuild === "" && plan.newestBuild === "") {
    return [...plan.items];
  }
  return plan.items.filter((item) => item.builds.includes(build));
}

/**
 * Reports whether a provider has bound a provision: its `boundRevision`,
 * the revision of its key in the provider's bucket (`<provider>_bound`), is
 * set. Zero is pending: the key, or the bucket, does not exist yet. A node
 * that saw the provider bind at revision R reads its own write back with
 * `minRevisions: { bound: { [provision.bucket]: R } }`.
 */
export function isBound(provision: Provision): boolean {
  return provision.boundRevision > 0n;
}

/**
 * Returns the provisions of a composition that their providers have not
 * bound yet ({@link isBound} false), in the composition's order: the
 * composition's own, in a new array. The Go client.Pending.
 *
 * ```ts
 * const waiting = pending(await client.composeAll({ node: "ace" }));
 * ```
 */
export function pending(composition: ComposeResponse): Provision[] {
  return composition.provisions.filter((provision) => !isBound(provision));
}
