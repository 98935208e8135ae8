// The work a request makes the database do, measured as rows: every statement
// the server's own pool runs while the request is answered is caught (the
// postgres.js `debug` hook of the running server), and each that reads a given
// table is then run again under EXPLAIN (ANALYZE, FORMAT JSON) with the same
// parameters. Its rows visited are the rows every scan node produced plus the
// rows its filter removed, over all its loops: OFFSET rows that a Limit throws
// away count, as PostgreSQL reads them. Not wall time: a count of work.
import type { TestServer } from "../helpers/server.js";

export interface CaughtStatement {
  string: string;
  parameters: unknown[];
}

interface PlanNode {
  "Node Type": string;
  "Actual Rows"?: number;
  "Actual Loops"?: number;
  "Rows Removed by Filter"?: number;
  "Rows Removed by Index Recheck"?: number;
  Plans?: PlanNode[];
}

const scanned = (n: PlanNode): number =>
  (/Scan/.test(n["Node Type"]) ? ((n["Actual Rows"] ?? 0) + (n["Rows Removed by Filter"] ?? 0) + (n["Rows Removed by Index Recheck"] ?? 0)) * (n["Actual Loops"] ?? 1) : 0) +
  (n.Plans ?? []).reduce((s, p) => s + scanned(p), 0);

/** Rows the statement visits when run now: scans' rows (and the ones their filters dropped), over their loops. */
export async function rowsVisited(srv: TestServer, s: CaughtStatement): Promise<number> {
  const plan = await srv.sql.unsafe(`EXPLAIN (ANALYZE, FORMAT JSON) ${s.string}`, s.parameters as never[]);
  return scanned((plan[0]["QUERY PLAN"] as { Plan: PlanNode }[])[0].Plan);
}

/** A read-only statement: a SELECT, or (withQueries) a WITH query that writes nothing. */
const readOnly = (s: string, withQueries: boolean) =>
  /^\s*SELECT\b/i.test(s) || (withQueries && /^\s*WITH\b/i.test(s) && !/\b(INSERT|UPDATE|DELETE)\b/i.test(s));

/** The read-only statements (SELECT; WITH queries too when asked) the server runs during `f` that name `table` (a whole word). */
export async function statementsDuring(srv: TestServer, table: string, f: () => Promise<unknown>, withQueries = false): Promise<CaughtStatement[]> {
  const options = (srv.app.deps.sql as unknown as { options: { debug?: unknown } }).options;
  const caught: CaughtStatement[] = [];
  const before = options.debug;
  options.debug = (_connection: number, string: string, parameters: unknown[]) => caught.push({ string, parameters: [...parameters] });
  try {
    await f();
  } finally {
    options.debug = before;
  }
  const names = new RegExp(`\\b(FROM|JOIN)\\s+${table}\\b`, "i");
  return caught.filter((s) => readOnly(s.string, withQueries) && names.test(s.string));
}

/** The rows `f`'s statements on `table` visit, all together, and the statements. */
export async function workOf(srv: TestServer, table: string, f: () => Promise<unknown>, withQueries = false): Promise<{ rows: number; statements: CaughtStatement[] }> {
  const statements = await statementsDuring(srv, table, f, withQueries);
  let rows = 0;
  for (const s of statements) rows += await rowsVisited(srv, s);
  return { rows, statements };
}
