#!/usr/bin/env node
// svc-daemon: the TypeScript provider daemon. Runs the TypeScript sources in
// this very process (tsx's loader), so a service manager's stop signal
// reaches the daemon itself, not a wrapper.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../src/daemon/ts/cli.ts");
process.exitCode = await main(process.argv.slice(2));
