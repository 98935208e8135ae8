#!/usr/bin/env python3
"""svc provider daemon (legacy JSON protocol).

Turns a GPU host into a marketplace node: heartbeats with nvidia-smi
telemetry, a readiness report at start, daemon events, job polling,
task-signature verification, job execution (docker, or a plain process for
jobs that need no container), logs, progress and the final result. Jobs run
concurrently, one per GPU (the server sends a provider as many at once as it
has GPUs), each on its own thread; a host without GPUs runs one at a time.

Python 3 standard library only. The server fills in the backend URL, the
provider key and the task-signing secret when it serves this file
(GET /api/providers/download/daemon, the key in the x-provider-key header).
Each can be overridden:

  --url / SVC_BACKEND_URL     backend origin
  SVC_API_KEY                 provider key (--key KEY works too, but puts the
                              key in the process list, where every user of
                              the host can read it)
  --heartbeat-seconds / SVC_HEARTBEAT_SECONDS   (default 30)
  --poll-seconds / SVC_POLL_SECONDS             (default 10)
  --result-retry-seconds / SVC_RESULT_RETRY_SECONDS   (default 10)
  --result-keep-seconds / SVC_RESULT_KEEP_SECONDS     (default 3600)
        a job result is kept under the work dir before it is first sent, so that
        a restart (or a kill) keeps it too; one the server could not take (a 5xx,
        no answer: the server restarting, its database away; a 401: its key
        rotated, and replaced at the next start) is sent again every retry-seconds
        until the server answers it (a 4xx refusal ends it as well) or
        keep-seconds have passed since it was first sent, when it is given up
        and logged.
  --key-refused-seconds / SVC_KEY_REFUSED_SECONDS   (default 60)
        how long every request's refusal of the provider key (401: the key was
        rotated or revoked while the daemon ran) lasts before the running jobs,
        which can no longer be reported on, are stopped as the provider's
        interruption (their reports kept, as above, for a start with the new key),
        so that a job the server hands to another provider does not run twice
  --runner TYPE=COMMAND / SVC_RUNNERS="TYPE=COMMAND;..."
        run jobs of TYPE with a local program instead of a container. The
        program gets the job as JSON on stdin, SVC_RESULT_FILE / SVC_WORKSPACE
        in its environment; stdout lines become job logs, a line
        "SVC_PROGRESS <pct> [phase]" reports progress (the latest is sent at most
        once a second, and before the result), and the JSON written to
        SVC_RESULT_FILE (else the printed text as {"response": ...}) is the result.
        SVC_WORKSPACE is the job's while it runs: it is removed, with all in it,
        once the job has ended and its result is read.
  --serve-port / SVC_SERVE_PORT    first host port a vllm_serve engine (or a custom_container's
        expose_port) is published on:
        this port plus the job's GPU index (default 0: any free port)
  --public-host / SVC_PUBLIC_HOST  the address a served endpoint is reached at;
        unset, only the port is reported and the server joins it to the
        provider's address on record
  SVC_NVIDIA_SMI, SVC_DOCKER  paths of nvidia-smi and docker
  SVC_WORK_DIR                job workspaces (default ~/.svc-daemon/work)
  SVC_STOP_GRACE_SECONDS      how long SIGTERM waits for the running jobs (default 20)
  CUDA_VISIBLE_DEVICES        the GPUs this daemon offers and runs jobs on: nvidia-smi
        indices or GPU UUIDs, comma-separated (unset: every GPU; empty: none)
"""

import base64
import collections
import errno
import hashlib
import hmac
import http.client
import json
import os
import platform
import queue
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

DAEMON_VERSION = "{{DAEMON_VERSION}}"
BACKEND_URL = "{{BACKEND_URL}}"
API_KEY = "{{API_KEY}}"
HMAC_SECRET = "{{HMAC_SECRET}}"
# The secret served in this file is this provider's own (tasks sent to other
# providers are signed with theirs); the readiness report tells the server so.
# SVC_HMAC_SECRET in the environment replaces it with the service-wide one.
TASK_SIGNING_OWN = "provider"
# The programs the built-in job types run inside their image: the same files as
# the TypeScript daemon's container-scripts/, filled in when this file is served
# ({"llm.py": "<source>", ...}); written under the work folder and mounted read-only.
CONTAINER_SCRIPTS = {}  # {{CONTAINER_SCRIPTS}}
SCRIPT_OF_JOB_TYPE = {"llm-inference": "llm.py", "llm_inference": "llm.py", "image_generation": "image.py",
                      "rendering": "render.py", "training": "train.py"}

PROGRESS_PREFIX = "SVC_PROGRESS"
# The longest progress phase the server takes (UTF-16 code units, as it counts them): a longer one is cut.
MAX_PHASE_CHARS = 200
# A job's progress lines are coalesced: the latest is sent at most this often, and once more at the job's end.
PROGRESS_SECONDS = 1.0
LOG_FLUSH_SECONDS = 1.0
LOG_BATCH_LINES = 100
CANCEL_CHECK_SECONDS = 3.0
# How long a job's output is read after its program exited: a process it left holding the output (a
# child it did not wait for) is then killed with its group, as the TypeScript daemon does (child.ts).
OUTPUT_AFTER_EXIT_SECONDS = 2.0
CONFIRM_RETRY_SECONDS = 5.0
GONE = "gone"  # job_status: the job is no longer this provider's
# job_status: the provider key has been refused (401) for key_refused_seconds: rotated or revoked while the daemon
# ran. Its jobs can no longer be reported on, and the server hands them to another provider once it has heard
# nothing from this one for 120 s: they are stopped rather than run twice.
KEY_REFUSED = "key_refused"
# vllm_serve: how often the engine's health is probed until it answers, and how soon an
# endpoint-ready report the server could not take for now is sent again.
SERVE_HEALTH_SECONDS = 2.0
ENDPOINT_RETRY_SECONDS = 5.0
# A job's result file is read only when it is a regular file (no symbolic link followed, no FIFO
# or device opened in a way that could block) of at most this size (8 MiB); else the job failed.
MAX_RESULT_FILE_BYTES = 8 * 1024 * 1024
# The deepest a result file's JSON may nest objects and arrays: the server refuses a report past its own
# limit (a body 100 levels deep, its own object counted, so its result 99), which would leave the job running.
MAX_RESULT_DEPTH = 99
# The largest job-result body the server takes (16 MiB): a result over it is the job's failure.
MAX_REPORT_BYTES = 16 * 1024 * 1024
# The longest output line kept (bytes): the rest of a longer line is dropped, up to its newline.
MAX_LINE_BYTES = 16000
# How much of the job's output is kept for its result when it writes no result file.
MAX_KEPT_OUTPUT = 1000000
# How much of a job's output waits between the thread that reads it and the job's loop that sends it (as
# many lines as the server keeps of an attempt, 4 MB of text): a job printing faster than its lines can be
# sent has the rest dropped (and counted) rather than held, however long it prints.
MAX_QUEUED_LINES = 10000
MAX_QUEUED_CHARS = 4000000
# Log lines are sent once this many characters are waiting (the logs route takes 1 MiB a call).
LOG_BATCH_CHARS = 100000
# While the server has asked the daemon to wait (a 429: the provider's per-IP request budget is spent), a
# job's log lines are held, up to ten batches of them, and sent once the wait is over; later lines are
# dropped meanwhile (a line in the job's log says how many). At the job's end its last lines and progress
# wait for it up to END_WAIT_SECONDS before its result is reported.
MAX_HELD_LOG_LINES = 10 * LOG_BATCH_LINES
MAX_HELD_LOG_CHARS = 10 * LOG_BATCH_CHARS
END_WAIT_SECONDS = 60.0
# How long to wait after a 429 that names no wait (no Retry-After, no "retry in N s"), and the most any
# answer is obeyed for.
DEFAULT_RETRY_AFTER_SECONDS = 5.0
MAX_RETRY_AFTER_SECONDS = 600.0
# At a stop: how long past the stop grace the reports handing back the jobs it stopped may take.
STOP_REPORT_SECONDS = 5.0
# How long one `docker pull` of a job's missing image may run (it also ends in time for the job's
# own deadline, so that a hung pull is reported as this machine's failure, not the renter's timeout).
PULL_LIMIT_SECONDS = 1800.0
# A pull told to the server as preparing (POST /api/jobs/{id}/preparing): a notice this often keeps the
# job for another pickup window (120 s); the server takes it back 30 minutes after its assignment, and
# the daemon gives up a little before that.
PREPARE_NOTICE_SECONDS = float(os.environ.get("SVC_PREPARE_NOTICE_SECONDS") or 30.0)
PREPARE_WAIT_SECONDS = float(os.environ.get("SVC_PREPARE_WAIT_SECONDS") or 25 * 60.0)


# ---------------------------------------------------------------- signing --
# Canonical JSON per RFC 8785, identical to the server's canonicalJson():
# keys sorted by UTF-16 code units, no whitespace, strings escaped the way
# ECMAScript JSON.stringify escapes them, numbers in ECMAScript's shortest
# round-trip form (1.0 -> "1", 1e21 -> "1e+21", 1e-7 -> "1e-7").

def _es_number(value):
    if isinstance(value, int):
        if abs(value) < 2 ** 53:
            return str(value)
        value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("non-finite number in task spec")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp = repr(abs(value)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    point = len(int_part) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        text = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + text


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _es_string(value):
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append("\\u%04x" % code)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf16_key(key):
    return key.encode("utf-16-be", "surrogatepass")


def canonical_json(value):
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return _es_number(value)
    if isinstance(value, str):
        return _es_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value.keys(), key=_utf16_key)
        return "{" + ",".join(_es_string(k) + ":" + canonical_json(value[k]) for k in keys) + "}"
    raise TypeError("cannot canonicalise %r" % type(value))


def sign_task(secret, task_spec):
    data = canonical_json(task_spec).encode("utf-8")
    return hmac.new(secret.encode("utf-8"), data, hashlib.sha256).hexdigest()


# Whose fault each end reason this daemon reports is (the server's table, docs/daemons.md).
FAULT_OF = {"runtime_error": "renter", "timeout": "renter", "provider_error": "provider",
            "provider_interrupted": "provider", "signature_mismatch": "provider", "unsupported_on_provider": "provider"}


def verify_task(secret, task_spec, signature):
    if not isinstance(signature, str) or len(signature) != 64:
        return False
    try:
        expected = sign_task(secret, task_spec)
    except (TypeError, ValueError):
        return False
    return hmac.compare_digest(expected, signature.lower())


def signed_job(job):
    """The polled job as its signed task_spec says it: the HMAC covers task_spec only, so the job_type that
    picks the executor and the max_duration_seconds that arms the kill timer are taken from it (its
    job_type, limits.max_duration_seconds), never from the unsigned fields beside it. Returns (job, None),
    or (None, why) when those fields (and job_id) disagree with the signed ones or it names none."""
    spec = job.get("task_spec")
    if not isinstance(spec, dict):
        return None, "the signed task is not an object"
    limits = spec.get("limits") if isinstance(spec.get("limits"), dict) else {}
    job_type, max_seconds = spec.get("job_type"), limits.get("max_duration_seconds")
    if not isinstance(job_type, str) or not job_type:
        return None, "the signed task names no job_type"
    if not (isinstance(max_seconds, (int, float)) and not isinstance(max_seconds, bool) and max_seconds > 0):
        return None, "the signed task names no limits.max_duration_seconds"
    for field, signed in (("job_type", job_type), ("max_duration_seconds", max_seconds), ("job_id", spec.get("job_id"))):
        outer = job.get(field)
        if signed is not None and outer is not None and outer != signed:
            return None, "the job's %s (%s) is not the signed task's (%s)" % (field, json.dumps(outer), json.dumps(signed))
    return dict(job, job_type=job_type, max_duration_seconds=max_seconds), None


# -------------------------------------------------------------- telemetry --

GPU_QUERY = [
    "index", "name", "uuid", "memory.total", "memory.used", "memory.free", "utilization.gpu",
    "utilization.memory", "temperature.gpu", "power.draw", "power.limit", "clocks.sm",
    "driver_version", "pci.bus_id", "compute_cap",
]


def _smi_value(raw):
    raw = raw.strip()
    if raw == "" or raw.startswith("[") or raw in ("N/A", "Not Supported"):
        return None
    return raw


def _num(raw, cast=float):
    raw = _smi_value(raw) if isinstance(raw, str) else raw
    if raw is None:
        return None
    try:
        return cast(float(raw)) if cast is int else cast(raw)
    except ValueError:
        return None


def parse_gpu_csv(text, fields=None):
    """Rows of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`."""
    fields = fields or GPU_QUERY
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < len(fields):
            continue
        # A name may contain a comma: join the surplus into the name cell.
        surplus = len(cells) - len(fields)
        name_at = fields.index("name")
        cells[name_at:name_at + surplus + 1] = [", ".join(cells[name_at:name_at + surplus + 1])]
        row = dict(zip(fields, cells))
        gpus.append({
            "index": _num(row.get("index", ""), int),
            "name": _smi_value(row.get("name", "")) or "unknown",
            "uuid": _smi_value(row.get("uuid", "")),
            "vram_mib": _num(row.get("memory.total", ""), int),
            "vram_used_mib": _num(row.get("memory.used", ""), int),
            "vram_free_mib": _num(row.get("memory.free", ""), int),
            "utilization_pct": _num(row.get("utilization.gpu", "")),
            "memory_utilization_pct": _num(row.get("utilization.memory", "")),
            "temperature_c": _num(row.get("temperature.gpu", "")),
            "power_w": _num(row.get("power.draw", "")),
            "power_limit_w": _num(row.get("power.limit", "")),
            "sm_clock_mhz": _num(row.get("clocks.sm", ""), int),
            "driver_version": _smi_value(row.get("driver_version", "")),
            "pci_bus_id": _smi_value(row.get("pci.bus_id", "")),
            "compute_capability": _smi_value(row.get("compute_cap", "")),
        })
    return gpus


def parse_cuda_version(text):
    marker = "CUDA Version:"
    at = text.find(marker)
    if at < 0:
        return None
    rest = text[at + len(marker):].strip().split()
    return rest[0] if rest else None


def visible_gpus(gpus, spec):
    """The GPUs an operator's CUDA_VISIBLE_DEVICES (spec; None when unset: every GPU) leaves this
    daemon, in nvidia-smi's order. Its entries are nvidia-smi indices or GPU UUIDs ("GPU-...", or a
    prefix naming one GPU); as CUDA reads it, the list ends at the first entry that names no GPU, so
    "" and "-1" leave none."""
    if spec is None:
        return list(gpus)
    chosen = set()
    for entry in spec.split(","):
        entry = entry.strip().lower()
        if entry.isdigit() and entry.isascii():
            match = [at for at, g in enumerate(gpus) if g.get("index") == int(entry)]
        elif entry.startswith("gpu-") and len(entry) > 4:
            match = [at for at, g in enumerate(gpus) if (g.get("uuid") or "").lower().startswith(entry)]
        else:
            match = []
        if len(match) != 1:
            break
        chosen.add(match[0])
    return [g for at, g in enumerate(gpus) if at in chosen]


class Gpus:
    def __init__(self, smi="nvidia-smi", visible=None):
        self.smi = smi
        self.visible = visible  # CUDA_VISIBLE_DEVICES of the daemon's environment (visible_gpus)
        self.cuda_version = None
        self._cuda_checked = False

    def _run(self, args):
        try:
            out = subprocess.run([self.smi] + args, capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    def query(self):
        """The GPUs this daemon may use (all, or those CUDA_VISIBLE_DEVICES names), [] when there is no
        NVIDIA driver (CPU-only jobs still run). The heartbeat reports these, so the server sends as many
        jobs at once as the daemon has GPUs to hand out."""
        fields = list(GPU_QUERY)
        text = self._run(["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
        if text is None:
            # Drivers before 510 do not know compute_cap.
            fields.remove("compute_cap")
            text = self._run(["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
        if text is None:
            return []
        if not self._cuda_checked:
            self._cuda_checked = True
            self.cuda_version = parse_cuda_version(self._run([]) or "")
        return visible_gpus(parse_gpu_csv(text, fields), self.visible)


def gpu_status(gpus, cuda_version):
    """The heartbeat gpu_status object (documented fields)."""
    first = gpus[0] if gpus else {}
    return {
        "gpu_name": first.get("name") or "none",
        "gpu_vram_mib": first.get("vram_mib") or 0,
        "driver_version": first.get("driver_version") or "",
        "gpu_util_pct": first.get("utilization_pct") or 0,
        "temp_c": first.get("temperature_c") or 0,
        "power_w": first.get("power_w") or 0,
        "free_vram_mib": first.get("vram_free_mib") or 0,
        "daemon_version": DAEMON_VERSION,
        "python_version": platform.python_version(),
        "os_info": platform.platform(),
        "compute_capability": first.get("compute_capability") or "",
        "cuda_version": cuda_version or "",
        "gpu_count": len(gpus),
        "all_gpus": gpus,
    }


def resource_spec():
    spec = {"cpu_count": os.cpu_count() or 1}
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
        spec["ram_gb"] = round(pages * size / 1024 ** 3, 1)
    except (ValueError, OSError, AttributeError):
        pass
    try:
        usage = shutil.disk_usage(os.path.expanduser("~"))
        spec["disk_free_gb"] = round(usage.free / 1024 ** 3, 1)
    except OSError:
        pass
    return spec


def version_tuple(text):
    parts = []
    for piece in str(text).split("-")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


# -------------------------------------------------------------------- api --

class ApiError(Exception):
    def __init__(self, status, message, retry_after=None):
        Exception.__init__(self, "HTTP %s: %s" % (status, message))
        self.status = status
        self.message = message
        # Seconds the server asked to wait before the next request (retry_after_seconds), else None.
        self.retry_after = retry_after


def retry_after_seconds(status, header, message):
    """How long an answer asks the daemon to wait before its next request, in seconds: its Retry-After
    header (seconds), else the "retry in N s" of the server's 429 message, else DEFAULT_RETRY_AFTER_SECONDS
    for a 429; None for an answer that asks for no wait (a 503 with a Retry-After asks too)."""
    if status not in (429, 503):
        return None
    seconds = None
    try:
        seconds = float(str(header).strip()) if header is not None else None
    except ValueError:
        seconds = None  # an HTTP date: the message's seconds, or the default
    if seconds is None or seconds != seconds:
        found = re.search(r"retry in ([0-9]+(?:\.[0-9]+)?) ?s\b", str(message))
        seconds = float(found.group(1)) if found else None
    if seconds is None:
        if status != 429:
            return None
        seconds = DEFAULT_RETRY_AFTER_SECONDS
    return max(1.0, min(MAX_RETRY_AFTER_SECONDS, seconds))


def _tracked_connection(api, base):
    """http.client's connection class `base`, whose socket the requesting thread holds in api.in_flight."""
    class Tracked(base):
        def connect(self):
            super().connect()
            with api.in_flight_lock:
                api.in_flight[threading.get_ident()] = self.sock
    return Tracked


class _TrackedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, api):
        super().__init__()
        self.connection = _tracked_connection(api, http.client.HTTPConnection)

    def http_open(self, req):
        return self.do_open(self.connection, req)


class _TrackedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, api):
        super().__init__()
        self.connection = _tracked_connection(api, http.client.HTTPSConnection)

    def https_open(self, req):
        return self.do_open(self.connection, req, context=self._context)


class Api:
    def __init__(self, base_url, api_key, timeout=30):
        self.base = base_url.rstrip("/")
        self.key = api_key
        self.timeout = timeout
        # Since when every answer refused the key (401), none taken since (time.monotonic()); None while it works.
        self.refused_since = None
        # Set at a stop (time.monotonic()): a request started before it ends by then, one started later (a
        # stopped job's hand-back) by STOP_REPORT_SECONDS after it; cut() ends those under way.
        self.stop_deadline = None
        self.in_flight = {}  # thread ident -> the socket of its request under way
        self.in_flight_lock = threading.Lock()
        self.opener = urllib.request.build_opener(_TrackedHTTPHandler(self), _TrackedHTTPSHandler(self))

    def cut(self):
        """Ends every request under way now: its thread gets no answer (ApiError with status 0)."""
        with self.in_flight_lock:
            socks = list(self.in_flight.values())
        for sock in socks:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile

    def key_refused_for(self):
        """Seconds the server has refused the key without taking it in between; 0 while it takes it."""
        since = self.refused_since
        return 0.0 if since is None else time.monotonic() - since

    def _request(self, method, path, body=None, query=None, raw=False, timeout=None):
        """The answer's JSON (or bytes with raw). ApiError with the HTTP status on a refusal, with
        status 0 when no usable answer came (no connection, cut off mid-answer, not JSON)."""
        url = self.base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None
        headers = {"user-agent": "svc-daemon/" + DAEMON_VERSION, "accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["content-type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        if self.key:
            # The key goes in a header, never in a URL (which proxies and server logs keep), and is not
            # sent on to wherever a redirect points.
            req.add_unredirected_header("x-provider-key", self.key)
        timeout = timeout or self.timeout
        if self.stop_deadline is not None:
            now = time.monotonic()
            ends = self.stop_deadline if now < self.stop_deadline else self.stop_deadline + STOP_REPORT_SECONDS
            if now >= ends:
                raise ApiError(0, "not sent: the daemon is stopping and its stop grace is over")
            timeout = min(timeout, ends - now)
        try:
            with self.opener.open(req, timeout=timeout) as res:
                payload = res.read()
        except urllib.error.HTTPError as err:
            try:
                text = err.read().decode("utf-8", "replace")
            except (OSError, http.client.HTTPException):
                text = ""
            try:
                message = json.loads(text).get("error", text)
            except (ValueError, AttributeError, RecursionError):
                message = text
            header = err.headers.get("Retry-After") if err.headers is not None else None
            if err.code == 401 and self.refused_since is None:
                self.refused_since = time.monotonic()
            raise ApiError(err.code, message, retry_after_seconds(err.code, header, message))
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            # HTTPException: the server went away mid-answer (IncompleteRead, BadStatusLine).
            raise ApiError(0, str(getattr(err, "reason", err)) or type(err).__name__)
        finally:
            with self.in_flight_lock:
                self.in_flight.pop(threading.get_ident(), None)
        self.refused_since = None
        if raw:
            return payload
        try:
            return json.loads(payload.decode("utf-8")) if payload else {}
        except ValueError:
            raise ApiError(0, "the answer was not JSON: %r" % payload[:200])
        except RecursionError:
            # JSON nested deeper than Python's parser reads: no answer of the server's is.
            raise ApiError(0, "the answer nests too deep to read: %r" % payload[:200])

    def post(self, path, body, timeout=None):
        return self._request("POST", path, dict(body, api_key=self.key), timeout=timeout)

    def get(self, path, query=None, raw=False):
        return self._request("GET", path, query=query, raw=raw)


# -------------------------------------------------------------- executors --

def _popen_group_kwargs():
    if os.name == "nt":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def _kill_tree(proc, sig=None):
    """Signals the job's whole process group, also after its leader exited: what it started may still run."""
    try:
        if os.name == "nt":
            if proc.poll() is None:
                proc.kill()
        else:
            os.killpg(proc.pid, sig or signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


BENCHMARK_CODE = r'''
import json, os, sys, time
task = json.load(sys.stdin)
inputs = (task.get("task_spec") or {}).get("inputs") or {}
suite = inputs.get("suite") or "quick"
iterations = max(1, min(1000, int(inputs.get("iterations") or 10)))
if suite not in ("quick", "matmul", "memory", "full"):
    sys.stderr.write("benchmark suite %r needs a model runtime; this daemon runs quick, matmul, memory and full\n" % suite)
    sys.exit(2)
tests = {"quick": ["matmul"], "matmul": ["matmul"], "memory": ["memory"], "full": ["matmul", "memory"]}[suite]

def matmul(n=48):
    a = [[float((i * n + j) % 7 + 1) for j in range(n)] for i in range(n)]
    cols = list(zip(*a))
    t = time.perf_counter()
    [[sum(x * y for x, y in zip(row, col)) for col in cols] for row in a]
    return 2 * n ** 3 / (time.perf_counter() - t) / 1e9

def memory(size=32 * 1024 * 1024):
    src = bytearray(b"\x07") * size
    t = time.perf_counter()
    bytes(src)
    return 2 * size / (time.perf_counter() - t) / 1e9

scores, step = {}, 0
for test in tests:
    samples = []
    for _ in range(iterations):
        samples.append(matmul() if test == "matmul" else memory())
        step += 1
        print("SVC_PROGRESS %d %s" % (100 * step // (len(tests) * iterations), test), flush=True)
    samples.sort()
    median = samples[len(samples) // 2]
    scores["cpu_matmul_gflops" if test == "matmul" else "memory_copy_gb_s"] = round(median, 4)
    print("%s: median %.4f over %d runs" % (test, median, iterations), flush=True)
with open(os.environ["SVC_RESULT_FILE"], "w") as f:
    json.dump({"scores": scores, "suite": suite, "iterations": iterations,
               "response": " ".join("%s=%s" % kv for kv in sorted(scores.items()))}, f)
'''


class JobRun:
    """One job's child process: line-by-line output, progress, kill. `lines` carries the job's output
    lines to its loop (str), a count of lines dropped before the next one (int), and None at its end.
    `output` (the first MAX_KEPT_OUTPUT characters of its lines that are no progress) and `tail` (the
    last of them) are complete once None came."""

    def __init__(self, argv, stdin_text, env, cwd, kill_hook=None, on_group=None):
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, cwd=cwd, **_popen_group_kwargs())
        # on_group(pgid) is told of the job's process group; what it returns, once the job has ended
        # (record_job_process: killed at the next start if this daemon dies meanwhile).
        self.group_ended = on_group(self.proc.pid) if on_group and os.name != "nt" else None
        self.lines = queue.Queue()
        self.queued_lock = threading.Lock()
        self.queued_lines = self.queued_chars = 0  # str items in `lines` not yet taken
        self.dropped = 0  # lines dropped since the last one queued
        self.dropped_progress = None  # the latest progress line dropped meanwhile
        self.output, self.kept = [], 0
        self.tail = collections.deque(maxlen=5)
        self.kill_hook = kill_hook
        threading.Thread(target=self._feed, args=(stdin_text,), daemon=True).start()
        threading.Thread(target=self._read, daemon=True).start()

    def _feed(self, text):
        try:
            self.proc.stdin.write(text.encode("utf-8"))
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def _read(self):
        # Each line cut at MAX_LINE_BYTES: a line without end is never held in memory whole.
        skipping = False
        while True:
            raw = self.proc.stdout.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            if not skipping:
                self._line(raw[:MAX_LINE_BYTES].decode("utf-8", "replace").rstrip("\r\n"))
            skipping = not raw.endswith(b"\n")
        self.proc.stdout.close()
        self._flush_dropped()
        self.lines.put(None)

    def _line(self, line):
        """Keeps a line for the result and queues it for the job's loop, or drops it while MAX_QUEUED_LINES
        or MAX_QUEUED_CHARS wait there already (a progress line is kept aside, the latest one)."""
        progress = parse_progress(line) is not None
        if not progress:
            self.tail.append(line)
            if self.kept < MAX_KEPT_OUTPUT:
                self.output.append(line)
                self.kept += len(line) + 1
        # Once lines are dropped, none is queued again until half the queue has been taken: a line in the job's
        # log says how many went each time.
        share = 2 if self.dropped or self.dropped_progress is not None else 1
        with self.queued_lock:
            room = (self.queued_lines < MAX_QUEUED_LINES // share
                    and self.queued_chars + len(line) <= MAX_QUEUED_CHARS // share)
        if not room:
            if progress:
                self.dropped_progress = line
            else:
                self.dropped += 1
            return
        self._flush_dropped()
        self._queue(line)

    def _flush_dropped(self):
        """What was dropped since the last queued line, queued before the next: its count, and its latest progress."""
        if self.dropped:
            self.lines.put(self.dropped)
            self.dropped = 0
        if self.dropped_progress is not None:
            self._queue(self.dropped_progress)
            self.dropped_progress = None

    def _queue(self, line):
        with self.queued_lock:
            self.queued_lines += 1
            self.queued_chars += len(line)
        self.lines.put(line)

    def taken(self, line):
        """The job's loop took a line off `lines`."""
        with self.queued_lock:
            self.queued_lines -= 1
            self.queued_chars -= len(line)

    def stop(self):
        if self.kill_hook:
            self.kill_hook()
        if self.proc.poll() is None and os.name != "nt":
            _kill_tree(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        _kill_tree(self.proc)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return
        self.ended()

    def wait(self):
        """Waits for the job's process to end; its exit status. What it left running in its group (a
        child it started and did not wait for) is killed with it: the GPU goes to the next job."""
        code = self.proc.wait()
        if os.name != "nt":
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        self.ended()
        return code

    def ended(self):
        if self.group_ended:
            self.group_ended()
            self.group_ended = None


def _not_json_constant(name):
    raise ValueError("%s is not a JSON value" % name)


def _finite_number(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("the number %s is out of range" % text[:40])
    return value


def json_depth_exceeds(value, limit):
    """Whether a parsed JSON value nests objects and arrays more than `limit` deep (a scalar is 0 deep)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def parse_result_json(data):
    """A result file's bytes as the server reads JSON: NaN, Infinity and numbers past a double's range (which
    Python reads and writes back as no JSON parser takes) are refused, and so is nesting past
    MAX_RESULT_DEPTH. ValueError says why."""
    too_deep = ValueError("it nests objects and arrays deeper than %d levels, the most a result may" % MAX_RESULT_DEPTH)
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_not_json_constant, parse_float=_finite_number)
    except RecursionError:
        raise too_deep
    if json_depth_exceeds(value, MAX_RESULT_DEPTH):
        raise too_deep
    return value


def read_result_file(path, max_bytes=MAX_RESULT_FILE_BYTES):
    """A job's result file, trusting nothing about it: ("absent", None) when there is none, ("ok", value),
    or ("error", why) when it is not a regular file (a symbolic link is not followed, a FIFO is opened
    without blocking and refused), is larger than max_bytes, or is not JSON the server takes
    (parse_result_json)."""
    if not hasattr(os, "O_NOFOLLOW") and os.path.islink(path):
        return "error", "the job's result file is a symbolic link; only a regular file is read"
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return "absent", None
        if err.errno in (errno.ELOOP, getattr(errno, "EMLINK", -1)):
            return "error", "the job's result file is a symbolic link; only a regular file is read"
        return "error", "the job's result file could not be opened: %s" % (errno.errorcode.get(err.errno) or err)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
            return "error", "the job's result file is not a regular file (%s); only a regular file is read" % kind
        if st.st_size > max_bytes:
            return "error", "the job's result file is %d bytes, over the %d-byte limit" % (st.st_size, max_bytes)
        chunks, got = [], 0
        while got <= max_bytes:  # to one byte past the limit: the file may still grow
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            return "error", "the job's result file is over the %d-byte limit" % max_bytes
        try:
            return "ok", parse_result_json(b"".join(chunks))
        except ValueError as err:
            return "error", "the job wrote an invalid result file: %s" % err
    except OSError as err:
        return "error", "the job's result file could not be read: %s" % (errno.errorcode.get(err.errno) or err)
    finally:
        os.close(fd)


def write_new_file(path, text):
    """Writes a new file at path in a folder a container can write: whatever is there goes first (a link
    is removed, never followed) and the file is created anew without following a link. A directory there
    raises OSError: the job cannot start on this machine. Mode 0600: what goes there (task.json, an env
    file) holds the renter's secrets."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def private_folder(path):
    """Makes a folder (and its parents) that only this daemon's user may list or enter (0700): it holds
    tasks with the renter's env and kept results. One already there is made so too; False when that
    could not be done."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        if os.name != "nt" and stat.S_IMODE(os.stat(path).st_mode) & 0o077:
            os.chmod(path, 0o700)
    except OSError:
        return False  # another user's folder: left as it is
    return True


def job_url(job_id, what=None):
    """/api/jobs/{id}[/what], the id quoted: a job id is never taken for more of the path or a query."""
    path = "/api/jobs/%s" % urllib.parse.quote(job_id, safe="")
    return path + "/" + what if what else path


def _safe_name(job_id):
    """A job id as a file or container name: never "." or "..", never hidden (a leading dot becomes "-")."""
    name = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in job_id)
    return ("-" + name[1:] if name.startswith(".") else name)[:100]


def job_folder(workdir, job_id):
    """A job's host folder: a container's /svc-output, a runner's SVC_WORKSPACE."""
    return os.path.join(workdir, _safe_name(job_id))


def run_names(workdir, job_id, attempt):
    """(container name, container id file) of one run of a job. Two attempts of a job may run here at
    once (re-queued and handed back to this provider while the older one has not noticed yet): each
    has its own, so that neither's `docker run` is refused for the other's name and neither removes
    the other's container. The id file lies beside the job's folder, out of the container's reach."""
    suffix = "-%d" % attempt if attempt else ""
    return "svc-" + _safe_name(job_id) + suffix, job_folder(workdir, job_id) + suffix + ".cid"


def _cid_files(workdir, job_id):
    """The container id files and env files of every run of a job (run_names) that are still there."""
    pattern = re.compile(re.escape(_safe_name(job_id)) + r"(-[0-9]+)?\.(cid|env)")
    try:
        return [os.path.join(workdir, n) for n in sorted(os.listdir(workdir)) if pattern.fullmatch(n)]
    except OSError:
        return []


def _remote(value):
    """A URL to download; the built-in inputs ("builtin:...") are made inside the container."""
    return isinstance(value, str) and value.lower().startswith(("http://", "https://"))


def exposed_port(job, inputs):
    """A custom_container's params.expose_port: the container port published as its endpoint (None: none)."""
    port = inputs.get("expose_port")
    if job.get("job_type") == "custom_container" and isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
        return port
    return None


def needs_network(job, spec, inputs):
    """Same rule as the TypeScript daemon: a model, dataset or scene to download, or asked for, or a port
    to publish (docker publishes none with --network none)."""
    if spec.get("network") is True or job.get("job_type") == "vllm_serve" or exposed_port(job, inputs) is not None:
        return True
    return isinstance(spec.get("model"), str) or _remote(inputs.get("dataset_url")) or _remote(inputs.get("scene_url"))


# Environment names a task may not set: they choose which GPUs a container sees and what the NVIDIA
# container runtime mounts into it, which is the daemon's to decide (the server refuses them at submit,
# and the TypeScript daemon leaves them out too: src/shared/gpu-env.ts). The runtime reads more NVIDIA_*
# names than are listed (and may read new ones): the whole prefix is reserved.
RESERVED_ENV_PREFIX = "NVIDIA_"
RESERVED_ENV_NAMES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                      "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS",
                      "NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY")
# Runtime features that mount more host devices into a container whose environment sets them to
# "enabled": an image's own ENV could, so every job container gets them "disabled".
DEVICE_FEATURE_ENV_NAMES = ("NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY")


def reserved_env_name(name):
    return name.startswith(RESERVED_ENV_PREFIX) or name in RESERVED_ENV_NAMES


# A task's env reaches its container as `-e NAME` (no value), docker copying the value from the CLI's own
# environment, so that no value is on a command line (`ps` shows those to every user). Names the docker CLI
# itself reads, or what it runs (credential helpers, the Go runtime, the dynamic loader, ssh for an ssh://
# engine): DOCKER_HOST, DOCKER_CONFIG, PATH, HOME, LD_PRELOAD, HTTPS_PROXY, AWS_*, ...; and names its
# environment already holds, would change what the CLI does or lose the daemon's value there: those go in
# an --env-file instead (0600, outside the job's mounted folder, removed when the job ends). Listing too
# many costs nothing: either way the container gets them.
DOCKER_CLI_ENV_PREFIXES = ("DOCKER_", "BUILDKIT_", "BUILDX_", "COMPOSE_", "NOTARY_", "OTEL_", "GO", "LD_", "DYLD_",
                           "SSL_", "SSH_", "XDG_", "LC_", "AWS_", "AZURE_", "GOOGLE_", "GCLOUD_", "CLOUDSDK_", "SVC_")
DOCKER_CLI_ENV_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "TMPDIR", "TMP", "TEMP", "LANG",
                        "LANGUAGE", "TZ", "TERM", "SYSTEMROOT", "USERPROFILE", "APPDATA", "LOCALAPPDATA",
                        "PATHEXT", "COMSPEC")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# A docker volume name (docker's own rule): never a host path, which `-v` would bind-mount.
VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# docker's reference grammar, [registry[:port]/]path[:tag][@digest]: never an option, nor anything but one word.
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?/)?"
    + _IMAGE_COMPONENT + r"(?:/" + _IMAGE_COMPONENT + r")*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")
IMAGE_MAX = 255


def container_task_problem(image, volume, mount):
    """Why the daemon never runs a container task as it is (None when it does). `docker run` is built from
    fields of the signed task that the server fills itself; they are checked all the same, so that a task
    that verifies yet names a host path as its volume (`-v /:/host`), a mount path docker would read more
    from, or an "image" docker would take for an option gets a refusal, not the host. The TypeScript daemon
    checks the same (executors/docker.ts containerTaskProblem)."""
    if not isinstance(image, str) or len(image) > IMAGE_MAX or not IMAGE_REFERENCE.fullmatch(image):
        return "the task's container image %s is not an image reference" % json.dumps(image)[:IMAGE_MAX]
    if not isinstance(volume, str) or not VOLUME_NAME.fullmatch(volume):
        return "the task's workspace volume %s is not a volume name (letters, digits, '_', '.', '-')" % json.dumps(volume)
    if not isinstance(mount, str) or not mount.startswith("/") or re.search(r"[:\0\r\n]", mount):
        return "the task's workspace mount_path %s is not an absolute path without ':'" % json.dumps(mount)
    return None


def docker_cli_env_name(name, cli_env):
    """Whether a task's env name goes in the --env-file: one the docker CLI reads, or one of cli_env (the
    names the CLI is given). Compared without case: Windows names, and Go reads https_proxy too."""
    upper = name.upper()
    return (upper in DOCKER_CLI_ENV_NAMES or upper.startswith(DOCKER_CLI_ENV_PREFIXES) or upper.endswith("_PROXY")
            or upper in set(k.upper() for k in cli_env))


def env_value_problem(value, in_file):
    """Why a task's env value cannot be given to docker (None when it can): an environment holds no NUL,
    and a line of docker's --env-file no line break."""
    if "\0" in value:
        return "it holds a NUL character"
    if in_file and ("\n" in value or "\r" in value):
        return "it holds a line break, which docker's --env-file cannot carry for a name the docker CLI reads"
    try:
        value.encode("utf-8")
    except UnicodeError:
        return "it is not valid Unicode"
    return None


# The daemon's own secrets as its environment may hold them: the programs it starts (a runner, the
# benchmark, the docker CLI, whose container gets only what `-e` names) never see them.
SECRET_ENV_NAMES = ("SVC_API_KEY", "SVC_HMAC_SECRET")


def child_environment(secrets_held, base=None):
    """The daemon's environment (base) for a program it starts, without its secrets: the variables named
    for them, and any other that holds one (a service's Environment= line under a name of its own)."""
    base = os.environ if base is None else base
    held = [x for x in secrets_held if isinstance(x, str) and len(x) >= 8 and "{{" not in x]
    return dict((k, v) for k, v in base.items()
                if k.upper() not in SECRET_ENV_NAMES and not any(x in v for x in held))


# vllm_serve: the engine's port is published on every interface, so it is started with a secret of
# its own (VLLM_API_KEY, new for each job) that only the server's /v1 gateway is told (endpoint-ready):
# anyone else who finds the port is refused. docker gets `-e VLLM_API_KEY` with no value and copies
# the value from the CLI's own environment: on a command line `ps` would show it to every user.
SERVE_JOB_TYPE = "vllm_serve"
VLLM_API_KEY_ENV = "VLLM_API_KEY"
DEFAULT_CONTAINER_PORT = 8000


# A container's pids limit (the TypeScript daemon's too).
PIDS_LIMIT = 4096


def default_memory_mb():
    """A container's memory limit when its task names none: 80% of this host's memory, as the TypeScript
    daemon sets it (a vLLM engine loading a large model needs most of it); 16 GiB where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1048576 * 0.8)
    except (AttributeError, ValueError, OSError):
        return 16384


def new_endpoint_key():
    """A new secret for a served endpoint: 32 random bytes, base64url."""
    return secrets.token_urlsafe(32)


def free_port():
    """A host port nothing listens on now, on any interface (where docker publishes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def engine_command(spec, inputs, container_port):
    """The engine's arguments after its image, as the TypeScript daemon builds them."""
    model = spec.get("model") if spec.get("model") is not None else inputs.get("model")
    command = ["--model", str(model), "--port", _es_number(container_port)]
    if _is_number(inputs.get("max_model_len")):
        command += ["--max-model-len", _es_number(inputs["max_model_len"])]
    if isinstance(inputs.get("dtype"), str):
        command += ["--dtype", inputs["dtype"]]
    if _is_number(inputs.get("gpu_memory_utilization")):
        command += ["--gpu-memory-utilization", _es_number(inputs["gpu_memory_utilization"])]
    return command


def endpoint_report(public_host, host_port):
    """Where a served engine is reached (the endpoint-ready body without its key): a URL on the
    public host when one is configured, else the port alone, which the server joins to the
    provider's address on record."""
    if public_host:
        host = "[%s]" % public_host if ":" in public_host else public_host
        return {"endpoint_url": "http://%s:%d" % (host, host_port)}
    return {"port": host_port}


# custom_container: how long a connection to its published port must stay open, or answer, to count.
PORT_HOLD_SECONDS = 0.5


def port_answers(port, timeout=2.0):
    """Whether something in a custom_container listens on its published port (its protocol is the
    renter's: no /health). docker's proxy accepts a connection on the host port whether or not the
    container listens, and closes it at once when it does not: one that says something, or stays
    open PORT_HOLD_SECONDS, counts. As the TypeScript daemon's portAnswers."""
    try:
        conn = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return False
    try:
        conn.settimeout(PORT_HOLD_SECONDS)
        return conn.recv(1) != b""
    except socket.timeout:
        return True
    except OSError:
        return False
    finally:
        conn.close()


def endpoint_healthy(port, api_key, timeout=2.0):
    """Whether the engine published on this host's port answers /health (vLLM answers it without the
    key; it is sent all the same). Straight to 127.0.0.1, past any proxy of the environment."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/health", headers={"authorization": "Bearer " + api_key})
        return 200 <= conn.getresponse().status < 300
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class ServedEndpoint:
    """A vllm_serve job's engine, or a custom_container's published port: its host port and key (None
    for a custom_container). A thread probes its health (the engine's /health, the container's port)
    until it answers (or the job's process ended, or the job is being stopped); the job's loop then
    reports it."""

    def __init__(self, host_port, api_key):
        self.host_port = host_port
        self.api_key = api_key
        self.healthy = threading.Event()
        self.stopped = threading.Event()
        self.settled = False  # reported, or refused by the server: not sent again
        self.next_report_at = 0.0

    def watch(self, proc):
        threading.Thread(target=self._probe, args=(proc,), daemon=True).start()

    def _probe(self, proc):
        while not self.stopped.is_set() and proc.poll() is None:
            if endpoint_healthy(self.host_port, self.api_key) if self.api_key else port_answers(self.host_port):
                self.healthy.set()
                return
            self.stopped.wait(SERVE_HEALTH_SECONDS)

    def due(self, now):
        return self.healthy.is_set() and not self.settled and now >= self.next_report_at


class GpuSlots:
    """The host's GPUs, one per running job: the server sends a provider at most as many jobs at once
    as it has GPUs, and each job sees only its own. Taken when a job starts, released when it ended."""

    def __init__(self):
        self.busy = set()
        self.lock = threading.Lock()

    def take(self, gpus):
        """The nvidia-smi index of a free GPU among those probed, now taken; None when all are taken."""
        with self.lock:
            for gpu in gpus:
                index = gpu.get("index")
                if index is not None and index not in self.busy:
                    self.busy.add(index)
                    return index
        return None

    def free(self, gpus):
        """How many of the GPUs probed no job holds."""
        with self.lock:
            return sum(1 for gpu in gpus if gpu.get("index") is not None and gpu.get("index") not in self.busy)

    def release(self, index):
        with self.lock:
            self.busy.discard(index)


def gpus_flag(devices):
    """docker's --gpus value for device indices (a list is quoted: docker reads the value as CSV)."""
    if len(devices) == 1:
        return "device=%s" % devices[0]
    return '"device=%s"' % ",".join(str(d) for d in devices)


def container_ran_and_exited(state, code):
    """Whether a container's state (docker inspect's .State) says it started and has exited with code.
    A container that never started shows the zero time 0001-01-01T00:00:00Z."""
    started_at = state.get("StartedAt") if isinstance(state, dict) else None
    started = isinstance(started_at, str) and len(started_at) > 10 and started_at[4:5] == "-" \
        and not started_at.startswith("0001-01-01")
    return started and state.get("Running") is False and state.get("ExitCode") == code


class DockerContainer:
    """A job's container: stopped with `docker kill`, removed once the job ended (it runs without --rm,
    so that after `docker run` exits 125 its state still tells whether it ever started)."""

    def __init__(self, docker, name, cidfile, dropped_env, serve=None, dropped_key_env=False, image=None,
                 volume=None, folder=None, labels=()):
        self.docker = docker
        self.image = image
        self.name = name
        self.cidfile = cidfile
        self.volume = volume  # the job's named workspace volume
        self.folder = folder  # the job's host folder, mounted at /svc-output
        self.labels = list(labels)  # KEY=VALUE: the container's and its volume's
        self.dropped_env = dropped_env
        self.serve = serve  # vllm_serve, custom_container's expose_port: its ServedEndpoint
        self.dropped_key_env = dropped_key_env  # vllm_serve: the task's own VLLM_API_KEY was left out
        self.envfile = None  # the --env-file of the task's env (plan_job), removed with the container
        self.env_notes = []  # log lines: the task's env values that could not be given to docker

    def _docker(self, args):
        try:
            return subprocess.run([self.docker] + args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None

    def kill(self):
        self._docker(["kill", self.name])

    def image_present(self):
        out = self._docker(["image", "inspect", "--format", "{{.Id}}", self.image])
        return out is not None and out.returncode == 0

    def start_pull(self):
        """`docker pull` of the job's image, started (a Popen, output to a temporary file), or None."""
        import tempfile
        log = tempfile.TemporaryFile()
        try:
            return subprocess.Popen([self.docker, "pull", self.image], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, **_popen_group_kwargs()), log
        except OSError as err:
            log.close()
            return None, str(err)

    def container_id(self):
        """The id `docker run --cidfile` wrote; None when docker failed before creating the container."""
        try:
            with open(self.cidfile, "r") as f:
                cid = f.read().strip()
        except OSError:
            return None
        return cid if 12 <= len(cid) <= 64 and all(c in "0123456789abcdef" for c in cid) else None

    def exit_125_reason(self):
        """`docker run` exited 125: docker's own failure (no container, or one that never started) is
        this machine's (provider_error); a container that ran and exited 125 itself is the job's."""
        cid = self.container_id()
        out = self._docker(["inspect", "--format", "{{json .State}}", cid]) if cid else None
        if out is None or out.returncode != 0:
            return "provider_error"
        try:
            state = json.loads(out.stdout)
        except ValueError:
            return "provider_error"
        return "runtime_error" if container_ran_and_exited(state, 125) else "provider_error"

    def remove(self, log=None):
        """Removes the container (running or not), asking three times (1 s, then 2 s apart) as an engine
        that missed the container's exit event fails a removal for a moment: one left would hold its GPU
        (should it still run) and its volume. A removal that still failed is logged (the next start
        removes it)."""
        # By its id when docker wrote one; else by name (a container an earlier run of this job left).
        ref = self.container_id() or self.name
        for wait in (1.0, 2.0, None):
            out = self._docker(["rm", "--force", "--volumes", ref])
            if out is not None and (out.returncode == 0 or "no such container" in out.stderr.lower()):
                break
            if wait is None:
                if log:
                    log("ERROR: could not remove container %s (%s): %s; it may still run on its GPU, and the next "
                        "start of the daemon removes it" % (self.name, ref, _docker_error(out)))
            else:
                time.sleep(wait)
        for path in (self.cidfile, self.envfile):
            try:
                if path:
                    os.remove(path)
            except OSError:
                pass

    def create_volume(self, log):
        """The job's workspace volume, made before anything else of the job's with this daemon's labels (one
        that `docker run` makes carries none), so that the next start finds it if this daemon is killed
        before it removed it (remove_leftovers). A volume of that name already there is used as it is; one
        docker could not make is left to `docker run`, which makes it or fails for the same reason."""
        if not self.volume:
            return
        args = ["volume", "create"]
        for label in self.labels:
            args += ["--label", label]
        out = self._docker(args + [self.volume])
        if out is None or out.returncode != 0:
            log("could not create the workspace volume %s: %s" % (self.volume, _docker_error(out)))

    def remove_data(self, log):
        remove_job_data(self.docker, self.folder, [self.volume] if self.volume else [], log,
                        [self.envfile] if self.envfile else ())


def _docker_error(out):
    """What a docker command that failed said (its last line), or that it did not answer."""
    if out is None:
        return "docker did not answer"
    return (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]


def remove_job_data(docker, folder, volumes, log, cidfiles=()):
    """What a container job wrote on this machine, once it has ended (container removed, result read and
    kept under .svc-results until the server has it): its host folder, then its named workspace volumes,
    which `docker rm --volumes` leaves. The volume goes last: its labels name the job to the next start
    if this daemon is killed before this ends (remove_leftovers). No documented behaviour resumes a job
    from either (checkpoint_enabled included). A host job's folder never comes here (remove_job_folder).
    Files the container made as another user (root) may not be removable: logged only. cidfiles: its
    container id and env files, removed first. Returns (whether the folder went, how many volumes went)."""
    for cidfile in cidfiles:
        try:
            os.remove(cidfile)
        except OSError:
            pass
    folder_gone = False
    if folder and os.path.lexists(folder):
        try:
            shutil.rmtree(folder)
            folder_gone = True
        except FileNotFoundError:
            pass
        except OSError as err:
            log("could not remove the job's folder %s: %s" % (folder, err))
    volumes_gone = 0
    for volume in volumes:
        try:
            out = subprocess.run([docker, "volume", "rm", volume], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            out = None
        if out is not None and out.returncode == 0:
            volumes_gone += 1
        elif out is None or "no such volume" not in out.stderr.lower():
            log("could not remove the workspace volume %s: %s" % (volume, _docker_error(out)))
    return folder_gone, volumes_gone


# Labels of every container and workspace volume this daemon creates: which daemon, which job.
DAEMON_LABEL = "svc.daemon"
JOB_LABEL = "svc.job_id"


def daemon_label(workdir):
    """The svc.daemon label every container and workspace volume of this daemon carries: a digest of its
    work folder (one daemon's: its kept results live there), never its key, which `docker ps` would show."""
    scope = "svc_daemon.py\n" + os.path.abspath(workdir)
    return hashlib.sha256(scope.encode("utf-8")).hexdigest()[:16]


def remove_leftovers(docker, workdir, log):
    """What an earlier run of this daemon left when it was killed before it cleaned up (SIGKILL, a crash, a
    power cut), removed at start, before any job: the containers labelled for it (forcibly: one may still
    run on the GPU the next job gets), then the workspace volumes labelled for it and the folders of the
    jobs either names (remove_job_data, as a job's end removes them; nothing else of the work dir: kept
    results, a host job's folder, which kill_leftover_processes removes by its record). A missing or
    failing docker is only logged."""
    if not docker:
        return
    label = "label=%s=%s" % (DAEMON_LABEL, daemon_label(workdir))
    fmt = '\t{{.Label "%s"}}' % JOB_LABEL
    try:
        ps = subprocess.run([docker, "ps", "-a", "--no-trunc", "--filter", label, "--format", "{{.ID}}" + fmt],
                            capture_output=True, text=True, timeout=30)
        if ps.returncode != 0:
            log("could not list containers left by an earlier run (docker ps: %s)"
                % (ps.stderr.strip().splitlines() or ["exit %d" % ps.returncode])[0])
            return
        rows = [line.strip().split("\t") for line in ps.stdout.splitlines() if line.strip()]
        if rows:
            ids = [row[0] for row in rows]
            jobs = ", ".join((row[1] if len(row) > 1 and row[1] else "unknown job") for row in rows)
            rm = subprocess.run([docker, "rm", "--force", "--volumes"] + ids, capture_output=True, text=True, timeout=60)
            if rm.returncode != 0:
                # A container still there may still use its job's volume and folder: those wait for the next start.
                log("removing %d container(s) left by an earlier run (jobs %s) failed: %s"
                    % (len(ids), jobs, (rm.stderr.strip().splitlines() or ["exit %d" % rm.returncode])[0]))
                return
            log("removed %d container(s) left by an earlier run of this daemon (jobs %s)" % (len(ids), jobs))
        ls = subprocess.run([docker, "volume", "ls", "--filter", label, "--format", "{{.Name}}" + fmt],
                            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        log("could not remove containers left by an earlier run: %s" % err)
        return
    if ls.returncode != 0:
        log("could not list workspace volumes left by an earlier run (docker volume ls: %s)"
            % (ls.stderr.strip().splitlines() or ["exit %d" % ls.returncode])[0])
    # Each job's volumes. A volume is removed after its job's folder (remove_job_data), so a job whose
    # clean-up was cut short is still named by one; a container names its job too (an older version of
    # the daemon left its volume unlabelled: that one stays).
    jobs = dict((row[1], []) for row in rows if len(row) > 1 and row[1])
    for line in ls.stdout.splitlines() if ls.returncode == 0 else []:
        if line.strip():
            volume, _, job_id = line.strip().partition("\t")
            jobs.setdefault(job_id, []).append(volume)
    folders = volumes = 0
    for job_id, names in jobs.items():
        # No folder for a volume that names no job: the work dir itself is no job's.
        folder = job_folder(workdir, job_id) if job_id else None
        gone = remove_job_data(docker, folder, names, log, _cid_files(workdir, job_id) if job_id else ())
        folders += gone[0]
        volumes += gone[1]
    if folders or volumes:
        log("removed %d workspace volume(s) and %d job folder(s) left by an earlier run of this daemon (jobs %s)"
            % (volumes, folders, ", ".join(j or "unknown job" for j in jobs)))


# A job run as a host process (a runner, the benchmark) has a process group of its own (start_new_session),
# which outlives this daemon when it is killed without cleaning up (SIGKILL, an OOM kill, a crash): the
# server hands the job out again, and the orphan would keep its GPU busy while the same job runs twice. So
# each such group is recorded under <work-dir>/.svc-procs/ (0700; a file per run, 0600) until it has ended,
# and the next start kills what is recorded before it takes a job. A pid is recycled once its process is
# gone: a record names the leader's start time (/proc/<pid>/stat field 22) and the boot it ran in, and
# nothing that does not match is signalled. A record outlives its group until the job's folder (SVC_WORKSPACE)
# is removed too, so the next start also removes the folder of a job whose end was cut short. The TypeScript
# daemon writes the same records (job-processes.ts).
PROCESS_RECORDS = ".svc-procs"


def _proc_stat(pid):
    """(state, pgrp, start time) of a live (not zombie) process from /proc/<pid>/stat, or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            text = f.read().decode("latin-1")
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: fields 3 on follow its last ")".
    rest = text[text.rfind(")") + 2:].split(" ")
    try:
        state, pgrp, start = rest[0], int(rest[2]), int(rest[22 - 3])
    except (IndexError, ValueError):
        return None
    return None if state in ("Z", "X") else (state, pgrp, start)


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _has_proc():
    return os.path.exists("/proc/self/stat")


def record_job_process(workdir, job_id, pid, argv, log):
    """Records the process group `pid` leads, started for job_id; returns what removes the record once the
    job has ended. Without /proc (not Linux) nothing is recorded: the next start could not tell the process
    from another one that got its pid, and kills nothing it cannot verify."""
    st = _proc_stat(pid) if _has_proc() else None
    if not st:
        return lambda: None
    folder = os.path.join(workdir, PROCESS_RECORDS)
    path = os.path.join(folder, "%s.%d.json" % (_safe_name(job_id), pid))
    record = {"job_id": job_id, "pgid": pid, "start_time": st[2], "boot_id": _boot_id(), "argv": [str(a) for a in argv]}
    try:
        private_folder(folder)
        write_new_file(path + ".tmp", json.dumps(record))
        os.replace(path + ".tmp", path)
    except OSError as err:
        log("could not record job %s's process group %d (%s): a killed daemon would leave it running" % (job_id, pid, err))
        return lambda: None

    def forget():
        try:
            os.remove(path)
        except OSError:
            pass
    return forget


def remove_job_folder(workdir, job_id, log):
    """Removes a host job's folder (SVC_WORKSPACE: <work-dir>/<safe job id>, never the work dir nor anything
    beside it) and all in it; a symbolic link in it, or in its place, is removed itself, never followed. What
    cannot be removed is logged and stays. Whether there was a folder that went."""
    folder = os.path.abspath(job_folder(workdir, job_id))
    # An empty job id (a record's) would name the work dir itself.
    if os.path.dirname(folder) != os.path.abspath(workdir):
        return False
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(folder)  # links inside are unlinked, not followed
        else:
            os.remove(folder)
        return True
    except OSError as err:
        log("could not remove job %s's folder %s: %s" % (job_id, folder, err))
        return False


def _recorded_processes(rec):
    """(whole group?, pids) of a record's processes still the job's: the whole group while its leader is the
    recorded process (same start time); with the leader gone, the group's members that started after it and
    carry the job's SVC_JOB_ID (no process gets the pid of a group that still has members, but a later group
    of that pid could be left leaderless too). None once the leader's pid is another process's."""
    leader = _proc_stat(rec["pgid"])
    if leader:
        return (True, [rec["pgid"]]) if leader[2] == rec["start_time"] else (False, [])
    needle = ("\0SVC_JOB_ID=%s\0" % rec["job_id"]).encode("utf-8")
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _proc_stat(int(entry))
        if not st or st[1] != rec["pgid"] or st[2] < rec["start_time"]:
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle in b"\0" + f.read():
                    pids.append(int(entry))
        except OSError:
            pass  # gone meanwhile, or not ours to read: not verified
    return False, pids


def _signal_recorded(rec, sig):
    """Signals what of a record's group is verified to be the job's still; how many processes that was."""
    group, pids = _recorded_processes(rec)
    # The verified leader's group (and the leader, should it have left it), or each verified member.
    for kill, pid in [(os.killpg, rec["pgid"]), (os.kill, rec["pgid"])] if group else [(os.kill, p) for p in pids]:
        try:
            kill(pid, sig)
        except OSError:
            pass  # gone meanwhile
    return len(pids)


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _wait_gone(recs, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(_recorded_processes(r)[1] for r in recs):
        time.sleep(0.1)


def kill_leftover_processes(workdir, log, grace=5.0):
    """At start, before any job: kills (SIGTERM, then SIGKILL after `grace` seconds) every recorded job
    process group an earlier run of this daemon left that is still the same process, logs which, removes the
    folders of the recorded jobs (no job of this run has one yet), and then the records. A record of a
    process that has ended, or whose pid another process holds now, kills nothing. A group still running
    after SIGKILL keeps its record and its job's folder, for the next start."""
    folder = os.path.join(workdir, PROCESS_RECORDS)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return  # no record: no earlier run left a job's process
    for name in names:
        if name.endswith(".tmp"):
            _remove_quietly(os.path.join(folder, name))
    files = [os.path.join(folder, n) for n in names if n.endswith(".json")]
    if not files:
        return
    if not _has_proc() or not hasattr(os, "killpg"):
        # Without /proc a recorded pid cannot be told from a process that got it since: nothing is killed,
        # and a folder is left to a process that may still use it.
        log("%d job process record(s) left by an earlier run, not checked: this host has no /proc to verify a "
            "process by (any still running is left alone)" % len(files))
        for path in files:
            _remove_quietly(path)
        return
    boot, found, running = _boot_id(), [], []
    for path in files:
        try:
            with open(path) as f:
                rec = json.load(f)
            rec = {"job_id": str(rec["job_id"]), "pgid": int(rec["pgid"]), "start_time": int(rec["start_time"]),
                   "boot_id": str(rec.get("boot_id") or ""), "argv": [str(a) for a in rec.get("argv") or []]}
            if rec["pgid"] <= 1:
                raise ValueError("pgid %d" % rec["pgid"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            log("removed an unreadable job process record %s" % os.path.basename(path))
            _remove_quietly(path)
            continue
        found.append((rec, path))
        # Of another boot: the process ended with it, and its pid is another process's now.
        other_boot = rec["boot_id"] and boot and rec["boot_id"] != boot
        if not other_boot and _signal_recorded(rec, signal.SIGTERM):
            running.append(rec)
    left = _kill_recorded(running, grace, log) if running else []
    jobs = []
    for rec, _ in found:
        if rec["job_id"] not in jobs and not any(r["job_id"] == rec["job_id"] for r in left):
            jobs.append(rec["job_id"])
    for job_id in jobs:
        if remove_job_folder(workdir, job_id, log):
            log("removed job %s's folder, left by an earlier run of this daemon" % job_id)
    for rec, path in found:
        if not any(r is rec for r in left):
            _remove_quietly(path)


def _kill_recorded(recs, grace, log):
    """Kills what of the recorded groups (sent SIGTERM already) is still there after `grace` seconds, and logs
    each; returns those it could not kill."""
    _wait_gone(recs, grace)
    killed = [rec for rec in recs if _signal_recorded(rec, signal.SIGKILL)]
    if killed:
        _wait_gone(killed, 2.0)
    left = []
    for rec in recs:
        how = "job %s's process group %d (%s), left running by an earlier run of this daemon" % (
            rec["job_id"], rec["pgid"], " ".join(rec["argv"])[:200])
        if _recorded_processes(rec)[1]:
            log("could not kill " + how)  # its record stays: tried again at the next start
            left.append(rec)
        else:
            log("killed " + how + (" (SIGKILL: it outlasted SIGTERM)" if any(k is rec for k in killed) else ""))
    return left


def write_container_scripts(workdir):
    """Writes CONTAINER_SCRIPTS into a folder of the work dir; returns it (None when there are none)."""
    if not CONTAINER_SCRIPTS:
        return None
    folder = os.path.join(workdir, ".svc-scripts")
    os.makedirs(folder, exist_ok=True)
    for name, source in CONTAINER_SCRIPTS.items():
        target = os.path.join(folder, os.path.basename(name))
        with open(target + ".tmp", "w") as f:
            f.write(source)
        os.chmod(target + ".tmp", 0o644)
        os.replace(target + ".tmp", target)
    return folder


def supported_job_types(runners, docker, scripts_dir=None):
    """The job types plan_job runs with this configuration, declared in every heartbeat so that the server
    offers no other (a job refused here is the provider's fault): the benchmark, each configured runner's
    type, and with docker custom_container, vllm_serve and the built-in types whose program is present.
    A runner never declares vllm_serve: only a container's engine is reported as an endpoint, and a
    serving job that reports none is the provider's failure."""
    types = ["benchmark"]
    for job_type, argv in sorted(runners.items()):
        if argv and job_type != SERVE_JOB_TYPE and job_type not in types:
            types.append(job_type)
    if docker:
        builtin = [t for t, script in sorted(SCRIPT_OF_JOB_TYPE.items())
                   if scripts_dir and os.path.exists(os.path.join(scripts_dir, script))]
        for job_type in builtin + ["custom_container", SERVE_JOB_TYPE]:
            if job_type not in types:
                types.append(job_type)
    return types


def plan_job(job, runners, docker, workdir, gpu_devices, scripts_dir=None, serve_port=0):
    """Picks the executor for a job: (argv, env_extra, container, result_file); container is a
    DockerContainer, or None for a plain process. gpu_devices: the host GPUs (nvidia-smi indices)
    the job may use, [] for none. serve_port: the first host port vllm_serve publishes (0: any free one),
    plus the job's first GPU index."""
    job_id = job["job_id"]
    spec = job.get("task_spec") or {}
    workspace = job_folder(workdir, job_id)
    private_folder(workspace)
    result_file = os.path.join(workspace, "result.json")
    if os.path.lexists(result_file):
        os.remove(result_file)
    env = {"SVC_JOB_ID": job_id, "SVC_JOB_TYPE": job.get("job_type", ""), "SVC_WORKSPACE": workspace,
           "SVC_RESULT_FILE": result_file}
    gpu_devices = list(gpu_devices or [])
    if gpu_devices:
        # A plain process sees only its GPU too (nvidia-smi's index: CUDA's own default order may differ).
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in gpu_devices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    # Only a container's engine is reported as a served endpoint: a vllm_serve runner is never used (nor declared).
    runner = None if job.get("job_type") == SERVE_JOB_TYPE else runners.get(job.get("job_type"))
    if runner:
        return list(runner), env, None, result_file
    if job.get("job_type") == "benchmark":
        return [sys.executable, "-c", BENCHMARK_CODE], env, None, result_file
    container = spec.get("container") if isinstance(spec.get("container"), dict) else {}
    inputs = spec.get("inputs") if isinstance(spec.get("inputs"), dict) else {}
    image = spec.get("image") or container.get("image")
    command = spec.get("command") or container.get("command") or []
    if isinstance(command, str):
        command = shlex.split(command)
    script = SCRIPT_OF_JOB_TYPE.get(job.get("job_type"))
    builtin = bool(image and not command and script and scripts_dir
                   and os.path.exists(os.path.join(scripts_dir, script)))
    serving = job.get("job_type") == SERVE_JOB_TYPE
    if image and (command or builtin or serving or job.get("job_type") == "custom_container"):
        if not docker:
            raise RuntimeError("this job needs docker, which is not installed on this host")
        name, cidfile = run_names(workdir, job_id, job.get("attempt"))
        workspace_spec = spec.get("workspace") if isinstance(spec.get("workspace"), dict) else {}
        volume = workspace_spec.get("volume") or "svc-" + _safe_name(job_id) + "-workspace"
        mount = workspace_spec.get("mount_path") or "/workspace"
        problem = container_task_problem(image, volume, mount)
        if problem:
            raise RuntimeError("the daemon does not run this task: " + problem)
        if os.path.exists(cidfile):
            os.remove(cidfile)  # docker run refuses a container id file that exists
        labels = [JOB_LABEL + "=" + job_id, DAEMON_LABEL + "=" + daemon_label(workdir)]
        argv = [docker, "run", "--name", name, "--label", labels[0], "--label", labels[1], "--cidfile", cidfile]
        if gpu_devices:
            # The job's own GPU, never every GPU of the host.
            argv += ["--gpus", gpus_flag(gpu_devices)]
        if not needs_network(job, spec, inputs):
            argv += ["--network", "none"]
        limits = spec.get("limits") if isinstance(spec.get("limits"), dict) else {}
        # As the TypeScript daemon: the task's memory_mb when it is a number (at least 256 MiB), else the
        # host's default; the pids limit is the daemon's own (docker takes 0 or -1 for none at all).
        memory_mb = limits.get("memory_mb")
        if not _is_number(memory_mb) or memory_mb != memory_mb or memory_mb in (float("inf"), float("-inf")):
            memory_mb = default_memory_mb()
        # --memory-swap (memory and swap together) equal to --memory: no swap (docker's default allows as much again).
        memory = "%dm" % max(256, int(memory_mb // 1))
        argv += ["--memory", memory, "--memory-swap", memory, "--pids-limit", str(PIDS_LIMIT)]
        # No process of the container gains privileges through a setuid or file-capability program.
        argv += ["--security-opt", "no-new-privileges"]
        # The task goes in as a file beside the result (our scripts read $SVC_TASK_FILE), written anew:
        # an earlier run of this job (a re-queue back to this provider) may have left a link there.
        write_new_file(os.path.join(workspace, "task.json"),
                       json.dumps({"job_id": job_id, "job_type": job.get("job_type"), "task_spec": spec}))
        argv += ["-v", volume + ":" + mount, "-v", workspace + ":/svc-output",
                 "-e", "SVC_RESULT_FILE=/svc-output/result.json", "-e", "SVC_TASK_FILE=/svc-output/task.json",
                 "-e", "SVC_JOB_ID=" + job_id]
        for key in DEVICE_FEATURE_ENV_NAMES:
            argv += ["-e", key + "=disabled"]
        dropped_env, dropped_key_env, serve, env_notes, env_lines = [], False, None, [], []
        task_env = spec.get("env") if isinstance(spec.get("env"), dict) else {}
        cli_env = list(os.environ) + list(env)
        for key, value in sorted(task_env.items()):
            value = value if isinstance(value, str) else "%s" % value
            in_file = docker_cli_env_name(key, cli_env)
            problem = None if ENV_NAME.fullmatch(key) else "it is not a valid name"
            problem = problem or env_value_problem(value, in_file)
            if reserved_env_name(key):
                dropped_env.append(key)
            elif serving and key == VLLM_API_KEY_ENV:
                dropped_key_env = True  # the endpoint's key is the daemon's to set
            elif problem:
                env_notes.append("env %s was left out: %s" % (key, problem))
            elif in_file:
                env_lines.append("%s=%s\n" % (key, value))
            else:
                # The value in the docker CLI's environment only (see DOCKER_CLI_ENV_NAMES).
                argv += ["-e", key]
                env[key] = value
        envfile = None
        if env_lines:
            # Beside the job's folder, as the container id file: out of the container's reach. docker reads
            # it before the -e options, so the daemon's own SVC_* above win over a task's.
            envfile = cidfile[:-len(".cid")] + ".env"
            write_new_file(envfile, "".join(env_lines))
            argv += ["--env-file", envfile]
        exposed = exposed_port(job, inputs)
        if serving or exposed is not None:
            # A fixed first port: plus the job's first GPU index, one port per GPU (one job per GPU at a time).
            host_port = serve_port + (min(gpu_devices) if gpu_devices else 0) if serve_port else free_port()
            serve = ServedEndpoint(host_port, new_endpoint_key() if serving else None)
        if serving:
            argv += ["-e", VLLM_API_KEY_ENV]
            env[VLLM_API_KEY_ENV] = serve.api_key
        if isinstance(inputs.get("workdir"), str):
            argv += ["-w", inputs["workdir"]]
        if serving:
            serve_spec = spec.get("serve") if isinstance(spec.get("serve"), dict) else {}
            port = serve_spec.get("container_port") if _is_number(serve_spec.get("container_port")) else DEFAULT_CONTAINER_PORT
            argv += ["-p", "%d:%s" % (serve.host_port, _es_number(port))]
            command = engine_command(spec, inputs, port)
        elif exposed is not None:
            argv += ["-p", "%d:%d" % (serve.host_port, exposed)]
        elif builtin:
            argv += ["-v", scripts_dir + ":/svc-scripts:ro"]
            command = ["python", "/svc-scripts/" + script]
        argv.append(image)
        argv += [str(c) for c in command]

        container = DockerContainer(docker, name, cidfile, dropped_env, serve, dropped_key_env, image, volume, workspace, labels)
        container.envfile = envfile
        container.env_notes = env_notes
        return argv, env, container, result_file
    raise RuntimeError("no executor for job type %r on this daemon: configure a local runner (--runner %s=COMMAND) "
                       "or use the TypeScript daemon (svc-daemon), which runs the built-in job containers"
                       % (job.get("job_type"), job.get("job_type")))


def cut_utf16(text, units):
    """text cut to at most `units` UTF-16 code units (the server's JavaScript counts a string's length so),
    never in the middle of a character."""
    data = text.encode("utf-16-le", "surrogatepass")
    if len(data) <= 2 * units:
        return text
    data = data[:2 * units]
    if 0xD800 <= int.from_bytes(data[-2:], "little") <= 0xDBFF:
        data = data[:-2]  # the first half of a surrogate pair
    return data.decode("utf-16-le", "surrogatepass")


def parse_progress(line):
    """'SVC_PROGRESS 42.5 phase words' -> (42.5, 'phase words') or None. A phase longer than the server
    takes (MAX_PHASE_CHARS) is cut to it: the server would refuse the whole report, percentage and all."""
    if not line.startswith(PROGRESS_PREFIX + " "):
        return None
    parts = line[len(PROGRESS_PREFIX) + 1:].strip().split(None, 1)
    try:
        pct = max(0.0, min(100.0, float(parts[0])))
    except (ValueError, IndexError):
        return None
    return pct, (cut_utf16(parts[1], MAX_PHASE_CHARS).rstrip() if len(parts) > 1 else None)


# ---------------------------------------------------------------- results --

def with_attempt(body, attempt):
    """A report's body naming the attempt it is about (the poll's `attempt`): the server refuses one
    about an attempt that is no longer the job's instead of taking it for the current one."""
    if attempt:
        body["attempt"] = attempt
    return body


def result_refused(status):
    """Whether an HTTP status is the server's refusal of a report (sending it again changes nothing):
    a 4xx other than 408 (request timeout) and 429 (too many requests). Everything else (a 5xx, no
    answer at all) says the server could not take it for now."""
    return 400 <= status < 500 and status not in (408, 429)


class PendingResults:
    """Job results the server has not answered yet, one JSON file each under a folder of the work
    dir, so that a restart of the daemon (a stop signal, a self-update, a kill) keeps them too: each is
    kept before it is first sent, and due to the main loop only once that try went unanswered. Each entry:
    the job-result body, when it was first sent (first_at: the wall clock, written to disk; since: the
    same moment on time.monotonic(), which a clock step does not move), how many times it was sent and
    when it is due again (time.monotonic()). A result read back at a restart is as old as the wall
    clock says, counted on from there without it. Job threads keep and drop results while the main loop
    sends the kept ones: each change holds the lock."""

    def __init__(self, folder, log):
        self.folder = folder
        self.log = log
        self.items = {}
        self.lock = threading.Lock()

    def _path(self, job_id):
        return os.path.join(self.folder, _safe_name(job_id) + ".json")

    def load(self):
        """Reads the results an earlier run of the daemon left; each is due at once."""
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.folder, name), "r", encoding="utf-8") as f:
                    item = json.load(f)
                job_id = item["body"]["job_id"]
                item = {"body": item["body"], "first_at": float(item["first_at"]), "tries": int(item.get("tries", 0))}
            except (OSError, ValueError, KeyError, TypeError) as err:
                self.log("ignoring an unreadable kept result %s: %s" % (name, err))
                continue
            age = time.time() - item["first_at"]
            item["since"] = time.monotonic() - (age if 0 <= age < float("inf") else 0.0)
            item["next_at"] = float("-inf")
            with self.lock:
                self.items[job_id] = item

    def keep(self, job_id, body, first_at, since, tries, next_at):
        """Keeps a job's result, on disk too (what a restart needs: the body and when it was first sent); it
        replaces one an earlier attempt of the job left, which the server would refuse."""
        with self.lock:
            self.items[job_id] = {"body": body, "first_at": first_at, "since": since, "tries": tries, "next_at": next_at}
            try:
                # A result may hold what the renter's program printed: this daemon's user's only.
                private_folder(self.folder)
                path = self._path(job_id)
                write_new_file(path + ".tmp", json.dumps({"body": body, "first_at": first_at, "tries": tries}))
                os.replace(path + ".tmp", path)
            except (OSError, TypeError, ValueError) as err:
                self.log("could not write the result of %s to %s (kept in memory only): %s" % (job_id, self.folder, err))

    def retry(self, job_id, body, tries, next_at):
        """A kept result not delivered yet: when it is due again (unless a later attempt's replaced it)."""
        with self.lock:
            item = self.items.get(job_id)
            if item is not None and item["body"] is body:
                item["tries"], item["next_at"] = tries, next_at

    def drop(self, job_id, body=None):
        """Forgets a job's result; with `body`, only while that is the one kept (a later attempt's replaces it)."""
        with self.lock:
            if body is not None and self.items.get(job_id, {}).get("body") is not body:
                return
            self.items.pop(job_id, None)
            try:
                os.remove(self._path(job_id))
            except OSError:
                pass

    def snapshot(self):
        """(job_id, entry) of every kept result, the soonest due first."""
        with self.lock:
            return sorted(self.items.items(), key=lambda kv: kv[1]["next_at"])

    def due(self, now):
        return [(job_id, item) for job_id, item in self.snapshot() if item["next_at"] <= now]


class JobReports:
    """A running job's log lines and progress on their way to the server. Lines go in batches (after
    LOG_FLUSH_SECONDS, or at LOG_BATCH_LINES lines or LOG_BATCH_CHARS characters); progress lines are
    coalesced, the latest sent at most every PROGRESS_SECONDS, so that a job that prints its progress at
    every step does not spend the provider's request budget. While the server asks to wait (the daemon's
    reports_held_until, set by a 429) nothing is sent: lines are held, MAX_HELD_LOG_LINES and
    MAX_HELD_LOG_CHARS at most (later ones are counted, dropped, and said so in the job's log), the
    latest progress is kept, and both go once the wait is over. A batch the server refuses otherwise (a
    4xx, a 5xx, no answer) is dropped."""

    def __init__(self, daemon, job_id, attempt):
        self.daemon = daemon
        self.job_id = job_id
        self.attempt = attempt
        self.lines = collections.deque()
        self.chars = 0
        self.dropped = 0
        self.progress = None  # the latest (pct, phase) not sent yet
        self.last_flush = time.monotonic()
        self.last_progress = float("-inf")

    def note(self, line):
        """A line of the daemon's own about the job (an env value left out): always kept."""
        self.lines.append(line)
        self.chars += len(line)

    def add(self, line):
        if len(self.lines) >= MAX_HELD_LOG_LINES or self.chars + len(line) > MAX_HELD_LOG_CHARS:
            self.dropped += 1
            return
        self._note_dropped()
        self.note(line)

    def _note_dropped(self):
        if self.dropped:
            self.note("[svc-daemon] %d log line(s) of this job were dropped here: the server asked the daemon to wait "
                      "before it sent more, and at most %d lines are held meanwhile" % (self.dropped, MAX_HELD_LOG_LINES))
            self.dropped = 0

    def _post(self, what, body):
        """(reached the server, to be sent again): a refusal that asks to wait keeps it."""
        if self.daemon.post_quietly(job_url(self.job_id, what), with_attempt(body, self.attempt)):
            return True, False
        return False, time.monotonic() < self.daemon.reports_held_until

    def send(self, now, final=False):
        """Sends what is due (everything with final) unless the server asks to wait; True when a report
        reached the server (which confirms the job's pickup)."""
        reached = False
        if now < self.daemon.reports_held_until:
            return False
        if self.progress is not None and (final or now - self.last_progress >= PROGRESS_SECONDS):
            pct, phase = self.progress
            self.last_progress = now
            ok, again = self._post("progress", {"progress_pct": pct, "phase": phase})
            reached = reached or ok
            if again:
                return reached
            self.progress = None
        if self.lines and (final or now - self.last_flush >= LOG_FLUSH_SECONDS or len(self.lines) >= LOG_BATCH_LINES
                           or self.chars >= LOG_BATCH_CHARS):
            batch, chars = [], 0
            for line in self.lines:
                if batch and (len(batch) >= LOG_BATCH_LINES or chars + len(line) > LOG_BATCH_CHARS):
                    break
                batch.append(line)
                chars += len(line)
            self.last_flush = now
            ok, again = self._post("logs", {"logs": batch})
            reached = reached or ok
            if not again:
                for _ in batch:
                    self.lines.popleft()
                self.chars -= chars
        return reached

    def finish(self, progress=True):
        """At the job's end, before its result: every line still held and, with `progress` (a job that is
        still the server's to take progress for), the latest progress. A wait the server asked for is
        waited out first, up to END_WAIT_SECONDS, and not past a stop's deadline (the server takes the
        job's result no sooner: the same budget)."""
        self._note_dropped()
        if not progress:
            self.progress = None
        d = self.daemon
        give_up = time.monotonic() + END_WAIT_SECONDS
        while self.lines or self.progress is not None:
            now = time.monotonic()
            end = min(give_up, d.stop_deadline) if d.stop_event.is_set() else give_up
            if now < d.reports_held_until:
                if d.reports_held_until > end:
                    d.log("job %s: %d log line(s)%s not sent: the server asked to wait %d s more"
                          % (self.job_id, len(self.lines), " and its latest progress" if self.progress else "",
                             d.reports_held_until - now))
                    return
                time.sleep(min(0.5, d.reports_held_until - now))
                continue
            self.send(now, final=True)


# ----------------------------------------------------------------- daemon --

class Daemon:
    # Until when (time.monotonic()) the server has asked this daemon to send no job logs or progress: a 429
    # (or a 503 with Retry-After) on one of them, on a job's status check or on a poll (the provider's
    # per-IP request budget, which every request of the daemon spends, is used up for now). Meanwhile
    # those wait, and so do a job's status checks.
    reports_held_until = float("-inf")
    # Until when the server has asked for no heartbeat (a 429 or a 503 with a Retry-After on one).
    heartbeat_held_until = float("-inf")
    # The spell of key refusals (Api.refused_since) the log has told of (key_refused).
    key_refused_said = None

    def __init__(self, cfg):
        self.cfg = cfg
        self.api = Api(cfg["url"], cfg["key"])
        self.gpus = Gpus(cfg["nvidia_smi"], cfg.get("visible_devices"))
        self.scripts_dir = write_container_scripts(cfg["work_dir"])
        self.log_lock = threading.Lock()
        self.started = time.monotonic()
        self.stop_event = threading.Event()
        self.stop_reason = None
        self.approved = True
        self.paused = False
        self.update_wanted = False
        # The jobs running now, {thread: job_id}: one per GPU, or one in all on a host without GPUs.
        self.jobs = {}
        self.jobs_lock = threading.Lock()
        # Set when a job ends (its GPU is free) or a stop is asked for: the main loop goes on at once.
        self.wake = threading.Event()
        self.results = PendingResults(os.path.join(cfg["work_dir"], ".svc-results"), self.log)
        self.stop_deadline = float("inf")
        self.hostname = socket.gethostname()
        self.docker = shutil.which(cfg["docker"]) if cfg["docker"] else None
        self.gpu_slots = GpuSlots()

    def log(self, message):
        with self.log_lock:
            sys.stderr.write("[svc-daemon %s] %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), message))
            sys.stderr.flush()

    def event(self, event_type, severity="info", details=None, job_id=None):
        body = {"event_type": event_type, "severity": severity, "daemon_version": DAEMON_VERSION,
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hostname": self.hostname,
                "os_info": platform.platform(), "python_version": platform.python_version()}
        if details is not None:
            body["details"] = str(details)[:5000]
        if job_id:
            body["job_id"] = job_id
        try:
            self.api.post("/api/providers/daemon-event", body)
            return True
        except ApiError as err:
            self.log("daemon-event %s not delivered: %s" % (event_type, err))
            return False

    # -- heartbeat ------------------------------------------------------
    def heartbeat(self):
        gpus = self.gpus.query()
        body = {"gpu_status": gpu_status(gpus, self.gpus.cuda_version), "uptime": round(time.monotonic() - self.started, 1),
                "provider_hostname": self.hostname, "daemon_version": DAEMON_VERSION,
                "cached_models": self.cfg.get("cached_models", []), "resource_spec": resource_spec(),
                "supported_job_types": supported_job_types(self.cfg["runners"], self.docker, self.scripts_dir)}
        try:
            res = self.api.post("/api/providers/heartbeat", body)
        except ApiError as err:
            if err.status == 403:
                if self.approved:
                    self.log("provider not approved yet: %s" % err.message)
                self.approved = False
            elif err.status == 401:
                self.log("the provider key was refused (401): check SVC_API_KEY (or the key this file was downloaded with)")
            else:
                # A 429 (the heartbeat budget is spent) or a 503 with a Retry-After: the next beat waits that long.
                if err.retry_after is not None and err.status in (429, 503):
                    self.heartbeat_held_until = time.monotonic() + err.retry_after
                self.log("heartbeat failed: %s%s" % (err, "; the next one in %g s" % err.retry_after if err.retry_after is not None else ""))
            return None
        if not isinstance(res, dict):
            self.log("heartbeat answer ignored: not a JSON object (%s)" % type(res).__name__)
            return None
        self.approved = bool(res.get("approved", True))
        self.paused = bool(res.get("paused", False))
        if res.get("update_available") or res.get("needs_update"):
            self.update_wanted = True
        return res

    def heartbeat_loop(self):
        while not self.stop_event.is_set():
            self.heartbeat()
            self.stop_event.wait(max(self.cfg["heartbeat_seconds"], self.heartbeat_held_until - time.monotonic()))

    # -- readiness -------------------------------------------------------
    def readiness(self):
        gpus = self.gpus.query()
        try:
            import importlib.util
            has_torch = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):
            has_torch = False
        checks = {"cuda": bool(gpus) and bool(self.gpus.cuda_version), "pytorch": has_torch,
                  "vram_gb": round(sum((g.get("vram_mib") or 0) for g in gpus) / 1024.0, 1),
                  "driver": (gpus[0].get("driver_version") if gpus else None) or ""}
        try:
            signing = "service" if os.environ.get("SVC_HMAC_SECRET") else TASK_SIGNING_OWN
            res = self.api.post("/api/providers/readiness", {"daemon_version": DAEMON_VERSION, "checks": checks, "task_signing": signing})
            self.log("readiness: %s" % (res.get("readiness_status") if isinstance(res, dict) else res))
        except ApiError as err:
            self.log("readiness report failed: %s" % err)

    # -- self-update -----------------------------------------------------
    def self_update(self):
        """Download the served daemon, verify it, replace this file, restart."""
        self.update_wanted = False
        try:
            info = self.api.get("/api/providers/download/daemon", {"check_only": "true"})
            if not isinstance(info, dict):
                raise RuntimeError("the update check's answer is not a JSON object")
            if version_tuple(info.get("version", "0")) <= version_tuple(DAEMON_VERSION):
                return False
            data = self.api.get("/api/providers/download/daemon", raw=True)
            digest = hashlib.sha256(data).hexdigest()
            if info.get("sha256") and not hmac.compare_digest(digest, info["sha256"]):
                raise RuntimeError("downloaded daemon does not match its published sha256")
            text = data.decode("utf-8")
            compile(text, "svc_daemon.py", "exec")
            if 'DAEMON_VERSION = "%s"' % info["version"] not in text:
                raise RuntimeError("downloaded daemon does not carry version %s" % info["version"])
            path = os.path.abspath(sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else __file__)
            tmp = path + ".new"
            # The file holds the provider key and the task-signing secret: its owner's only, from the start.
            if os.path.exists(tmp):
                os.remove(tmp)
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o700)
            os.replace(tmp, path)
        except (ApiError, RuntimeError, ValueError, SyntaxError, OSError) as err:
            self.log("self-update failed: %s" % err)
            self.event("self_update_failed", "warning", str(err))
            return False
        self.event("self_update", "info", "updating %s -> %s" % (DAEMON_VERSION, info["version"]))
        self.log("updated to %s; restarting" % info["version"])
        self.stop_event.set()
        os.execv(sys.executable, [sys.executable, path] + sys.argv[1:])
        return True

    # -- jobs --------------------------------------------------------------
    def poll(self):
        try:
            res = self.api.get("/api/providers/%s/jobs" % urllib.parse.quote(self.api.key, safe=""))
        except ApiError as err:
            self.hold_reports(err)
            self.log("poll failed: %s" % err)
            return None
        job = res.get("job") if isinstance(res, dict) else res
        if job is None and isinstance(res, dict):
            return None
        if not isinstance(job, dict) or not isinstance(job.get("job_id"), str) or not job["job_id"]:
            # Nothing to report on without a job id: left to the server, which re-queues an unconfirmed pickup.
            self.log("poll answer ignored: no job object with a job_id: %s" % json.dumps(res)[:300])
            return None
        return job

    def report(self, job_id, success, result=None, error=None, metrics=None, end_reason=None, attempt=None, before_send=None):
        """job-result; a failure names its end reason and whose fault it was (docs/daemons.md), so the
        server bills the renter's own failures, re-queues this machine's and refunds the platform's.
        Sent once now; when the server cannot take it (a 5xx, no answer) it is kept and sent again
        (deliver_results) until the server answers it. `before_send` (the job's last logs) runs once it
        is on disk, before it is sent. Returns the server's answer, or None."""
        body = {"job_id": job_id, "success": success, "result": result, "error": error, "metrics": metrics or {}}
        if attempt:
            # The attempt polled: a result kept past a re-queue is then refused, not taken for a later attempt.
            body["attempt"] = attempt
        if not success and end_reason:
            body["end_reason"] = end_reason
            body["fault"] = FAULT_OF.get(end_reason, "renter")
        size = len(json.dumps(dict(body, api_key=self.api.key)).encode("utf-8"))
        if size > MAX_REPORT_BYTES:
            # The server would refuse it (413) and the job would run on in its records: the job's own failure instead.
            error = "the job's result is %d bytes as a report, over the %d-byte limit" % (size, MAX_REPORT_BYTES)
            self.log("job %s: %s; reported as its failure" % (job_id, error))
            return self.report(job_id, False, None, error, metrics, end_reason="runtime_error", attempt=attempt, before_send=before_send)
        item = {"body": body, "first_at": time.time(), "since": time.monotonic(), "tries": 0, "next_at": float("-inf")}
        # On disk before it is sent (not due to the main loop meanwhile): a daemon killed while the server
        # has not answered yet (one that stopped answering takes the request's whole timeout) sends it at
        # its next start.
        self.results.keep(job_id, body, item["first_at"], item["since"], 0, float("inf"))
        try:
            if before_send:
                before_send()
        finally:
            answer = self.send_result(job_id, item)[1]
        return answer

    def send_result(self, job_id, item, timeout=None):
        """One try at a result: ("delivered", answer), ("refused", None) on the server's 4xx (sending it
        again would change nothing), ("kept", None) when it is kept to be sent again, ("given_up", None)
        once it was kept for result_keep_seconds."""
        try:
            answer = self.api.post("/api/providers/job-result", item["body"], timeout)
        except ApiError as err:
            self.hold_reports(err)
            tries = item["tries"] + 1
            # A 401 refuses the key, not the result: a key rotated while the job ran is replaced at the next
            # start, which sends the kept result with the new one.
            if result_refused(err.status) and err.status != 401:
                self.log("job-result for %s refused: %s" % (job_id, err))
                self.results.drop(job_id, item["body"])
                return "refused", None
            kept_for = time.monotonic() - item["since"]
            if kept_for >= self.cfg.get("result_keep_seconds", 3600):
                self.results.drop(job_id, item["body"])
                message = "gave up sending the result of %s after %d tries over %d s: %s" % (job_id, tries, kept_for, err)
                self.log(message)
                self.event("job_result_undelivered", "error", message, job_id)
                return "given_up", None
            retry = self.cfg.get("result_retry_seconds", 10)
            if tries == 1 or tries % 30 == 0:
                self.log("job-result for %s not delivered (try %d): %s; kept, sent again every %g s for up to %g s"
                         % (job_id, tries, err, retry, self.cfg.get("result_keep_seconds", 3600)))
            self.results.retry(job_id, item["body"], tries, time.monotonic() + retry)
            return "kept", None
        if item["tries"]:
            self.log("job-result for %s delivered after %d earlier tries" % (job_id, item["tries"]))
        self.results.drop(job_id, item["body"])
        return "delivered", answer

    def deliver_results(self):
        """Sends the kept results that are due. Only the main loop calls it (also while a stop waits
        for the running jobs), which runs beside the jobs, so no result waits for a job to end."""
        if time.monotonic() < self.reports_held_until:
            return  # the server asked to wait (a 429): it would refuse them now
        for kept_id, item in self.results.due(time.monotonic()):
            if self.stop_event.is_set() and time.monotonic() >= self.stop_deadline:
                break
            self.send_result(kept_id, item)

    def flush_results(self):
        """At stop: one more try for each kept result within the stop grace; those the server still
        did not answer stay on disk, and the next start of the daemon sends them."""
        for job_id, item in self.results.snapshot():
            left = self.stop_deadline - time.monotonic()
            if left < 1:
                break
            self.send_result(job_id, item, timeout=min(left, self.api.timeout))
        if self.results.items:
            self.log("%d job result(s) not delivered yet, kept in %s; the next start sends them"
                     % (len(self.results.items), self.results.folder))

    def job_status(self, job_id, attempt=None):
        """The job's status; GONE when it is no longer this provider's (403: it went back to the queue
        or on to another provider), or when it is on another attempt than the one run here (re-queued
        and assigned back to this provider: the next poll hands the new attempt out); None when the
        server could not be asked; KEY_REFUSED once the provider key has been refused for key_refused_seconds."""
        try:
            job = self.api.get(job_url(job_id))
        except ApiError as err:
            self.hold_reports(err)
            if err.status == 401 and self.key_refused():
                return KEY_REFUSED
            return GONE if err.status == 403 else None
        if not isinstance(job, dict):
            self.log("status of job %s: the answer is not a JSON object; asked again later" % job_id)
            return None
        if attempt and job.get("attempt") and job.get("attempt") != attempt:
            return GONE
        return job.get("status")

    def key_refused(self):
        """Whether the provider key has been refused (401) for key_refused_seconds, nothing taken since: it
        was rotated or revoked while the daemon ran. Said once in the log for each such spell."""
        since = self.api.refused_since
        if since is None or time.monotonic() - since < self.cfg.get("key_refused_seconds", 60):
            return False
        refused_for = time.monotonic() - since
        with self.log_lock:
            said, self.key_refused_said = self.key_refused_said, since
        if said != since:
            self.log("the provider key has been refused (HTTP 401) for %d s: it was rotated or revoked. The running jobs "
                     "cannot be reported on with it (the server hands them to another provider once it hears nothing "
                     "from this one), so they are stopped; their reports are kept in %s and sent at the next start. "
                     "Restart the daemon with the new key (SVC_API_KEY, or run the installer again)"
                     % (refused_for, self.results.folder))
        return True

    def key_refused_error(self):
        return ("stopped: the provider key was refused (HTTP 401) for %d s, rotated or revoked while the job ran, so the "
                "job could not be reported on" % self.api.key_refused_for())

    def confirm_pickup(self, job_id, attempt=None):
        """A report naming the job (an empty log batch): the server counts a polled job as picked up
        once the daemon reports on it, and sends it back to the queue when nothing comes."""
        return self.post_quietly(job_url(job_id, "logs"), with_attempt({"logs": []}, attempt))

    def running_jobs(self):
        with self.jobs_lock:
            return len(self.jobs)

    def can_take_job(self):
        """Whether to poll for another job now: a GPU no running job holds, or no job running at all
        (on a host without GPUs, one job at a time)."""
        running = self.running_jobs()
        if not running:
            return True
        gpus = self.gpus.query()
        return running < len(gpus) and self.gpu_slots.free(gpus) > 0

    def start_job(self, job):
        """Starts a polled job on a thread of its own with a GPU of its own: the first nvidia-smi lists
        that no running job holds (none on a host without GPUs). The GPU is taken here, before the next
        poll, so that poll sees it taken."""
        gpus = self.gpus.query()
        gpu = self.gpu_slots.take(gpus)
        if gpus and gpu is None:
            # nvidia-smi's list changed since can_take_job (a GPU gone): the job goes back to the queue.
            self.report(job["job_id"], False, None, "every GPU of this host is running another job", {"duration_seconds": 0},
                        end_reason="provider_error", attempt=job.get("attempt"))
            return
        thread = threading.Thread(target=self.run_job, args=(job, gpu), name="job " + job["job_id"], daemon=True)
        with self.jobs_lock:
            self.jobs[thread] = job["job_id"]
        try:
            thread.start()
        except RuntimeError as err:  # no thread to be had (the process's limit)
            with self.jobs_lock:
                self.jobs.pop(thread, None)
            self.gpu_slots.release(gpu)
            self.report(job["job_id"], False, None, "could not start the job: %s" % err, {"duration_seconds": 0},
                        end_reason="provider_error", attempt=job.get("attempt"))

    def run_job(self, job, gpu):
        """A job's thread: runs the job, then gives its GPU back and wakes the main loop to poll again."""
        try:
            self._run_job(job, [] if gpu is None else [gpu])
        finally:
            self.gpu_slots.release(gpu)
            with self.jobs_lock:
                self.jobs.pop(threading.current_thread(), None)
            self.wake.set()

    def wait_for_jobs(self):
        """At stop: waits for every running job's thread, which stops its job and hands it back once the
        stop grace is over (unless it ended first); kept results keep going out meanwhile."""
        while True:
            with self.jobs_lock:
                threads = list(self.jobs)
            if not threads:
                return
            self.deliver_results()
            threads[0].join(0.2)

    def _run_job(self, job, gpu_devices):
        job_id = job["job_id"]
        attempt = job.get("attempt")
        why = None if verify_task(self.cfg["secret"], job.get("task_spec"), job.get("task_spec_hmac")) \
            else "task_spec_hmac does not match the task"
        if why is None:
            job, why = signed_job(job)
        if why is not None:
            self.log("job %s refused: %s" % (job_id, why))
            self.event("task_signature_invalid", "error", why, job_id)
            self.report(job_id, False, None, "task signature verification failed: the daemon refused the task (%s)" % why,
                        end_reason="signature_mismatch", attempt=attempt)
            return
        try:
            plan = plan_job(job, self.cfg["runners"], self.docker, self.cfg["work_dir"], gpu_devices, self.scripts_dir,
                            self.cfg.get("serve_port", 0))
        except RuntimeError as err:
            self.refused_job_ended(job_id)
            self.event("job_failed", "error", str(err), job_id)
            self.report(job_id, False, None, str(err), {"duration_seconds": 0}, end_reason="unsupported_on_provider", attempt=job.get("attempt"))
            return
        except OSError as err:
            # This machine could not make the job's folder ready (a directory a run of the job left where
            # task.json goes, say): its failure, re-queued.
            self.refused_job_ended(job_id)
            error = "could not prepare the job's folder: %s" % err
            self.event("job_failed", "error", error, job_id)
            self.report(job_id, False, None, error, {"duration_seconds": 0}, end_reason="provider_error", attempt=attempt)
            return
        container = plan[2]
        try:
            if container:
                container.create_volume(self.log)
            # An image to pull first is said so (preparing): the job's run and billed time start at the
            # report after the pull, so the renter does not pay for it. A server without the route (404)
            # counts the pull in the run, as before it had one.
            preparing = False
            if container and container.image and not container.image_present():
                notice = self.notice_preparing(job_id, attempt, container.image)
                if notice == GONE:
                    self.log("job %s is no longer this provider's (the server sent it back to the queue); not pulled" % job_id)
                    return
                preparing = notice != "unsupported"
            # The event names the job, which confirms the pickup; when it does not get through (the
            # server away, the hour's events used up), another report must before the pickup window ends.
            confirmed = False if preparing else self.confirm_started(job)
            self._run_planned(job, plan, time.monotonic(), confirmed, preparing)
        finally:
            # The job's folder and volume are named by the job: a newer attempt of it assigned back here
            # and running on another GPU meanwhile uses them, and removes them when it ends.
            if container and not self._job_held_elsewhere(job_id):
                container.remove_data(self.log)

    def refused_job_ended(self, job_id):
        """A job refused while it was planned (plan_job made its folder first): its folder goes, unless an
        attempt of the job running here meanwhile uses it."""
        if not self._job_held_elsewhere(job_id):
            remove_job_folder(self.cfg["work_dir"], job_id, self.log)

    def _job_held_elsewhere(self, job_id):
        """Whether a thread other than this one runs an attempt of the job."""
        me = threading.current_thread()
        with self.jobs_lock:
            return any(t is not me and held == job_id for t, held in self.jobs.items())

    def confirm_started(self, job):
        """The job_started event, or an empty log batch when it does not get through: the first report
        on a polled job confirms the pickup (and, after a preparing notice, starts the run)."""
        job_id = job["job_id"]
        return self.event("job_started", "info", job.get("job_type"), job_id) or self.confirm_pickup(job_id, job.get("attempt"))

    def notice_preparing(self, job_id, attempt, image):
        """POST /api/jobs/{id}/preparing. True: taken; False: not reached (tried again later); GONE: the
        job is not this provider's at this attempt (403, 409); "unsupported": a server without the route."""
        body = with_attempt({"detail": "pulling image %s" % image}, attempt)
        try:
            self.api.post(job_url(job_id, "preparing"), body)
            return True
        except ApiError as err:
            if err.status in (403, 409):
                return GONE
            # The server's answer for a route it does not have (an unknown job is "job not found").
            if err.status == 404 and str(err.message).startswith("not found: POST"):
                return "unsupported"
            self.log("preparing notice for job %s not delivered: %s" % (job_id, err))
            return False

    def _run_planned(self, job, plan, started, confirmed, preparing=False):
        """Runs a job plan_job planned to its end, and reports how it ended. `preparing`: its image is
        pulled first as preparing (notice_preparing), and the run starts once it is there. An unexpected
        error on the way (an answer of a shape nothing expected, a bug) stops the job's process and
        container and reports the job as this machine's failure: the job's thread ends next, its GPU is
        handed out again, and a container left running would share it unseen."""
        # "run": the job's JobRun once started; "settled": its end reported (or not to be); "forget": what
        # removes a host job's process record; "cleaned": that and its folder done (host_job_ended)
        held = {}
        try:
            self._follow_planned(job, plan, started, confirmed, preparing, held)
        except Exception as err:
            import traceback
            self.log("job %s: unexpected error while it ran: %s" % (job["job_id"], traceback.format_exc().strip()))
            if held.get("settled"):
                return
            container, run = plan[2], held.get("run")
            try:
                if run:
                    run.stop()  # the container too (its kill hook)
                if container:
                    container.remove(self.log)
            finally:
                error = "the provider daemon failed while the job ran (%s: %s); the job was stopped" % (type(err).__name__, err)
                self.report(job["job_id"], False, None, error, {"duration_seconds": round(time.monotonic() - started, 3)},
                            end_reason="provider_error", attempt=job.get("attempt"))
                self.event("job_failed", "error", error, job["job_id"])
        finally:
            if not plan[2]:
                self.host_job_ended(job["job_id"], held)

    def host_job_ended(self, job_id, held):
        """Once a host job (a runner, the benchmark) has ended and its result is read into memory: removes its
        folder (SVC_WORKSPACE) with all in it, then the record of its process group, so that a daemon killed
        in between still removes the folder at its next start. A process a stop could not end keeps both, for
        the next start; a newer attempt of the job running here meanwhile keeps the folder, its own too."""
        run = held.get("run")
        if held.get("cleaned") or (run and run.proc.poll() is None):
            return
        held["cleaned"] = True
        if not self._job_held_elsewhere(job_id):
            remove_job_folder(self.cfg["work_dir"], job_id, self.log)
        held.get("forget", lambda: None)()

    def _follow_planned(self, job, plan, started, confirmed, preparing, held):
        job_id, attempt = job["job_id"], job.get("attempt")
        argv, extra_env, container, result_file = plan
        env = dict(child_environment([self.cfg.get("key"), self.cfg.get("secret")]), **extra_env)
        stdin_text = json.dumps({"job_id": job_id, "job_type": job.get("job_type"), "task_spec": job.get("task_spec")})
        deadline = started + float(job.get("max_duration_seconds") or 1800)
        if container and container.image:
            # The image before `docker run`, which would pull it inside the job's run and under its kill timer.
            pulled = self.ensure_image(job, container, deadline, confirmed, preparing)
            if preparing and pulled is True:
                # Pulled: the first report starts the job's run on the server, and its deadline here.
                confirmed, started = self.confirm_started(job), time.monotonic()
                deadline = started + float(job.get("max_duration_seconds") or 1800)
            if pulled is not True:
                held["settled"] = True
                outcome, error = pulled
                if outcome == "cancelled":
                    self.event("job_cancelled", "info", None, job_id)
                elif outcome == "moved":
                    self.log("job %s is no longer this provider's (the server sent it back to the queue) while its image was pulled" % job_id)
                else:
                    self.report(job_id, False, None, error, {"duration_seconds": round(time.monotonic() - started, 3), "executor": "docker"},
                                end_reason=outcome, attempt=attempt)
                    self.event("job_failed", "warning", error, job_id)
                return
        try:
            # A host process (a runner, the benchmark) is recorded: a container is found by its labels. The
            # record stays past the group's end, until the job's folder is gone too (host_job_ended).
            def record(pid):
                held["forget"] = record_job_process(self.cfg["work_dir"], job_id, pid, argv, self.log)
            run = held["run"] = JobRun(argv, stdin_text, env, os.path.dirname(result_file), container.kill if container else None,
                                       None if container else record)
        except OSError as err:
            held["settled"] = True
            self.event("job_failed", "error", str(err), job_id)
            self.report(job_id, False, None, "could not start the job: %s" % err, {"duration_seconds": 0},
                        end_reason="provider_error", attempt=job.get("attempt"))
            return
        outcome, end_reason = None, "runtime_error"
        reports = JobReports(self, job_id, attempt)
        for key in (container.dropped_env if container else []):
            reports.note("env %s was left out: the provider's daemon decides which GPU the job sees" % key)
        if container and container.dropped_key_env:
            reports.note("env %s was left out: the provider's daemon sets the endpoint's key" % VLLM_API_KEY_ENV)
        for note in (container.env_notes if container else []):
            reports.note(note)
        serve = container.serve if container else None
        if serve:
            serve.watch(run.proc)
        # Every timer of the run on time.monotonic(): a step of the wall clock (NTP, a resumed VM) neither
        # kills a job as timed out nor keeps one past its time.
        last_cancel_check = last_confirm = time.monotonic()
        exited_at, group_killed = None, False
        while True:
            try:
                line = run.lines.get(timeout=0.2)
                if isinstance(line, str):
                    run.taken(line)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if exited_at is None and run.proc.poll() is not None:
                exited_at = time.monotonic()
            elif exited_at is not None and not group_killed and time.monotonic() - exited_at > OUTPUT_AFTER_EXIT_SECONDS:
                group_killed = True
                _kill_tree(run.proc)  # its output ends with it
            if isinstance(line, int):
                reports.note("[svc-daemon] %d log line(s) of this job were dropped here: the job printed them faster than "
                             "the daemon could send them, and at most %d lines wait to be sent" % (line, MAX_QUEUED_LINES))
            elif line:
                progress = parse_progress(line)
                if progress:
                    reports.progress = progress  # the latest wins: sent at most every PROGRESS_SECONDS
                else:
                    reports.add(line)
            now = time.monotonic()
            # Stopping, once the job's process has exited or the stop grace is over, nothing of the job's is
            # sent until its result is on disk: a server that does not answer would hold it there.
            settling = self.stop_event.is_set() and (exited_at is not None or now > self.stop_deadline)
            if not settling and reports.send(now):
                confirmed = True
            # While the server asks to wait (a 429), no request of this job's is sent: it would be refused.
            waiting = settling or time.monotonic() < self.reports_held_until
            if not confirmed and not waiting and now - last_confirm >= CONFIRM_RETRY_SECONDS:
                confirmed, last_confirm = self.confirm_pickup(job_id, attempt), now
            if outcome is not None:
                continue  # being stopped: wait for its end
            if now > deadline:
                outcome = "max_duration_seconds (%s s) exceeded; the job was killed" % job.get("max_duration_seconds")
                end_reason = "timeout"
                run.stop()
            elif not waiting and now - last_cancel_check >= CANCEL_CHECK_SECONDS:
                last_cancel_check = now
                status = self.job_status(job_id, attempt)
                if status in ("cancelled", "failed", "completed"):
                    outcome = "cancelled"
                    run.stop()
                elif status == GONE:
                    # Sent back to the queue (no report reached the server within its pickup window, or
                    # this provider went silent): another provider runs it now, and a result from here
                    # would be refused.
                    outcome = "moved"
                    run.stop()
                elif status == KEY_REFUSED:
                    outcome, end_reason = self.key_refused_error(), "provider_interrupted"
                    run.stop()
            if outcome is None and serve and not settling and serve.due(now):
                reported, refusal = self.report_endpoint(job_id, serve, attempt)
                confirmed = confirmed or reported
                if refusal:
                    outcome, end_reason = refusal, "provider_error"
                    run.stop()
            if self.stop_event.is_set() and outcome is None and exited_at is None and now > self.stop_deadline:
                outcome = "interrupted: the provider daemon stopped before the job finished"
                end_reason = "provider_interrupted"
                run.stop()
        if serve:
            serve.stopped.set()
        code = run.wait()

        def finish():
            # Its last log lines and its latest progress, before its result is sent (the server takes
            # progress only from a job that has not ended), and after it is on disk.
            reports.finish(progress=outcome not in ("cancelled", "moved"))
        duration = round(time.monotonic() - started, 3)
        if container:
            # docker run exits 125 when docker itself failed and when the container's program exited
            # 125; asked before the container is removed.
            if outcome is None and code == 125:
                end_reason = container.exit_125_reason()
            container.remove(self.log)
        metrics = {"duration_seconds": duration, "exit_code": code, "executor": "docker" if container else "process"}
        held["settled"] = True
        # Read into memory first: a host job's folder, where its result lies, goes before the job is reported.
        found, result = read_result_file(result_file) if outcome is None and code == 0 else ("absent", None)
        if not container:
            self.host_job_ended(job_id, held)
        if outcome in ("cancelled", "moved"):
            finish()
        if outcome == "cancelled":
            self.event("job_cancelled", "info", None, job_id)
            return
        if outcome == "moved":
            message = "job %s is no longer this provider's (the server sent it back to the queue); stopped it" % job_id
            self.log(message)
            self.event("job_moved", "warning", message, job_id)
            return
        if outcome is None and code == 0:
            if found == "error":
                outcome, result = result, None
            elif found == "absent":
                result = {"response": "\n".join(run.output).strip()}
            if outcome is None:
                self.report(job_id, True, result, None, metrics, attempt=job.get("attempt"), before_send=finish)
                self.event("job_completed", "info", "%.1fs" % duration, job_id)
                return
        tail = "\n".join(run.tail)[-1000:]
        if outcome is None and container and code == 125 and end_reason == "provider_error":
            error = "docker could not run the job's container (docker run exited 125): %s" % tail
        else:
            error = outcome or "the job exited with status %s: %s" % (code, tail)
        self.report(job_id, False, None, error, metrics, end_reason=end_reason, attempt=job.get("attempt"), before_send=finish)
        self.event("job_failed", "warning", error, job_id)

    def ensure_image(self, job, container, deadline, confirmed, preparing=False):
        """The job's image on this machine before its container runs: there already, or pulled now.
        `preparing`: the server was told so (notice_preparing), and is told again every
        PREPARE_NOTICE_SECONDS; the job's run starts after the pull, which may take PREPARE_WAIT_SECONDS.
        Otherwise (a server without the preparing route) the job's billed time started when it was
        polled, so the pull is within it: PULL_LIMIT_SECONDS at most, ending in time for the job's
        deadline, the pickup confirmed meanwhile. A pull that fails or runs too long is this machine's
        failure (provider_error: re-queued, nothing charged). The job's status is checked as while it
        runs. Returns True, or (end_reason or "cancelled" / "moved", error)."""
        if container.image_present():
            return True
        job_id, attempt, image = job["job_id"], job.get("attempt"), container.image
        started = time.monotonic()
        # Ends before the job's deadline, leaving the report time to reach the server before its own
        # timeout sweep would take the job as the renter's timeout.
        limit = PREPARE_WAIT_SECONDS if preparing else min(PULL_LIMIT_SECONDS, max(0.0, (deadline - started) - min(15.0, (deadline - started) / 4)))
        self.log("pulling image %s for job %s (up to %d s)" % (image, job_id, limit))
        proc, log = container.start_pull()
        if proc is None:
            return "provider_error", "could not pull the job's image %s: %s" % (image, log)
        outcome = None
        last_cancel_check = last_confirm = time.monotonic()
        try:
            while proc.poll() is None:
                time.sleep(0.2)
                now = time.monotonic()
                if preparing and now - last_confirm >= PREPARE_NOTICE_SECONDS:
                    if self.notice_preparing(job_id, attempt, image) == GONE:
                        outcome = ("moved", None)
                    last_confirm = now
                elif not preparing and not confirmed and now - last_confirm >= CONFIRM_RETRY_SECONDS:
                    confirmed, last_confirm = self.confirm_pickup(job_id, attempt), now
                if outcome:
                    pass
                elif now - started > limit:
                    outcome = ("provider_error", "the job's image %s was still being pulled after %d s; the pull was stopped"
                               % (image, now - started))
                elif self.stop_event.is_set() and now > self.stop_deadline:
                    outcome = ("provider_interrupted", "interrupted: the provider daemon stopped while the job's image was pulled")
                elif now - last_cancel_check >= CANCEL_CHECK_SECONDS:
                    last_cancel_check = now
                    status = self.job_status(job_id, attempt)
                    if status in ("cancelled", "failed", "completed"):
                        outcome = ("cancelled", None)
                    elif status == GONE:
                        outcome = ("moved", None)
                    elif status == KEY_REFUSED:
                        outcome = ("provider_interrupted", self.key_refused_error())
                if outcome:
                    _kill_tree(proc)
                    proc.wait()
                    return outcome
            if proc.returncode == 0:
                self.log("pulled image %s in %d s" % (image, time.monotonic() - started))
                return True
            log.seek(0)
            lines = [l.strip() for l in log.read().decode("utf-8", "replace").splitlines() if l.strip()]
            why = lines[-1][:500] if lines else "exit status %s" % proc.returncode
            return "provider_error", "could not pull the job's image %s: %s" % (image, why)
        finally:
            log.close()

    def report_endpoint(self, job_id, serve, attempt=None):
        """endpoint-ready for a serving job whose engine answers its health check, with the engine's key,
        which the server gives its /v1 gateway only. Returns (reported, refusal): refusal is why the
        server refused the endpoint itself (400: no address to join the port to, say), which ends the
        job as this machine's failure instead of leaving it to serve nothing until its time runs out. A
        report the server could not take for now is sent again later; one refused otherwise (the job
        is no longer this provider's) is left to the job's status checks."""
        body = endpoint_report(self.cfg.get("public_host"), serve.host_port)
        where = body.get("endpoint_url") or "port %d" % serve.host_port
        if serve.api_key:
            body["endpoint_api_key"] = serve.api_key
        with_attempt(body, attempt)
        try:
            self.api.post(job_url(job_id, "endpoint-ready"), body)
        except ApiError as err:
            if not result_refused(err.status):
                serve.next_report_at = time.monotonic() + ENDPOINT_RETRY_SECONDS
                self.log("endpoint-ready for %s not delivered: %s; sent again in %g s" % (job_id, err, ENDPOINT_RETRY_SECONDS))
                return False, None
            serve.settled = True
            self.log("endpoint-ready for %s refused: %s" % (job_id, err))
            if err.status == 400:
                return False, "the server refused the endpoint at %s: %s" % (where, err.message)
            return False, None
        serve.settled = True
        self.log("job %s is serving at %s" % (job_id, where))
        if not serve.api_key:
            return True, None  # a custom_container's port: its progress is its own
        self.post_quietly(job_url(job_id, "progress"), with_attempt({"progress_pct": 100, "phase": "serving"}, attempt))
        return True, None

    def post_quietly(self, path, body):
        try:
            self.api.post(path, body)
            return True
        except ApiError as err:
            held = self.hold_reports(err)
            self.log("%s failed: %s%s" % (path, err, "; job logs and progress wait %d s" % held if held else ""))
            return False

    def hold_reports(self, err):
        """An answer that asks the daemon to wait (a 429, or a 503 with a Retry-After): job logs, progress,
        status checks, polls and kept results wait that long (reports_held_until). Returns the seconds, or None."""
        if err.retry_after is None or err.status not in (429, 503):
            return None
        self.reports_held_until = max(self.reports_held_until, time.monotonic() + err.retry_after)
        return err.retry_after

    # -- main loop -----------------------------------------------------------
    def request_stop(self, signum=None, frame=None):
        if not self.stop_event.is_set():
            self.stop_reason = "signal %s" % signum
            self.stop_deadline = time.monotonic() + self.cfg["stop_grace_seconds"]
            self.api.stop_deadline = self.stop_deadline
            self.stop_event.set()
            self.wake.set()

    def stop_watch(self):
        """At a stop, ends the requests still under way when the stop grace is over (a poll, a job's
        report or status check that a server that does not answer would hold for the whole request
        timeout), and again STOP_REPORT_SECONDS later: the daemon exits within that time."""
        self.stop_event.wait()
        if self.api.stop_deadline is None:
            return  # a self-update's restart
        for end in (self.api.stop_deadline, self.api.stop_deadline + STOP_REPORT_SECONDS):
            time.sleep(max(0.0, end - time.monotonic()))
            self.api.cut()

    def next_wait(self):
        """Seconds until the next poll, or sooner when a kept result is due; while the server asks to
        wait (a 429 on a poll, a report or a result), nothing is due before the wait is over."""
        now = time.monotonic()
        wait = max(self.cfg["poll_seconds"], self.reports_held_until - now)
        for _, item in self.results.snapshot():
            wait = min(wait, max(0.05, item["next_at"] - now, self.reports_held_until - now))
        return wait

    def run(self):
        for name in ("SIGTERM", "SIGINT", "SIGBREAK"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), self.request_stop)
        self.log("starting %s against %s" % (DAEMON_VERSION, self.api.base))
        self.results.load()
        # Before any job thread: no job of this run holds a process, container, volume or folder yet.
        kill_leftover_processes(self.cfg["work_dir"], self.log)
        remove_leftovers(self.docker, self.cfg["work_dir"], self.log)
        if self.results.items:
            self.log("%d job result(s) from an earlier run to send" % len(self.results.items))
        self.heartbeat()
        self.readiness()
        self.event("daemon_started", "info", "pid %d" % os.getpid())
        if self.gpus.visible is not None:
            offered = [str(g.get("index")) for g in self.gpus.query()]
            self.log("CUDA_VISIBLE_DEVICES=%r: jobs run on GPU %s" % (self.gpus.visible, ", ".join(offered) or "none"))
        threading.Thread(target=self.heartbeat_loop, daemon=True).start()
        threading.Thread(target=self.stop_watch, daemon=True).start()
        while not self.stop_event.is_set():
            self.wake.clear()
            self.deliver_results()
            # An update restarts this process, which a running job's process would outlive with its result
            # unsent: it waits for a moment with no job running (jobs polled meanwhile still run).
            if self.update_wanted and not self.running_jobs() and self.self_update():
                return 0
            polling = self.approved and not self.paused and time.monotonic() >= self.reports_held_until
            job = self.poll() if polling and self.can_take_job() else None
            if job and self.stop_event.is_set():
                # Stopping: the job is handed back at once (re-queued, nothing charged), not started.
                self.log("job %s handed back: the daemon is stopping" % job["job_id"])
                self.report(job["job_id"], False, None, "interrupted: the provider daemon stopped before the job started",
                            {"duration_seconds": 0}, end_reason="provider_interrupted", attempt=job.get("attempt"))
                break
            if job:
                self.start_job(job)
                continue  # another GPU may be free: poll again at once
            self.wake.wait(self.next_wait())
        self.wait_for_jobs()
        self.flush_results()
        self.event("daemon_stopped", "info", self.stop_reason)
        self.log("stopped (%s)" % self.stop_reason)
        return 0


def parse_runners(specs):
    runners = {}
    for spec in specs:
        for item in spec.split(";"):
            if "=" not in item:
                continue
            job_type, command = item.split("=", 1)
            if job_type.strip() and command.strip():
                runners[job_type.strip()] = shlex.split(command.strip())
    return runners


def load_config(argv):
    import argparse
    parser = argparse.ArgumentParser(description="svc provider daemon")
    parser.add_argument("--url", default=os.environ.get("SVC_BACKEND_URL") or BACKEND_URL)
    parser.add_argument("--key", default=None, help="provider key; prefer SVC_API_KEY: an argument is in the process list, "
                                                    "where every user of the host can read it")
    parser.add_argument("--heartbeat-seconds", type=float, default=float(os.environ.get("SVC_HEARTBEAT_SECONDS") or 30))
    parser.add_argument("--poll-seconds", type=float, default=float(os.environ.get("SVC_POLL_SECONDS") or 10))
    parser.add_argument("--runner", action="append", default=[os.environ.get("SVC_RUNNERS", "")])
    parser.add_argument("--result-retry-seconds", type=float, default=float(os.environ.get("SVC_RESULT_RETRY_SECONDS") or 10),
                        help="how often a job result the server could not take (a 5xx, no answer) is sent again "
                             "(SVC_RESULT_RETRY_SECONDS, default 10)")
    parser.add_argument("--result-keep-seconds", type=float, default=float(os.environ.get("SVC_RESULT_KEEP_SECONDS") or 3600),
                        help="how long such a result is kept and sent again before it is given up, across restarts "
                             "(SVC_RESULT_KEEP_SECONDS, default 3600)")
    parser.add_argument("--key-refused-seconds", type=float, default=float(os.environ.get("SVC_KEY_REFUSED_SECONDS") or 60),
                        help="how long the provider key is refused (401: rotated or revoked) before the running jobs, "
                             "which can no longer be reported on, are stopped (SVC_KEY_REFUSED_SECONDS, default 60)")
    # Accepted for the daemons it replaces, which restart themselves with it: this
    # daemon runs no separate watchdog (a service manager restarts it).
    parser.add_argument("--no-watchdog", action="store_true")
    parser.add_argument("--work-dir", default=os.environ.get("SVC_WORK_DIR") or os.path.join(os.path.expanduser("~"), ".svc-daemon", "work"))
    parser.add_argument("--serve-port", type=int, default=int(os.environ.get("SVC_SERVE_PORT") or 0),
                        help="host port a vllm_serve engine is published on (SVC_SERVE_PORT; default 0: any free port)")
    parser.add_argument("--public-host", default=os.environ.get("SVC_PUBLIC_HOST") or None,
                        help="the address a served endpoint is reached at (SVC_PUBLIC_HOST; unset: the server joins "
                             "the port to the provider's address on record)")
    args = parser.parse_args(argv)
    if args.key is not None:
        sys.stderr.write("svc-daemon: warning: --key puts the provider key in the process list, where every user of this "
                         "host can read it; set SVC_API_KEY instead (or use the file as downloaded, which holds the key)\n")
    else:
        args.key = os.environ.get("SVC_API_KEY") or API_KEY
    if "{{" in args.url or "{{" in args.key:
        parser.error("no backend URL or provider key: download this file from /api/providers/download/daemon with the key "
                     "in the x-provider-key header (docs/daemons.md), or set SVC_API_KEY and pass --url")
    if not 0 <= args.serve_port <= 65535:
        parser.error("--serve-port must be 0 to 65535 (got %d)" % args.serve_port)
    return {
        "url": args.url, "key": args.key, "secret": os.environ.get("SVC_HMAC_SECRET") or HMAC_SECRET,
        "heartbeat_seconds": args.heartbeat_seconds, "poll_seconds": args.poll_seconds,
        "result_retry_seconds": max(0.1, args.result_retry_seconds), "result_keep_seconds": max(0.0, args.result_keep_seconds),
        "key_refused_seconds": max(0.0, args.key_refused_seconds),
        "runners": parse_runners(args.runner), "work_dir": args.work_dir,
        "serve_port": args.serve_port, "public_host": args.public_host,
        "nvidia_smi": os.environ.get("SVC_NVIDIA_SMI") or "nvidia-smi", "docker": os.environ.get("SVC_DOCKER", "docker"),
        "stop_grace_seconds": float(os.environ.get("SVC_STOP_GRACE_SECONDS") or 20),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cached_models": [m for m in os.environ.get("SVC_CACHED_MODELS", "").split(",") if m],
    }


def main(argv=None):
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    try:
        if not private_folder(cfg["work_dir"]):
            sys.stderr.write("svc-daemon: could not make the work folder %s private (mode 0700)\n" % cfg["work_dir"])
        daemon = Daemon(cfg)  # writes the built-in jobs' programs under the work folder
    except OSError as err:
        sys.stderr.write("svc-daemon: cannot use the work folder %s: %s; set --work-dir or SVC_WORK_DIR to a folder "
                         "this user may create and write\n" % (cfg["work_dir"], err))
        return 1
    return daemon.run()


if __name__ == "__main__":
    sys.exit(main())
