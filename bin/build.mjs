#!/usr/bin/env node
// Compiles the service (src/ and gen/) to plain JavaScript, so that it runs on
// node alone: `npm start` runs `dist/src/main.js`, and the commands in bin/
// run from it while it is current (bin/entry.mjs). Without TypeScript's loader
// (tsx) a process starts faster and holds about 50 MB less: no loader thread,
// no compiler in memory (docs/operations.md).
//
//   node bin/build.mjs [--out DIR]     (default: dist)
//
// Each file is compiled on its own, in place in a copy of the tree, and every
// other file of src/ (migrations, installers, the legacy daemon, the console's
// sources, which the server bundles when first asked) is copied beside them.
// Paths the code makes from import.meta.url therefore resolve as they do in
// src/. The output directory must lie inside the project, so that packages
// resolve from its node_modules. A build is made whole in a folder beside it,
// with the record of the sources it was made from (bin/sources.mjs) written
// last, then swapped in by two renames: a process already running from the
// output, or a second build at the same time, never sees it half written.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { build } from "esbuild";
import { recordBuild, sourcesFingerprint } from "./sources.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { values } = parseArgs({ options: { out: { type: "string", default: "dist" } } });
const out = path.resolve(root, values.out);
if (out === root || !out.startsWith(root + path.sep)) {
  console.error(`build: --out must be a folder inside ${root} (got ${out})`);
  process.exit(2);
}

/** Every file under `dir`, relative to the project root. */
function filesUnder(dir) {
  return fs.readdirSync(path.join(root, dir), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => path.relative(root, path.join(e.parentPath ?? e.path, e.name)));
}

// The console is browser code, bundled from its sources by the server (src/http/console.ts).
const compiled = (f) => f.endsWith(".ts") && !f.endsWith(".d.ts") && !f.startsWith(`src${path.sep}console${path.sep}`);
const files = [...filesUnder("src"), ...filesUnder("gen")];

const started = Date.now();
// Taken before compiling: a source changed meanwhile leaves the build marked stale.
const fingerprint = sourcesFingerprint(root);
const staging = `${out}.tmp-${process.pid}`;
fs.rmSync(staging, { recursive: true, force: true });
try {
  await buildInto(staging);
} catch (err) {
  fs.rmSync(staging, { recursive: true, force: true });
  throw err;
}
swapIn(staging, out);
console.log(`build: ${files.filter(compiled).length} modules compiled and ${files.length - files.filter(compiled).length} files copied into ${path.relative(root, out)}/ in ${Date.now() - started} ms`);

async function buildInto(dir) {
  await build({
    absWorkingDir: root,
    entryPoints: files.filter(compiled),
    outdir: dir,
    outbase: ".",
    bundle: false,
    format: "esm",
    platform: "node",
    target: "node20",
    // Stack traces name the TypeScript lines (`node --enable-source-maps`).
    sourcemap: "linked",
    sourcesContent: false,
    logLevel: "warning",
  });
  for (const f of files.filter((f) => !compiled(f))) {
    fs.mkdirSync(path.join(dir, path.dirname(f)), { recursive: true });
    fs.copyFileSync(path.join(root, f), path.join(dir, f));
  }
  // The manifest: the version the API document reports, and "type": "module" for the tree.
  fs.copyFileSync(path.join(root, "package.json"), path.join(dir, "package.json"));
  recordBuild(dir, fingerprint);
}

/** Replaces `target` with the finished build in `dir`; if another build landed in between, that one stays. */
function swapIn(dir, target) {
  const old = `${target}.old-${process.pid}`;
  if (fs.existsSync(target)) fs.renameSync(target, old);
  try {
    fs.renameSync(dir, target);
  } catch (err) {
    if (err.code !== "ENOTEMPTY" && err.code !== "EEXIST") throw err;
    fs.rmSync(dir, { recursive: true, force: true });
  }
  fs.rmSync(old, { recursive: true, force: true });
}
