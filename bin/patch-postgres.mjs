// Patches postgres.js 3.4.9 (run by `npm install`/`npm ci`: package.json postinstall).
//
// Two defects, each of which ended a server process when PostgreSQL restarted
// under load (npm run chaos); fixes proposed upstream, none released:
//
// 1. A write to a closed connection (porsager/postgres#1154, #1208): a write
//    smaller than 1 KiB is deferred with setImmediate; when the connection's
//    socket closes first, closed() sets the socket to null, and a later write
//    on that connection (the ROLLBACK that sql.begin sends after a
//    transaction's connection died, or the next statement of the transaction)
//    runs socket.write on null inside the immediate: an uncaught TypeError.
//    Teardown also cancelled the pending immediate without forgetting it or the
//    buffered bytes, so a connection reused after such a close never flushed a
//    small write again. Patched: such a write fails the connection's queries
//    with CONNECTION_CLOSED (a catchable error; the transaction is answered as
//    failed and the client retries), and teardown forgets the pending write.
// 2. The array-types query of a new connection (fetch_types, porsager/postgres#1192,
//    #1205, #1223): ReadyForQuery starts the async fetchArrayTypes() and drops
//    its promise, so when the connection dies during that query (a reconnect
//    while PostgreSQL restarts: `read ECONNRESET`) or the query is refused, the
//    rejection is unhandled and Node ends the process. The same error already
//    fails the query that opened the connection; patched: the dropped promise
//    gets a handler.
//
// Exact text replacements, checked: a postgres version other than the pinned
// one, or text that moved, stops the install with a message instead of
// patching blindly. Each replacement is applied once (a re-run skips it).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const PINNED = "3.4.9";
const MARK = "svc patch: write to a closed connection";
const TYPES_MARK = "svc patch: the array-types query's failure";
// The package's folder: up from its entry point ("exports" hides its package.json).
let root = path.dirname(createRequire(import.meta.url).resolve("postgres"));
const nameAt = (dir) => (fs.existsSync(path.join(dir, "package.json")) ? JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).name : undefined);
while (nameAt(root) !== "postgres" && path.dirname(root) !== root) root = path.dirname(root);
const version = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8")).version;
if (version !== PINNED) {
  console.error(`bin/patch-postgres.mjs: postgres ${version} installed, the patch is for ${PINNED}; check whether the new version fixes porsager/postgres#1208 and update or remove this patch`);
  process.exit(1);
}

const replacements = [
  [
    "  function nextWrite(fn) {\n    const x = socket.write(chunk, fn)\n",
    `  function nextWrite(fn) {\n    // ${MARK}: fail its queries instead of throwing from an immediate\n    if (!socket) {\n      chunk = nextWriteTimer = null\n      error(Errors.connection('CONNECTION_CLOSED', options))\n      return false\n    }\n    const x = socket.write(chunk, fn)\n`,
  ],
  // terminate() and closed(): forget the cancelled write, or the next one is never scheduled.
  ["    clearImmediate(nextWriteTimer)\n", "    clearImmediate(nextWriteTimer)\n    chunk = nextWriteTimer = null\n"],
  [
    "        return fetchArrayTypes()\n",
    `        // ${TYPES_MARK} reached the connection's queries; the dropped promise must not reject unhandled\n        return fetchArrayTypes().catch(() => {})\n`,
  ],
];

for (const rel of ["src/connection.js", "cjs/src/connection.js", "cf/src/connection.js"]) {
  const file = path.join(root, rel);
  if (!fs.existsSync(file)) continue;
  let text = fs.readFileSync(file, "utf8");
  const before = text;
  for (const [from, to] of replacements) {
    const expected = from.includes("clearImmediate") ? 2 : 1;
    if (text.split(to).length - 1 === expected) continue; // applied by an earlier run
    const count = text.split(from).length - 1;
    if (count !== expected) {
      console.error(`bin/patch-postgres.mjs: ${rel}: expected ${expected} occurrence(s) of ${JSON.stringify(from.trim().split("\n")[0])}, found ${count}`);
      process.exit(1);
    }
    text = text.split(from).join(to);
  }
  if (text !== before) fs.writeFileSync(file, text);
}
