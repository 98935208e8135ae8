// Which code the commands in bin/ run (bin/entry.mjs): the build while it was
// made from the sources as they are, the sources (on tsx) once any of them
// changed, was added or removed, or when there is no complete build.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
// @ts-expect-error: a plain JavaScript module of bin/, without type declarations
import { isCurrentBuild, recordBuild, sourcesFingerprint } from "../../bin/sources.mjs";

/** A project of two sources and a build of them, inside this one (so that tsx resolves from its node_modules). */
const ROOT = path.resolve(".data", `entry-test-${process.pid}`);
const DIST = path.join(ROOT, "dist");

function write(file: string, text: string) {
  fs.mkdirSync(path.dirname(path.join(ROOT, file)), { recursive: true });
  fs.writeFileSync(path.join(ROOT, file), text);
}

/** What `importEntry("src/entry.ts", ROOT)` loads, asked in a process of its own (tsx registers for the whole process). */
function loaded(): string {
  const script = `import("${path.resolve("bin/entry.mjs")}").then((m) => m.importEntry("src/entry.ts", ${JSON.stringify(ROOT)})).then((e) => console.log(e.from))`;
  return execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" }).trim();
}

describe("the build a command runs", () => {
  write("package.json", '{ "type": "module" }\n');
  write("src/entry.ts", 'export const from: string = "sources";\n');
  write("gen/schema.ts", "export const version = 1;\n");
  write("dist/src/entry.js", 'export const from = "build";\n');
  afterAll(() => fs.rmSync(ROOT, { recursive: true, force: true }));

  it("runs the sources until a build is recorded, then the build", () => {
    expect(isCurrentBuild(ROOT, DIST)).toBe(false);
    expect(loaded()).toBe("sources");
    recordBuild(DIST, sourcesFingerprint(ROOT));
    expect(isCurrentBuild(ROOT, DIST)).toBe(true);
    expect(loaded()).toBe("build");
  });

  it("goes back to the sources when one changes, is added or is removed, or package.json changes", () => {
    recordBuild(DIST, sourcesFingerprint(ROOT));
    write("src/entry.ts", 'export const from: string = "sources"; // edited\n');
    expect(isCurrentBuild(ROOT, DIST)).toBe(false);
    expect(loaded()).toBe("sources");

    recordBuild(DIST, sourcesFingerprint(ROOT));
    write("gen/more.ts", "export {};\n");
    expect(isCurrentBuild(ROOT, DIST)).toBe(false);

    recordBuild(DIST, sourcesFingerprint(ROOT));
    fs.rmSync(path.join(ROOT, "gen/more.ts"));
    expect(isCurrentBuild(ROOT, DIST)).toBe(false);

    recordBuild(DIST, sourcesFingerprint(ROOT));
    write("package.json", '{ "type": "module", "version": "2.0.0" }\n');
    expect(isCurrentBuild(ROOT, DIST)).toBe(false);
  });

  it("builds at the same time leave one whole build and nothing beside it", async () => {
    const out = path.join(".data", `build-swap-test-${process.pid}`);
    const run = () =>
      new Promise<number | null>((resolve) => spawn(process.execPath, ["bin/build.mjs", "--out", out], { stdio: "ignore" }).on("exit", resolve));
    try {
      expect(await Promise.all([run(), run(), run()])).toEqual([0, 0, 0]);
      expect(isCurrentBuild(process.cwd(), out)).toBe(true);
      expect(fs.existsSync(path.join(out, "src", "main.js"))).toBe(true);
      expect(fs.readdirSync(".data").filter((f) => f.startsWith(`${path.basename(out)}.`))).toEqual([]);
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  });

  it("bin/build.mjs records the sources it compiled", () => {
    const out = path.join(".data", `build-record-test-${process.pid}`);
    try {
      execFileSync(process.execPath, ["bin/build.mjs", "--out", out], { stdio: "pipe" });
      expect(isCurrentBuild(process.cwd(), out)).toBe(true);
      const record = JSON.parse(fs.readFileSync(path.join(out, "build.json"), "utf8"));
      expect(record.sources).toBe(sourcesFingerprint(process.cwd()));
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  });
});
