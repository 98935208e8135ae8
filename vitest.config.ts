import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    globalSetup: ["test/helpers/global-setup.ts"],
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    maxWorkers: 3,
    // A worker runs its files one after another in one process, importing the server's modules once:
    // a fresh process per file spent a third of the suite's time starting and importing. Each file
    // still starts its own database and servers; a file must not lean on module state another file
    // may have left (a setting changed at run time is put back in its afterAll).
    isolate: false,
  },
});
