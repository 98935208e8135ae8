// The layering rules (docs/architecture.md): edge -> services -> domain -> db,
// the domain's areas one way, and the reference daemons apart from the server.
// Run by `npm run lint:deps` in CI.

const { builtinModules } = require("node:module");

// The domain's areas from the bottom up: an area may import the ones before it, never those after.
const AREAS = ["shared", "notify", "money", "accounts", "providers", "dispatch", "jobs", "admin"];

const areaRules = AREAS.slice(0, -1).map((area, i) => ({
  name: `domain-${area}-below-${AREAS.slice(i + 1).join("-")}`,
  comment: `src/domain/${area} sits below ${AREAS.slice(i + 1).join(", ")}: it must not import them`,
  severity: "error",
  from: { path: `^src/domain/${area}/` },
  to: { path: `^src/domain/(${AREAS.slice(i + 1).join("|")})/` },
}));

module.exports = {
  forbidden: [
    {
      name: "no-circular",
      comment: "Import cycles make modules load half-initialised and hide who depends on whom",
      severity: "error",
      from: {},
      to: { circular: true },
    },
    {
      name: "domain-not-edge",
      comment: "The domain (and the errors and database below it) knows nothing of the wires or the services",
      severity: "error",
      from: { path: "^src/(domain/|db/|errors\\.ts|shared/)" },
      to: { path: ["^src/(http|services|workers|cli|console|daemon|metrics)/", "^node_modules/@connectrpc/", "^node_modules/@grpc/", "^node_modules/prom-client/"] },
    },
    {
      name: "metrics-below-the-wires",
      comment: "The metrics registry (src/metrics) is counted into by the wires, services and workers and reads the domain; it imports none of them but the domain",
      severity: "error",
      from: { path: "^src/metrics/" },
      to: { path: ["^src/(http|services|workers|cli|console|daemon)/", "^node_modules/@connectrpc/", "^node_modules/@grpc/"] },
    },
    {
      name: "services-not-each-other",
      comment: "A service implementation imports shared service helpers (deps.ts), not another service's module",
      severity: "error",
      from: { path: "^src/services/(?!index\\.ts$)[^/]+\\.ts$" },
      to: { path: "^src/services/", pathNot: "^src/services/deps\\.ts$" },
    },
    {
      name: "daemon-apart",
      comment: "The reference daemon ships to providers: it imports only the shared modules (src/shared) and generated code",
      severity: "error",
      from: { path: "^src/daemon/" },
      to: { path: "^src/", pathNot: "^src/(daemon|shared)/" },
    },
    {
      name: "clients-on-generated-code",
      comment: "The CLI and the console are clients: generated code, their own files and the shared modules only",
      severity: "error",
      from: { path: "^src/(cli|console)/" },
      to: { path: "^src/", pathNot: "^src/(cli|console|shared)/" },
    },
    {
      name: "console-in-the-browser",
      comment: "The console is bundled for the browser (src/http/console.ts): nothing it imports, the shared modules it takes included, may reach a Node built-in",
      severity: "error",
      from: { path: "^src/console/" },
      to: { path: `^(node:)?(${builtinModules.join("|")})$`, reachable: true },
    },
    {
      name: "workers-not-edge",
      comment: "Background workers call the domain; they do not go through the wires",
      severity: "error",
      from: { path: "^src/workers/" },
      to: { path: "^src/(http|services)/" },
    },
    ...areaRules,
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: { exportsFields: ["exports"], conditionNames: ["import", "require", "node", "default"], extensions: [".ts", ".tsx", ".js"] },
  },
};
