// The node flags the server runs with: `npm start` (package.json, kept equal by
// a test), the benches, the chaos harness and the start-path test all take
// them from here, and a deployment runs `node <these flags> dist/src/main.js`.
//
// --max-semi-space-size=32: V8's young generation may grow to 32 MB per
// semi-space instead of 16. A heartbeat allocates objects that live for one
// telemetry flush (250 ms), and with the default space the young collections
// came about as often (every 220 ms at 1,900 beats/s), so much of what a
// collection copied would have died soon after. bench:heartbeat, 4 + 4 runs
// alternated on one day: 41–46 young collections in the open-loop phase
// against 82–91 (136–148 ms of pauses against 451–491), 243–267 µs of server
// CPU per beat against 280–303 saturated; submits unchanged. It costs up to
// 32 MB of resident memory (docs/operations.md, Memory).
export const SERVER_NODE_FLAGS = Object.freeze(["--enable-source-maps", "--max-semi-space-size=32"]);
