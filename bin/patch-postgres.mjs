// Patches postgres.js 3.4.9 (run by `npm install`/`npm ci`: package.json postinstall).
//
// The defect (porsager/postgres#1154, #1208; fixes proposed in #1168, #1176,
// #1209, none released): a write smaller than 1 KiB is deferred with
// setImmediate; when the connection's socket closes first, closed() sets the
// socket to null, and a later write on that connection (the ROLLBACK that
// sql.begin sends after a transaction's connection died, or the next statement
// of the transaction) runs socket.write on null inside the immediate: an
// uncaught TypeError that ends the whole process. A PostgreSQL restart under
// load did exactly that to a server process (npm run chaos). Teardown also
// cancelled the pending immediate without forgetting it or the buffered bytes,
// so a connection reused after such a close never flushed a small write again.
//
// The patch: a write to a closed connection fails its queries with
// CONNECTION_CLOSED (a catchable error; the transaction is answered as failed
// and the client retries), and teardown forgets the pending write.
//
// Second defect, also found by npm run chaos (porsager/postgres#1192, #1205,
// #1223; unreleased): ReadyForQuery starts the async fetchArrayTypes() of a
// new connection (fetch_types) and drops its promise, so when the connection
// dies during that query (a reconnect while PostgreSQL restarts: `read
// ECONNRESET`) or the query is refused, the rejection is unhandled and Node
// ends the process. The same error already fails the query that opened the
// connection; the patch gives the dropped promise a handler.
//
// Third, a statement left on a dead connection answered the next one's: when
// a transaction's connection is reset, the socket's error fails its queries,
// but sql.begin's ROLLBACK (or the transaction's next statement) is queued on
// the connection before its close event, and closed() failed what was left
// only after a clean close. The stale ROLLBACK then stayed in the queue of
// sent statements: once the pool connected again, it took the answer of the
// next transaction's first statement, and every later statement the answer of
// the one before; the last one waited forever, holding the connection (found
// by test/foundation/connection-loss.test.ts on PostgreSQL 15). The patch:
// closed() fails whatever is left after any close and forgets the current
// statement, and a statement for a connection whose socket is gone fails at
// once instead of being queued for the next socket.
//
// Second, the pool's figures for /metrics (svc_db_pool_in_use, _waiting):
// postgres.js keeps its connections in private queues by state and the
// queries no connection can take yet in another, so nothing outside can
// count them. The patch adds sql.svcPoolState(), which answers the length
// of each queue (src/db/index.ts reads it).
//
// Last, fewer socket writes: postgres.js writes a statement of 1 KiB or more
// at once and defers only smaller ones to the next turn of the event loop, so
// the statements of one pipelined round trip (a submit batch sends five with
// arrays of its rows) went out as one write each, a system call and a wake-up
// of the backend every time. The patch defers every statement written in one
// turn to one write, up to 256 KiB.
//
// And the pool's queues: postgres.js keeps its connections in queues by
// state (open, busy, ...) whose shift() leaves a hole at the front and only
// starts a fresh array once the queue is empty, and whose remove(), run each
// time a connection changes state, searched from the first hole. Under a
// steady load the busy queue is never empty (each statement shifts a
// connection off it and pushes it back), so its array grew by one slot per
// statement and every change of state scanned all of it: the cost of a
// statement grew with the statements run since the pool was last idle. 64
// statements kept in flight on a pool of 20 for 8 s: 26,700 a second at 38 µs
// of CPU each before the patch, 70,000 at 14 µs after. The patch searches
// from the live part and drops the holes once they are most of the array.
//
// And a transaction's result outlived it: sql.begin races the transaction
// against a promise that the connection's close rejects, and leaves that
// promise's reject function on the connection (and in the closure of the
// first statement's cached stack trace). Through it the race, settled with
// the result, stayed reachable until the connection's next transaction: each
// connection of the pool held its last submit batch's rows (a heap snapshot
// under load: 577 job rows from 17 connections). The patch lets go of the
// function once the transaction is over.
//
// And what young collections keep: V8 allocates a function written straight
// into a property (`obj.f = () => ...`) in the old generation, on the guess
// that it is a method that lives long. Such a closure is only freed by a full
// collection, and until then everything its scope reaches survives every young
// collection and is copied into the old generation with it. postgres.js wrote
// two per statement (a Query's resolve and reject, whose scope holds the Query
// and the promise its caller awaits) and one per transaction (the connection's
// next-statement function, whose scope is the whole transaction): under load
// the young generation copied, then promoted, nearly every statement with its
// parameters and rows. The patch makes them the same closures held in a local
// first, which V8 allocates young.
//
// Exact text replacements, checked: a postgres version other than the pinned
// one, or text that moved, stops the install with a message instead of
// patching blindly.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const PINNED = "3.4.9";
const MARK = "svc patch: write to a closed connection";
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
];

const TYPES_MARK = "svc patch: the array-types query's failure";
const typesReplacements = [
  [
    "        return fetchArrayTypes()\n",
    `        // ${TYPES_MARK} reached the connection's queries; the dropped promise must not reject unhandled\n        return fetchArrayTypes().catch(() => {})\n`,
  ],
];

const STALE_MARK = "svc patch: statements left on a closed connection";
const staleReplacements = [
  [
    "    !hadError && (query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))\n",
    `    // ${STALE_MARK} fail after any close, or they take the answers of the next connection's statements\n    ;(query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))\n    query = null\n`,
  ],
  [
    "  function execute(q) {\n    if (terminated)\n",
    `  function execute(q) {\n    // ${STALE_MARK}: none is queued while the connection has no socket\n    if (!socket) {\n      queryError(q, Errors.connection('CONNECTION_CLOSED', options))\n      return true\n    }\n    if (terminated)\n`,
  ],
];

const POOL_MARK = "svc patch: pool state";
const poolReplacements = [
  [
    "    get parameters() { return options.parameters },\n",
    `    get parameters() { return options.parameters },\n    // ${POOL_MARK}: connections by state, and queries waiting for one\n    svcPoolState: () => ({ connecting: connecting.length, reserved: reserved.length, busy: busy.length, full: full.length, open: open.length, closed: closed.length, ended: ended.length, waiting: queries.length }),\n`,
  ],
];

const COALESCE_MARK = "svc patch: one write per turn";
const coalesceReplacements = [
  [
    "    if (fn || chunk.length >= 1024)\n",
    `    // ${COALESCE_MARK} of the event loop, up to 256 KiB\n    if (fn || chunk.length >= 262144)\n`,
  ],
];

const QUEUE_MARK = "svc patch: the queue's holes";
const queueReplacements = [
  [
    "      const index = xs.indexOf(x)\n",
    `      // ${QUEUE_MARK} before \`index\` hold nothing\n      const index = xs.indexOf(x, start)\n`,
  ],
  [
    "  let index = 0\n",
    "  let index = 0\n  const first = () => index\n",
  ],
  [
    "      } else {\n        xs[index - 1] = undefined\n      }\n",
    `      } else if (index >= 1024 && index * 2 >= xs.length) {\n        // ${QUEUE_MARK}: dropped once they are most of the array\n        xs = xs.slice(index)\n        index = 0\n      } else {\n        xs[index - 1] = undefined\n      }\n`,
  ],
  [
    "    remove: (x) => {\n",
    "    remove: (x) => {\n      const start = first()\n",
  ],
];

const RESULT_MARK = "svc patch: a finished transaction's result";
const resultReplacements = [
  ["      , prepare = null\n", "      , prepare = null\n      , closeRejects = null\n"],
  ["        new Promise((_, reject) => connection.onclose = reject)\n", "        new Promise((_, reject) => connection.onclose = closeRejects = reject)\n"],
  [
    "    } catch (error) {\n      throw error\n    }\n",
    `    } catch (error) {\n      throw error\n    } finally {\n      // ${RESULT_MARK} stays reachable from the connection until its next transaction unless this is let go\n      connection && connection.onclose === closeRejects && (connection.onclose = null)\n      closeRejects = null\n    }\n`,
  ],
];

const YOUNG_MARK = "svc patch: closures allocated young";
const youngQueryReplacements = [
  [
    "    this.resolve = x => (this.active = false, resolve(x))\n    this.reject = x => (this.active = false, reject(x))\n\n    this.active = false\n",
    `    // ${YOUNG_MARK}: a function literal written straight into a property is allocated old\n    const settle = x => (this.active = false, resolve(x))\n        , fail = x => (this.active = false, reject(x))\n    this.resolve = settle\n    this.reject = fail\n\n    this.active = false\n`,
  ],
];
const youngBeginReplacements = [
  [
    "      c.reserved = () => queries.length\n        ? c.execute(queries.shift())\n        : move(c, reserved)\n    }\n",
    `      // ${YOUNG_MARK}: a function literal written straight into a property is allocated old\n      const next = () => queries.length\n        ? c.execute(queries.shift())\n        : move(c, reserved)\n      c.reserved = next\n    }\n`,
  ],
];

/** Applies `replacements` to each file once (a file carrying `mark` is done); each must match exactly `expected(from)` times. */
function patch(files, mark, replacements, expected) {
  for (const rel of files) {
    const file = path.join(root, rel);
    if (!fs.existsSync(file)) continue;
    let text = fs.readFileSync(file, "utf8");
    if (text.includes(mark)) continue;
    for (const [from, to] of replacements) {
      const count = text.split(from).length - 1;
      if (count !== expected(from)) {
        console.error(`bin/patch-postgres.mjs: ${rel}: expected ${expected(from)} occurrence(s) of ${JSON.stringify(from.trim().split("\n")[0])}, found ${count}`);
        process.exit(1);
      }
      text = text.split(from).join(to);
    }
    fs.writeFileSync(file, text);
  }
}

patch(["src/connection.js", "cjs/src/connection.js", "cf/src/connection.js"], MARK, replacements, (from) => (from.includes("clearImmediate") ? 2 : 1));
patch(["src/connection.js", "cjs/src/connection.js", "cf/src/connection.js"], TYPES_MARK, typesReplacements, () => 1);
patch(["src/connection.js", "cjs/src/connection.js", "cf/src/connection.js"], STALE_MARK, staleReplacements, () => 1);
patch(["src/index.js", "cjs/src/index.js", "cf/src/index.js"], POOL_MARK, poolReplacements, () => 1);
patch(["src/connection.js", "cjs/src/connection.js", "cf/src/connection.js"], COALESCE_MARK, coalesceReplacements, () => 1);
patch(["src/queue.js", "cjs/src/queue.js", "cf/src/queue.js"], QUEUE_MARK, queueReplacements, () => 1);
patch(["src/index.js", "cjs/src/index.js", "cf/src/index.js"], RESULT_MARK, resultReplacements, () => 1);
patch(["src/query.js", "cjs/src/query.js", "cf/src/query.js"], YOUNG_MARK, youngQueryReplacements, () => 1);
patch(["src/index.js", "cjs/src/index.js", "cf/src/index.js"], YOUNG_MARK, youngBeginReplacements, () => 1);
