// The README's programs, as a node, an operator and a provider: each is
// type-checked as the README shows it (the package's name mapped to src/),
// then run in order against one fresh server, and must print the lines of the
// block that follows it.
//
// Run by `make test-ts`, which builds the binary and sets MESH_PROVISIONER_BIN.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { once } from "node:events";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";

import ts from "typescript";

// build-test/test/ -> clients/ts.
const pkg = resolve(fileURLToPath(import.meta.url), "../../..");
const PACKAGE = "@novox/mesh-provisioner-client";

/** The README's complete programs (the blocks that connect), each with the lines it must print. */
async function programs(): Promise<{ source: string; prints: string[] }[]> {
  const readme = await readFile(join(pkg, "README.md"), "utf8");
  const found = [...readme.matchAll(/```ts\n(.*?)```\n.*?```\n(.*?)```/gsu)]
    .filter(([, source]) => source!.includes('import { connect } from "@nats-io/transport-node"'));
  return found.map(([, source, prints]) => ({ source: source!, prints: prints!.split("\n").filter((l) => l !== "") }));
}

let url = "";
let stop = async () => {};

before(async () => {
  const bin = process.env["MESH_PROVISIONER_BIN"];
  if (!bin) {
    throw new Error("MESH_PROVISIONER_BIN is not set: run this test with `make test-ts`, which builds the binary and sets it");
  }
  const dir = await mkdtemp(join(tmpdir(), "mesh-provisioner-readme-"));
  const child = spawn(bin, ["--state-dir", dir, "--listen", "127.0.0.1:0", "--log-format", "json"], { stdio: ["ignore", "ignore", "pipe"] });
  process.once("exit", () => child.kill("SIGKILL"));
  stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = once(child, "exit");
      child.kill("SIGTERM");
      await exited;
    }
    await rm(dir, { recursive: true, force: true });
  };
  const log: string[] = [];
  url = await new Promise<string>((resolveUrl, reject) => {
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
});

after(() => stop());

describe("README", async () => {
  const examples = await programs();
  // In the package's folder, so that its module type and node_modules hold.
  const dir = join(pkg, "build-test", "readme");

  it("has a program as a node, as an operator and as a provider", () => {
    assert.equal(examples.length, 3);
    assert.match(examples[0]!.source, /inboxPrefix\("node", node\)/u);
    assert.match(examples[1]!.source, /inboxPrefix\("operator", "alice"\)/u);
    assert.match(examples[2]!.source, /client\.provisionsPages/u);
  });

  it("the programs type-check as written, with the package's options", async () => {
    await mkdir(dir, { recursive: true });
    const files = await Promise.all(examples.map(async ({ source }, i) => {
      const file = join(dir, `example-${i + 1}.ts`);
      await writeFile(file, source);
      return file;
    }));
    const program = ts.createProgram(files, {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      strict: true,
      noUnusedLocals: true,
      noUnusedParameters: true,
      noImplicitReturns: true,
      verbatimModuleSyntax: true,
      types: ["node"],
      typeRoots: [join(pkg, "node_modules", "@types")],
      noEmit: true,
      paths: { [PACKAGE]: [join(pkg, "src", "index.ts")] },
    });
    const diagnostics = ts.getPreEmitDiagnostics(program).map((d) =>
      `${d.file ? `${d.file.fileName}:${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}: ` : ""}${ts.flattenDiagnosticMessageText(d.messageText, "\n")}`);
    assert.deepStrictEqual(diagnostics, []);
  });

  examples.forEach(({ source, prints }, i) => {
    it(`program ${i + 1} runs and prints what the README says`, async () => {
      await mkdir(dir, { recursive: true });
      const js = ts.transpileModule(source, { compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext } }).outputText
        .replaceAll(`"${PACKAGE}"`, JSON.stringify(pathToFileURL(join(pkg, "build-test", "src", "index.js")).href));
      const file = join(dir, `example-${i + 1}.mjs`);
      await writeFile(file, js);
      const { stdout } = await promisify(execFile)(process.execPath, [file], { env: { ...process.env, NATS_URL: url }, timeout: 30_000 });
      const lines = stdout.split("\n");
      for (const line of prints) {
        assert.ok(lines.includes(line), `missing ${JSON.stringify(line)} in:\n${stdout}`);
      }
    });
  });
});
