#!/usr/bin/env node
// svc-daemon: the TypeScript provider daemon (src/daemon/ts), from the build
// when it is current, else from the sources (bin/entry.mjs). It runs in this
// very process, so a service manager's stop signal reaches the daemon itself,
// not a wrapper.
import { importEntry } from "./entry.mjs";

const { main } = await importEntry("src/daemon/ts/cli.ts");
process.exitCode = await main(process.argv.slice(2));
