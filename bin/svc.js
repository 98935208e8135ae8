#!/usr/bin/env node
// svc: the command-line client (src/cli), from the build when it is current,
// else from the sources (bin/entry.mjs).
import { importEntry } from "./entry.mjs";

const { main } = await importEntry("src/cli/main.ts");
process.exitCode = await main(process.argv.slice(2));
