// One PostgreSQL for the whole run: DATABASE_URL when set, otherwise a real
// embedded server in .data/test-pg. Each test file creates its own database.
// And a build of the sources as they are (bin/build.mjs, about half a second):
// the commands the tests spawn (bin/svc.js, bin/svc-daemon.js) run from dist/
// while it is current and on tsx's loader otherwise, where each start takes
// twice as long (docs/operations.md); the servers some tests spawn run
// dist/src/main.js itself.
// A build that fails (a source that does not compile) leaves them on the sources.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import type { TestProject } from "vitest/node";
// @ts-expect-error: a plain JavaScript module of bin/, without type declarations
import { isCurrentBuild } from "../../bin/sources.mjs";
import { startEmbedded, type EmbeddedServer } from "../../src/db/embedded.js";
import { createLogger } from "../../src/log.js";

declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string;
  }
}

let embedded: EmbeddedServer | undefined;

export async function setup(project: TestProject) {
  const root = path.resolve(".");
  if (!isCurrentBuild(root, path.join(root, "dist"))) spawnSync(process.execPath, ["bin/build.mjs"], { cwd: root, stdio: "ignore" });
  let url = process.env.DATABASE_URL;
  if (!url) {
    const dir = path.resolve(".data/test");
    fs.mkdirSync(dir, { recursive: true });
    embedded = await startEmbedded(dir, createLogger("silent"), 54400 + Math.floor(Math.random() * 500));
    url = embedded.url;
  }
  project.provide("databaseUrl", url);
}

export async function teardown() {
  await embedded?.stop();
}
