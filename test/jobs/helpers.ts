// Shared bits of the jobs tests.
import type { TestServer } from "../helpers/server.js";

export { clearMarketplace } from "../helpers/isolation.js";

export const admin = (srv: TestServer) => ({ "x-admin-token": srv.config.adminToken });
