#!/usr/bin/env node
// svc: the command-line client. Runs the TypeScript sources in this very
// process (tsx's loader), like bin/svc-daemon.js.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../src/cli/main.ts");
process.exitCode = await main(process.argv.slice(2));
