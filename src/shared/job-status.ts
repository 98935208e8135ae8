// A job's statuses, shared by the server, the CLI and the console: one place
// for which of them are still going and which are an end.
export const ACTIVE_STATUSES = ["queued", "pending", "running"] as const;
export const TERMINAL_STATUSES = ["completed", "failed", "cancelled"] as const;

const TERMINAL: ReadonlySet<string> = new Set(TERMINAL_STATUSES);

/** Whether a job in `status` has ended (completed, failed or cancelled). */
export const isTerminal = (status: string): boolean => TERMINAL.has(status);
