// Fuzz (see fuzz-suite.ts): provider, renter, job and payment routes.
import { defineFuzzSuite } from "./fuzz-suite.js";

defineFuzzSuite("accounts, jobs, payments", (r) => !/^\/api\/(admin|registry|templates)/.test(r.template));
