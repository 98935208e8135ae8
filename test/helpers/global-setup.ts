// One PostgreSQL for the whole run: DATABASE_URL when set, otherwise a real
// embedded server in .data/test-pg. Each test file creates its own database.
import fs from "node:fs";
import path from "node:path";
import type { TestProject } from "vitest/node";
import { startEmbedded, type EmbeddedServer } from "../../src/db/embedded.js";
import { createLogger } from "../../src/log.js";

declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string;
  }
}

let embedded: EmbeddedServer | undefined;

export async function setup(project: TestProject) {
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
