// The one classifier of outbound addresses: every place the service connects
// to a host someone else chose (renter webhooks, providers' /v1 endpoints)
// asks here whether the address is public. Ranges come from ipaddr.js rather
// than a hand-kept table, and IPv6 forms that carry an IPv4 address (mapped,
// NAT64, 6to4) are judged by the IPv4 address they lead to.
import dns from "node:dns";
import net, { type LookupFunction } from "node:net";
import ipaddr from "ipaddr.js";

export interface AddressClass {
  public: boolean;
  /** Why: ipaddr.js's range name ("unicast", "loopback", "private", "6to4"…) or one of ours ("ipv4Compatible", "notGlobal", "invalid"). */
  range: string;
  /** The IPv4 address an IPv6 form leads to, when it leads to one. */
  embedded?: string;
}

const v4 = (bytes: number[]) => ipaddr.fromByteArray(bytes) as ipaddr.IPv4;

function classifyV4(a: ipaddr.IPv4): AddressClass {
  const range = a.range();
  // Everything ipaddr.js names (private, loopback, linkLocal, carrierGradeNat, multicast, reserved…) is not ours to reach.
  return { public: range === "unicast", range };
}

function viaV4(range: string, inner: ipaddr.IPv4): AddressClass {
  const c = classifyV4(inner);
  return { public: c.public, range: c.public ? range : `${range}:${c.range}`, embedded: inner.toString() };
}

function classifyV6(a: ipaddr.IPv6): AddressClass {
  const b = a.toByteArray();
  const w = a.parts;
  const range = a.range();
  // ::ffff:a.b.c.d is how a dual-stack socket dials a.b.c.d.
  if (range === "ipv4Mapped") return viaV4(range, a.toIPv4Address());
  // NAT64's well-known prefix 64:ff9b::/96 reaches the IPv4 address in its last 32 bits;
  // the local-use 64:ff9b:1::/48 (RFC 8215) leads into the operator's own network.
  if (range === "rfc6052") {
    const wellKnown = w[0] === 0x64 && w[1] === 0xff9b && w.slice(2, 6).every((x) => x === 0);
    return wellKnown ? viaV4(range, v4(b.slice(12, 16))) : { public: false, range: "rfc6052:localUse" };
  }
  // 6to4: 2002:AABB:CCDD::/48 is the site behind IPv4 AA.BB.CC.DD.
  if (range === "6to4") return viaV4(range, v4(b.slice(2, 6)));
  if (range !== "unicast") return { public: false, range };
  // ::/8 holds the deprecated IPv4-compatible ::a.b.c.d (which some stacks still route to a.b.c.d)
  // and nothing else in use; outside 2000::/3 no global unicast is allocated.
  if (w[0] >>> 8 === 0) return { public: false, range: w.slice(0, 6).every((x) => x === 0) ? "ipv4Compatible" : "reserved" };
  if (w[0] >>> 13 !== 0b001) return { public: false, range: "notGlobal" };
  return { public: true, range };
}

/**
 * An IPv6 text's dotted IPv4 tail as two hex groups. ipaddr.js reads "::a.b.c.d"
 * as the mapped ::ffff:a.b.c.d; it is the IPv4-compatible ::a.b.c.d (and
 * getaddrinfo prints such answers that way), so the tail is converted first.
 */
function hexTail(v6: string): string {
  return v6.replace(/(\d+)\.(\d+)\.(\d+)\.(\d+)(%.*)?$/, (_m, a, b, c, d, zone = "") => {
    const hi = (Number(a) << 8) | Number(b);
    const lo = (Number(c) << 8) | Number(d);
    return `${hi.toString(16)}:${lo.toString(16)}${zone}`;
  });
}

/** Classifies an IP literal (brackets and an IPv6 zone allowed); anything else is not public ("invalid"). */
export function classifyAddress(text: string): AddressClass {
  const bare = text.trim().replace(/^\[|\]$/g, "");
  const family = net.isIP(bare); // strict forms only: no "127.1" or octal parts
  if (family === 4) return classifyV4(ipaddr.IPv4.parse(bare));
  if (family === 6) return classifyV6(ipaddr.IPv6.parse(hexTail(bare)));
  return { public: false, range: "invalid" };
}

/** True for every address that is not a public unicast one (loopback, private, link-local, CGNAT, IPv6 forms of those…). */
export function isPrivateAddress(text: string): boolean {
  return !classifyAddress(text).public;
}

export function isIpLiteral(host: string): boolean {
  return net.isIP(host.replace(/^\[|\]$/g, "")) !== 0;
}

/**
 * True when a URL host (as `URL.hostname` gives it) is not a public target: a
 * non-public IP literal, or a name that only resolves inside a network
 * (localhost, *.localhost, *.local, *.internal, a single label). Other names
 * are judged by their addresses when connecting (publicOnlyLookup).
 */
export function isPrivateHost(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, "").replace(/\.$/, "").toLowerCase();
  if (isIpLiteral(host)) return isPrivateAddress(host);
  return host === "localhost" || host.endsWith(".localhost") || host.endsWith(".local") || host.endsWith(".internal") || !host.includes(".");
}

/**
 * A `lookup` for http(s).request that resolves names and refuses the host when
 * any of its addresses is not public: the check is made on the addresses
 * actually dialled, so DNS rebinding cannot slip a private one through.
 */
export function publicOnlyLookup(what: string): LookupFunction {
  return (hostname, options, callback) => {
    dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, "", 0);
      const list = addresses as dns.LookupAddress[];
      if (list.length === 0 || list.some((a) => isPrivateAddress(a.address))) {
        return callback(new Error(`${what} host ${hostname} resolves to a private address`), "", 0);
      }
      if (options.all) return (callback as unknown as (e: null, a: dns.LookupAddress[]) => void)(null, list);
      callback(null, list[0].address, list[0].family);
    });
  };
}
