// Open-loop HTTP/1.1 load: the i-th request is due at start + i / rate,
// whatever the answers before it do, and its latency is measured from that
// intended send time. A stall of the server therefore shows in the figures as
// the queue it builds, instead of quietly slowing the generator down
// (coordinated omission). A request goes out on an idle keep-alive socket of
// its port; when none is idle another one is opened, so a slow answer never
// holds back the next send. How late the generator itself sent (timer
// granularity, its own busy event loop, a socket cap reached) is reported
// apart, so a run whose generator fell behind its schedule says so.
import net from "node:net";
import { answerSplitter, percentile } from "./lib.js";

export interface OpenLoopAnswer {
  /** The i-th request of the schedule. */
  i: number;
  status: string;
  body: Buffer;
  /** performance.now() times: when it was due, when it was written, when its answer was read. */
  intendedAt: number;
  sentAt: number;
  answeredAt: number;
}

export interface OpenLoopOptions {
  ports: number[];
  /** Requests per second over all ports (request i goes to ports[i % ports.length]). */
  rate: number;
  seconds: number;
  /** The bytes of request i, for port index `p`. */
  request(i: number, p: number): Buffer;
  /** The status that counts as success (its latencies are the figures); others are counted apart. */
  okStatus: string;
  onAnswer?(a: OpenLoopAnswer): void;
  /** Sockets connected per port before the schedule starts. */
  initialSockets: number;
  /** Most sockets over all ports; past it a due request waits for one (counted: the generator fell behind). */
  maxSockets: number;
  /** How long to wait for the last answers after the last send. */
  drainMs?: number;
}

/** A send later than this after its intended time counts as late. */
export const LATE_SEND_MS = 5;

export interface OpenLoopResult {
  rate_per_s: number;
  duration_s: number;
  scheduled: number;
  answered: number;
  ok: number;
  ok_per_s: number;
  statuses: Record<string, number>;
  /** Sent, never answered within the drain time, or lost with a socket error. */
  unanswered: number;
  /** Successful answers, from each request's intended send time. */
  latenciesMs: Float64Array;
  generator: {
    send_lag_p50_ms: number | null;
    send_lag_p99_ms: number | null;
    send_lag_max_ms: number | null;
    /** Sends more than LATE_SEND_MS after their intended time. */
    late_sends: number;
    sockets: number;
    sockets_opened_during_run: number;
    /** Requests that found every socket busy at the cap and waited for one. */
    waited_for_socket: number;
    max_in_flight: number;
    socket_errors: number;
    /** More than 1% of sends late: the figures then also hold the generator's own delay. */
    fell_behind: boolean;
  };
}

interface Conn {
  p: number;
  sock: net.Socket;
  busy?: { i: number; intendedAt: number; sentAt: number };
  /** Request to write once connected (a socket opened during the run). */
  queued?: { i: number; intendedAt: number };
  idleSince: number;
}

/** An idle socket unused this long is closed rather than reused (the server's keep-alive timeout is 65 s). */
const STALE_SOCKET_MS = 30_000;

export function openLoop(o: OpenLoopOptions): Promise<OpenLoopResult> {
  return new Promise((resolve, reject) => {
    const interval = 1000 / o.rate;
    const total = Math.max(1, Math.round(o.rate * o.seconds));
    const idle: Conn[][] = o.ports.map(() => []);
    const waiting: { i: number; intendedAt: number }[][] = o.ports.map(() => []);
    const all = new Set<Conn>();
    const latencies = new Float64Array(total);
    const lags = new Float64Array(total);
    const statuses: Record<string, number> = {};
    let nLat = 0;
    let nLag = 0;
    let answered = 0;
    let ok = 0;
    let lost = 0;
    let opened = 0;
    let waited = 0;
    let inFlight = 0;
    let maxInFlight = 0;
    let socketErrors = 0;
    let next = 0;
    let start = 0;
    let lastAnswer = 0;
    let started = false;
    let finished = false;
    let drainTimer: NodeJS.Timeout | undefined;

    const write = (c: Conn, i: number, intendedAt: number) => {
      const sentAt = performance.now();
      c.busy = { i, intendedAt, sentAt };
      lags[nLag++] = sentAt - intendedAt;
      inFlight++;
      if (inFlight > maxInFlight) maxInFlight = inFlight;
      c.sock.write(o.request(i, c.p));
    };

    const release = (c: Conn) => {
      const w = waiting[c.p].shift();
      if (w) write(c, w.i, w.intendedAt);
      else {
        c.idleSince = performance.now();
        idle[c.p].push(c);
      }
    };

    const onAnswer = (c: Conn, status: string, body: Buffer) => {
      const answeredAt = performance.now();
      const busy = c.busy;
      if (!busy) return; // nothing asked on this socket
      c.busy = undefined;
      inFlight--;
      answered++;
      lastAnswer = answeredAt;
      statuses[status] = (statuses[status] ?? 0) + 1;
      if (status === o.okStatus) {
        ok++;
        latencies[nLat++] = answeredAt - busy.intendedAt;
      }
      o.onAnswer?.({ i: busy.i, status, body, intendedAt: busy.intendedAt, sentAt: busy.sentAt, answeredAt });
      release(c);
    };

    /** A new keep-alive socket to port `p`; `queued` is written once it is connected. */
    const open = (p: number, queued?: { i: number; intendedAt: number }, ready?: (c: Conn) => void, fail?: (e: Error) => void): Conn => {
      const c: Conn = { p, sock: net.connect(o.ports[p], "127.0.0.1"), queued, idleSince: performance.now() };
      all.add(c);
      c.sock.setNoDelay(true);
      const split = answerSplitter((status, body) => onAnswer(c, status, body));
      c.sock.on("data", (chunk) => {
        split(chunk);
        maybeDone();
      });
      c.sock.once("connect", () => {
        ready?.(c);
        if (c.queued) {
          const q = c.queued;
          c.queued = undefined;
          write(c, q.i, q.intendedAt);
        }
      });
      c.sock.on("error", (err) => {
        if (!started) fail?.(err);
        else socketErrors++;
      });
      c.sock.on("close", () => {
        all.delete(c);
        const list = idle[c.p];
        const at = list.indexOf(c);
        if (at >= 0) list.splice(at, 1);
        if (c.busy || c.queued) {
          if (c.busy) inFlight--;
          c.busy = c.queued = undefined;
          lost++;
        }
        maybeDone();
      });
      return c;
    };

    const dispatch = (i: number, intendedAt: number) => {
      const p = i % o.ports.length;
      // The most recently used idle socket; those left idle too long are closed on the way.
      let c = idle[p].pop();
      while (c && intendedAt - c.idleSince > STALE_SOCKET_MS) {
        c.sock.destroy();
        c = idle[p].pop();
      }
      if (c) return write(c, i, intendedAt);
      if (all.size < o.maxSockets) {
        opened++;
        open(p, { i, intendedAt });
        return;
      }
      waited++;
      waiting[p].push({ i, intendedAt });
    };

    const tick = () => {
      const now = performance.now();
      while (next < total && start + next * interval <= now) {
        dispatch(next, start + next * interval);
        next++;
      }
      if (next < total) setTimeout(tick, Math.max(0, start + next * interval - performance.now()));
      else {
        drainTimer = setTimeout(finish, o.drainMs ?? 10_000);
        maybeDone();
      }
    };

    function maybeDone() {
      if (!started || finished || next < total) return;
      if (inFlight > 0 || waiting.some((w) => w.length > 0) || [...all].some((c) => c.queued)) return;
      finish();
    }

    function finish() {
      if (finished) return;
      finished = true;
      clearTimeout(drainTimer);
      const stillWaiting = waiting.reduce((n, w) => n + w.length, 0);
      const unanswered = inFlight + stillWaiting + lost + [...all].filter((c) => c.queued).length;
      for (const c of all) c.sock.destroy();
      const lat = latencies.slice(0, nLat);
      const lag = lags.slice(0, nLag);
      const late = lag.reduce((n, v) => n + (v > LATE_SEND_MS ? 1 : 0), 0);
      const elapsedS = Math.max(o.seconds, (lastAnswer - start) / 1000);
      resolve({
        rate_per_s: o.rate,
        duration_s: Math.round(elapsedS * 100) / 100,
        scheduled: total,
        answered,
        ok,
        ok_per_s: Math.round(ok / elapsedS),
        statuses,
        unanswered,
        latenciesMs: lat,
        generator: {
          send_lag_p50_ms: percentile(lag, 50),
          send_lag_p99_ms: percentile(lag, 99),
          send_lag_max_ms: percentile(lag, 100),
          late_sends: late,
          sockets: o.ports.length * o.initialSockets + opened,
          sockets_opened_during_run: opened,
          waited_for_socket: waited,
          max_in_flight: maxInFlight,
          socket_errors: socketErrors,
          fell_behind: late + stillWaiting > total / 100,
        },
      });
    }

    Promise.all(o.ports.flatMap((_, p) => Array.from({ length: o.initialSockets }, () => new Promise<Conn>((ready, fail) => open(p, undefined, ready, fail)))))
      .then((conns) => {
        for (const c of conns) idle[c.p].push(c);
        started = true;
        start = performance.now() + 5;
        setTimeout(tick, 5);
      })
      .catch((err) => {
        for (const c of all) c.sock.destroy();
        reject(err);
      });
  });
}

/**
 * The open-loop rate from the --open-loop flag: "half" is half of the
 * saturated phase's rate (measured just before), a number is that rate per second.
 */
export function openLoopRate(flag: string, saturatedPerS: number): number {
  if (flag === "half") return Math.max(1, Math.round(saturatedPerS / 2));
  const n = Number(flag);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--open-loop must be "half" or a rate per second, not ${JSON.stringify(flag)}`);
  return n;
}
