// Fuzz (see fuzz-suite.ts): admin, registry and template routes.
import { defineFuzzSuite } from "./fuzz-suite.js";

defineFuzzSuite("admin, registry, templates", (r) => /^\/api\/(admin|registry|templates)/.test(r.template));
