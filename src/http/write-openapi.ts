// `npm run openapi`: writes the OpenAPI document (openapi.ts) of every served
// service to docs/openapi.json (or the path given), the same document the
// server answers at GET /api/openapi.json. A test keeps the file current.
import fs from "node:fs";
import path from "node:path";
import { SERVED_SERVICES } from "../services/index.js";
import { packageVersion } from "./api-docs.js";
import { buildOpenApi } from "./openapi.js";

export const OPENAPI_FILE = "docs/openapi.json";

/** The file's text: the document, two-space indented, newline-terminated. */
export function openApiText(): string {
  return `${JSON.stringify(buildOpenApi([...SERVED_SERVICES], { packageVersion: packageVersion() }), null, 2)}\n`;
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  const out = path.resolve(process.argv[2] ?? OPENAPI_FILE);
  fs.writeFileSync(out, openApiText());
  console.log(`wrote ${path.relative(process.cwd(), out)}`);
}
