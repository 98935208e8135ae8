// svc: the command-line client of the marketplace, on the generated Connect
// clients (gRPC). Commands for renters, providers and operators (commands/);
// profiles from `svc login`; --json everywhere; exit codes in output.ts (EXIT).
import { Command, CommanderError } from "commander";
import { addAdminCommands } from "./commands/admin.js";
import { contextOf } from "./commands/context.js";
import { addJobCommands } from "./commands/jobs.js";
import { addProfileCommands } from "./commands/profile.js";
import { addProviderCommands } from "./commands/provider.js";
import { addReceiptCommands } from "./commands/receipt.js";
import { addRenterCommands, addUsageCommand } from "./commands/renter.js";
import { EXIT, reportError } from "./output.js";

const EXIT_HELP = `
Exit codes:
  0  done (a followed job completed)
  1  the job failed or was cancelled
  2  usage error: svc's arguments, a profile or the environment, a file it cannot write
     (--out), a URL that does not serve the service's API (its /api prefix, say), or a
     value the server refused (HTTP 400)
  3  authentication: no profile, a bad key or token, or not allowed
  4  server unreachable (no answer from it, none within SVC_TIMEOUT_SECONDS, or none over
     HTTP/2: a proxy that passes only HTTP/1.1, or a URL that is not the service)
  5  the server refused the request or failed (402, 404, 409, 429, 5xx: its error text and
     status are printed, and its request id for a 5xx)
  6  receipt verify: the receipt or the output does not verify

Environment: SVC_PROFILE, SVC_URL, SVC_KEY (renter or provider key: the role is its
prefix's), SVC_ADMIN_TOKEN (the admin role when SVC_KEY is not set), SVC_ROLE,
SVC_CONFIG_DIR (default $XDG_CONFIG_HOME/svc or ~/.config/svc), SVC_TIMEOUT_SECONDS (how
long svc waits for an answer, or for a followed job's first event; default 60, 0 for no limit),
SVC_RECONNECT_SECONDS (how long a followed job's lost connection is tried again without an
event; default 300).`;

export function buildProgram(): Command {
  const program = new Command("svc")
    .description("Command-line client of the GPU compute marketplace")
    .option("--profile <name>", "profile to use (default: SVC_PROFILE, else the first one saved)")
    .option("--json", "print JSON instead of tables (one object per event when following)")
    .addHelpText("after", EXIT_HELP)
    .showHelpAfterError()
    .exitOverride();
  program.configureOutput({ writeErr: (s) => process.stderr.write(s) });

  const ctx = contextOf(program);
  // In the order `svc --help` lists them.
  addProfileCommands(program, ctx);
  addRenterCommands(program, ctx);
  addJobCommands(program, ctx);
  addUsageCommand(program, ctx);
  addProviderCommands(program, ctx);
  addAdminCommands(program, ctx);
  addReceiptCommands(program, ctx);
  return program;
}

/** Runs svc with these arguments; resolves to the exit code. */
export async function main(argv: string[]): Promise<number> {
  // A reader that stops early (`svc jobs list | head`) is not an error: stop quietly, as other tools do.
  process.stdout.on("error", (err: NodeJS.ErrnoException) => {
    if (err.code === "EPIPE") process.exit(EXIT.ok);
    throw err;
  });
  const program = buildProgram();
  try {
    await program.parseAsync(argv, { from: "user" });
    return EXIT.ok;
  } catch (err) {
    if (err instanceof CommanderError) {
      // --help and --version are not errors; commander has printed its message.
      return err.exitCode === 0 ? EXIT.ok : EXIT.usage;
    }
    return reportError(err);
  }
}
