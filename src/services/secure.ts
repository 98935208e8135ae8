// Wraps a service implementation so that every method first refuses a request
// holding text PostgreSQL cannot store (a NUL or a lone surrogate: src/http/nul.ts), then resolves
// the caller's principal and checks it against the roles declared on the RPC
// in proto. Both wires (gRPC/Connect and REST) call the wrapped implementation.
import { getOption, type DescMethod, type DescService } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { Role, route } from "../../gen/svc/v1/options_pb.js";
import { anyKeyRevoked, constantTimeEqual, roleOfKey } from "../domain/accounts/keys.js";
import { cachedLookupKey, keyHashOf } from "../domain/accounts/key-cache.js";
import { badRequest, forbidden, notFound, unauthorized } from "../errors.js";
import { credentialsKey } from "../http/credentials.js";
import { refuseNul } from "../http/nul.js";
import { principalKey, type Deps, type KeyRowCounter, type Principal } from "./deps.js";
import { adminTokensOf } from "../config.js";
import { trackStream, type TrackedStream } from "../domain/accounts/open-streams.js";
import { deferred, untilRejected } from "../shared/iterables.js";

export function rolesOf(method: DescMethod): Role[] {
  const roles = getOption(method, route).roles;
  return roles.length > 0 ? roles : [Role.PUBLIC];
}

interface Guard {
  roles: Role[];
  /** 404 rather than 401 for a key no account was ever given (route option unknown_key_not_found). */
  unknownKeyNotFound: boolean;
}

function guardOf(method: DescMethod): Guard {
  return { roles: rolesOf(method), unknownKeyNotFound: getOption(method, route).unknownKeyNotFound };
}

interface Authenticated {
  principal: Principal;
  /** The API key that authenticated the call (none for admin and public). */
  key?: string;
}

/**
 * The answer to keys that no live account has: 401 "invalid API key", or 404 "<role> not found" on the routes
 * that say so (unknownKeyNotFound: the `me` reads) when no account was ever given any of them. A key its account
 * revoked (a rotation) worked once and works no more: an invalid key on every route, those included.
 */
async function unknownKeyError(deps: Deps, keys: readonly string[], wanted: Set<string>, unknownKeyNotFound: boolean) {
  if (unknownKeyNotFound && !(await anyKeyRevoked(deps.sql, keys))) return notFound(`${[...wanted].join(" or ")} not found: no account has this API key`);
  return unauthorized("invalid API key");
}

/** Whose admin token among those given this is (every token compared in full, in constant time), or undefined. */
function operatorOf(config: Deps["config"], given: string[]): string | undefined {
  let name: string | undefined;
  for (const t of given) for (const o of adminTokensOf(config)) if (constantTimeEqual(t, o.token)) name ??= o.name;
  return name;
}

async function authenticate(deps: Deps, { roles, unknownKeyNotFound }: Guard, ctx: HandlerContext): Promise<Authenticated> {
  const creds = ctx.values.get(credentialsKey);
  if (roles.includes(Role.ADMIN)) {
    const name = operatorOf(deps.config, creds.adminTokens);
    if (name !== undefined) return { principal: { role: "admin", name } };
  }
  if (roles.includes(Role.PUBLIC)) return { principal: { role: "public" } };

  const wanted = new Set<string>();
  if (roles.includes(Role.PROVIDER)) wanted.add("provider");
  if (roles.includes(Role.RENTER)) wanted.add("renter");
  const keys = creds.keys.filter((k) => wanted.has(roleOfKey(k) ?? ""));
  for (const key of keys) {
    // Cached briefly in process; rotation revokes at once (see key-cache.ts).
    const owner = await cachedLookupKey(deps.sql, key);
    if (!owner) continue;
    if (owner.role === "provider") return { principal: { role: "provider", providerId: owner.accountId }, key };
    if (owner.suspended) throw forbidden("renter account is suspended");
    return { principal: { role: "renter", renterId: owner.accountId }, key };
  }
  if (keys.length > 0) throw await unknownKeyError(deps, keys, wanted, unknownKeyNotFound);
  const adminOnly = wanted.size === 0;
  if (adminOnly) {
    throw unauthorized(creds.adminTokens.length > 0 ? "invalid admin token" : "admin token required (x-admin-token or Authorization: Bearer)");
  }
  const otherKeys = creds.keys.filter((k) => roleOfKey(k) !== undefined);
  if (otherKeys.length > 0) throw forbidden(`this endpoint needs a ${[...wanted].join(" or ")} key`);
  if (creds.keys.length > 0) throw await unknownKeyError(deps, [], wanted, unknownKeyNotFound);
  if (creds.adminTokens.length > 0 && roles.includes(Role.ADMIN)) throw unauthorized("invalid admin token");
  throw badRequest("API key required");
}

/**
 * Authenticates the call, then counts it on its rate-limit row when that row
 * is kept per renter key: against the renter key that authenticated, never a
 * decoy sent beside it. A call that fails authentication counts against the
 * client IP on the same row, and answers 429 once that is over.
 */
async function authenticateAndCount(deps: Deps, guard: Guard, ctx: HandlerContext, count: KeyRowCounter | undefined): Promise<Authenticated> {
  if (!count) return authenticate(deps, guard, ctx);
  const { clientIp } = ctx.values.get(credentialsKey);
  let auth: Authenticated;
  try {
    auth = await authenticate(deps, guard, ctx);
  } catch (err) {
    await count(clientIp, undefined);
    throw err;
  }
  await count(clientIp, auth.principal.role === "renter" ? auth.key : undefined);
  return auth;
}

/**
 * What authentication answers a call that brought no credential at all (and its count against the client's
 * address on a per-renter-key row), judged without its request: the REST transcoder asks before reading the
 * body of a route whose credential cannot be in it. Returns (nothing decided) when the call has a
 * credential or the method is public; a call with neither is always refused.
 */
export async function refuseWithoutCredential(deps: Deps, method: DescMethod, ctx: HandlerContext): Promise<void> {
  const creds = ctx.values.get(credentialsKey);
  const guard = guardOf(method);
  if (creds.keys.length > 0 || creds.adminTokens.length > 0 || guard.roles.includes(Role.PUBLIC)) return;
  await authenticateAndCount(deps, guard, ctx, deps.keyRowCounter?.(method));
}

/** A stream opened with an API key is ended when that key is revoked (open-streams.ts). */
function trackedStream(deps: Deps, { principal, key }: Authenticated): TrackedStream | undefined {
  if (!key) return undefined;
  if (principal.role === "renter") return trackStream(deps.sql, { role: "renter", accountId: principal.renterId, keyHash: keyHashOf(key) });
  if (principal.role === "provider") return trackStream(deps.sql, { role: "provider", accountId: principal.providerId, keyHash: keyHashOf(key) });
  return undefined;
}

type AnyImpl = (req: unknown, ctx: HandlerContext) => unknown;

export function secure<S extends DescService>(deps: Deps, service: S, impl: ServiceImpl<S>): ServiceImpl<S> {
  const out: Record<string, AnyImpl> = {};
  for (const method of service.methods) {
    const fn = (impl as unknown as Record<string, AnyImpl>)[method.localName].bind(impl);
    const guard = guardOf(method);
    const count = deps.keyRowCounter?.(method);
    if (method.methodKind === "unary") {
      const unary: AnyImpl = async (req, ctx) => {
        refuseNul(method.input, req);
        ctx.values.set(principalKey, (await authenticateAndCount(deps, guard, ctx, count)).principal);
        return fn(req, ctx);
      };
      out[method.localName] = unary;
    } else {
      // A server stream's one request is checked here; a daemon stream checks each message it reads.
      const oneRequest = method.methodKind === "server_streaming";
      const streaming: AnyImpl = (req, ctx) =>
        deferred(async () => {
          if (oneRequest) refuseNul(method.input, req);
          const auth = await authenticateAndCount(deps, guard, ctx, count);
          ctx.values.set(principalKey, auth.principal);
          const tracked = trackedStream(deps, auth);
          // The key was checked once, here: the stream ends when the account's keys are revoked (open-streams.ts).
          // Both ways: of what the client sent, nothing the implementation had not read yet (read ahead of
          // it, or still arriving) is taken after the revocation.
          const requests =
            tracked && !oneRequest
              ? untilRejected((req as AsyncIterable<unknown>)[Symbol.asyncIterator](), tracked.revoked, () => {})
              : req;
          let inner: AsyncIterator<unknown>;
          try {
            inner = (fn(requests, ctx) as AsyncIterable<unknown>)[Symbol.asyncIterator]();
          } catch (err) {
            tracked?.release();
            throw err;
          }
          // Ended by revocation, the inner call may still wait in next(): its return() then runs once
          // that settles, which the transports bring about by aborting ctx.signal as the call ends.
          return tracked ? untilRejected(inner, tracked.revoked, () => tracked.release()) : inner;
        });
      out[method.localName] = streaming;
    }
  }
  return out as unknown as ServiceImpl<S>;
}
