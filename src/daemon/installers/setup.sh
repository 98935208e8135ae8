#!/bin/sh
# svc provider setup (Linux and macOS).
#
# Downloads the provider daemon (svc_daemon.py, Python 3 standard library
# only) and installs it as a service that runs the daemon process directly:
# a systemd unit on Linux (system-wide as root, a user unit otherwise) or a
# launchd agent on macOS.
#
#   SETUP=$(printf 'x-provider-key: %s\n' "$PK" | curl -fsSL --max-redirs 0 -H @- '{{BACKEND_URL}}/api/providers/setup') && printf '%s\n' "$SETUP" | sh
#   ... | sh -s -- --run-mode manual
# (A redirect fails the download rather than send the key on to where it points.)
# (`?key=YOUR_KEY` on the URL still works, but do not: it puts the key in curl's
# arguments, where every user of the machine sees it, and in proxies' logs.)
#
# Options (or environment variables):
#   --run-mode always-on|manual|scheduled  (SVC_RUN_MODE, default always-on)
#       always-on: started now and at every boot; manual: installed, started
#       only by you; scheduled: started at boot, the daemon takes jobs only
#       inside the window set in your provider preferences.
#   --prefix DIR        install root, for packaging and tests (SVC_PREFIX)
#   --no-start          write the files, do not enable or start the service
#
# Only functions are defined until the last line runs main: `curl | sh` runs a script as it arrives, so one
# cut short in transit is then a syntax error that runs nothing, not half an install that exits 0.
set -eu
# Everything this script creates is its user's only unless made otherwise below: the daemon file holds the
# provider key and the task-signing secret from its first byte, and the work folder holds renters' tasks.
umask 077

SVC_API_KEY='{{API_KEY}}'
SVC_BACKEND_URL='{{BACKEND_URL}}'
SERVICE_NAME=svc-daemon

say() { printf '==> %s\n' "$*"; }
die() { printf 'svc setup: %s\n' "$*" >&2; exit 1; }

# The key goes in a request header fed on standard input (curl; printf is the shell's own, no
# process) or the environment (python3), never in a command's arguments: those are in the process
# list, readable by every user. The service unit below starts the daemon without it (it is in the file).
fetch() {
  # fetch URL FILE: 0 with the body in FILE on a 2xx; else 1, and FETCH_ERROR says what the server answered
  # (its {"error": ...}: a provider not approved yet, a revoked key) where it answered.
  # Redirects are followed here, and only within URL's origin (scheme, host and port): curl -L and urllib
  # would send the key header on to any host a redirect names.
  FETCH_ERROR=""
  url="$1"
  origin="$(url_origin "$1")"
  hops=0
  while :; do
    fetch_once "$url" "$2" || return 1
    status="${answer%% *}"
    location="${answer#* }"
    case "$status" in 3??) [ -n "$location" ] || break ;; *) break ;; esac
    if [ "$(url_origin "$location")" != "$origin" ]; then
      FETCH_ERROR="HTTP $status: redirected to $location, not $origin: the provider key is not sent there"
      rm -f "$2"
      return 1
    fi
    hops=$((hops + 1))
    [ "$hops" -le 5 ] || { FETCH_ERROR="HTTP $status: too many redirects"; rm -f "$2"; return 1; }
    url="$location"
  done
  case "$status" in 2??) return 0 ;; esac
  FETCH_ERROR="$("$PYTHON" - "$2" "$status" <<'PY'
import json, sys
try:
    with open(sys.argv[1], "rb") as f:
        print("HTTP %s: %s" % (sys.argv[2], json.loads(f.read(65536).decode("utf-8"))["error"]))
except Exception:
    print("HTTP %s" % sys.argv[2])
PY
  )"
  rm -f "$2"
  return 1
}

# url_origin URL: its scheme://host[:port], as written.
url_origin() {
  rest="${1#*://}"
  printf '%s://%s' "${1%%://*}" "${rest%%[/?#]*}"
}

# fetch_once URL FILE: one request, no redirect followed; answer is "STATUS LOCATION" (LOCATION absolute, or
# empty unless a 3xx).
fetch_once() {
  if command -v curl >/dev/null 2>&1; then
    answer="$(printf 'x-provider-key: %s\n' "$SVC_API_KEY" | curl -sS --retry 3 -H @- -o "$2" -w '%{http_code} %{redirect_url}' "$1")"
  else
    answer="$(SVC_FETCH_KEY="$SVC_API_KEY" "$PYTHON" - "$1" "$2" <<'PY'
import os, sys, urllib.error, urllib.parse, urllib.request
class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None
req = urllib.request.Request(sys.argv[1], headers={"x-provider-key": os.environ["SVC_FETCH_KEY"]})
try:
    res = urllib.request.build_opener(NoRedirect).open(req, timeout=120)
except urllib.error.HTTPError as err:
    res = err
except (OSError, ValueError) as err:
    sys.exit("%s" % getattr(err, "reason", err))
with res, open(sys.argv[2], "wb") as out:
    out.write(res.read())
location = res.headers.get("Location", "") if 300 <= res.getcode() < 400 else ""
print(res.getcode(), urllib.parse.urljoin(sys.argv[1], location) if location else "")
PY
    )"
  fi
}

# Values for the systemd unit: systemd reads `%` as a specifier (`%%` is one) and splits ExecStart= and
# Environment= at spaces outside double quotes (inside them `\` and `"` are escaped); ExecStart= also
# expands `$` (`$$` is one) in the arguments, not in the program's path. WorkingDirectory= takes the rest of
# its line, unquoted.
unit_path() { printf '%s' "$1" | sed 's/%/%%/g'; }
unit_word() { printf '"%s"' "$(printf '%s' "$1" | sed -e 's/[\\"]/\\&/g' -e 's/%/%%/g')"; }
exec_word() { unit_word "$1" | sed 's/[$]/$$/g'; }

install_systemd() {
  if [ "$SCOPE" = system ]; then
    UNIT_DIR="${PREFIX}/etc/systemd/system"
    WANTED_BY=multi-user.target
    CTL="systemctl"
    JOURNAL="journalctl"
  else
    UNIT_DIR="${PREFIX}${HOME}/.config/systemd/user"
    WANTED_BY=default.target
    CTL="systemctl --user"
    JOURNAL="journalctl --user"
  fi
  mkdir -p "$UNIT_DIR"
  UNIT="$UNIT_DIR/$SERVICE_NAME.service"
  cat > "$UNIT" <<EOF
[Unit]
Description=svc GPU marketplace provider daemon
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
ExecStart=$(unit_word "$PYTHON") $(exec_word "$DAEMON")
WorkingDirectory=$(unit_path "$INSTALL_DIR")
Environment=PYTHONUNBUFFERED=1
Environment=$(unit_word "SVC_WORK_DIR=$INSTALL_DIR/work")
Restart=always
RestartSec=10
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec=60

[Install]
WantedBy=$WANTED_BY
EOF
  # The unit holds no secret; the service manager and `systemctl status` read it.
  chmod 644 "$UNIT"
  say "wrote $UNIT"
  [ "$START" = 1 ] || return 0
  $CTL daemon-reload
  # An earlier install's daemon may be running (`start` would leave it be, on the old file and key): it is
  # restarted on the file just written, and a manual install leaves nothing enabled at boot.
  if [ "$RUN_MODE" = manual ]; then
    $CTL disable "$SERVICE_NAME"
    $CTL try-restart "$SERVICE_NAME"
    say "run mode manual: start it with '$CTL start $SERVICE_NAME'"
  else
    $CTL enable "$SERVICE_NAME"
    $CTL restart "$SERVICE_NAME"
    if [ "$SCOPE" = user ] && command -v loginctl >/dev/null 2>&1; then
      loginctl enable-linger "$(id -un)" 2>/dev/null || say "run 'loginctl enable-linger' so the daemon runs while you are logged out"
    fi
    say "started: '$CTL status $SERVICE_NAME', logs: '$JOURNAL -u $SERVICE_NAME -f'"
  fi
}

# A string for the launchd plist: XML text, where `&` and `<` begin markup and `>` may end it, so a path
# holding them would make a file launchd refuses, or one with keys of its own.
plist_string() { printf '<string>%s</string>' "$(printf '%s' "$1" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g')"; }

install_launchd() {
  AGENT_DIR="${PREFIX}${HOME}/Library/LaunchAgents"
  mkdir -p "$AGENT_DIR" "$INSTALL_DIR/logs"
  PLIST="$AGENT_DIR/com.svc.daemon.plist"
  if [ "$RUN_MODE" = manual ]; then AT_LOAD=false; else AT_LOAD=true; fi
  cat > "$PLIST" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key><string>com.svc.daemon</string>
  <key>ProgramArguments</key>
  <array>
    $(plist_string "$PYTHON")
    $(plist_string "$DAEMON")
  </array>
  <key>WorkingDirectory</key>$(plist_string "$INSTALL_DIR")
  <key>EnvironmentVariables</key>
  <dict>
    <key>PYTHONUNBUFFERED</key><string>1</string>
    <key>SVC_WORK_DIR</key>$(plist_string "$INSTALL_DIR/work")
  </dict>
  <key>RunAtLoad</key><$AT_LOAD/>
  <key>KeepAlive</key><$AT_LOAD/>
  <key>ExitTimeOut</key><integer>60</integer>
  <key>StandardOutPath</key>$(plist_string "$INSTALL_DIR/logs/daemon.log")
  <key>StandardErrorPath</key>$(plist_string "$INSTALL_DIR/logs/daemon.log")
</dict>
</plist>
EOF
  chmod 644 "$PLIST"
  say "wrote $PLIST"
  [ "$START" = 1 ] || return 0
  launchctl unload "$PLIST" 2>/dev/null || true
  launchctl load "$PLIST"
  if [ "$RUN_MODE" = manual ]; then
    say "run mode manual: start it with 'launchctl start com.svc.daemon'"
  else
    say "started; logs in $INSTALL_DIR/logs/daemon.log"
  fi
}

main() {
  RUN_MODE="${SVC_RUN_MODE:-always-on}"
  PREFIX="${SVC_PREFIX:-}"
  START=1

  while [ $# -gt 0 ]; do
    case "$1" in
      --run-mode) RUN_MODE="${2:?--run-mode needs a value}"; shift 2 ;;
      --run-mode=*) RUN_MODE="${1#--run-mode=}"; shift ;;
      --prefix) PREFIX="${2:?--prefix needs a value}"; shift 2 ;;
      --prefix=*) PREFIX="${1#--prefix=}"; shift ;;
      --no-start) START=0; shift ;;
      -h|--help) echo "usage: setup.sh [--run-mode always-on|manual|scheduled] [--prefix DIR] [--no-start]"; exit 0 ;;
      *) echo "svc setup: unknown option: $1" >&2; exit 2 ;;
    esac
  done

  case "$RUN_MODE" in
    always-on|manual|scheduled) ;;
    *) echo "svc setup: --run-mode must be always-on, manual or scheduled (got '$RUN_MODE')" >&2; exit 2 ;;
  esac

  OS="${SVC_OS:-$(uname -s)}"
  PYTHON="$(command -v python3 || true)"
  [ -n "$PYTHON" ] || die "python3 is needed (install it with your package manager, then run this again)"
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)' || die "python 3.8 or newer is needed"

  if [ "$(id -u)" = "0" ] && [ "$OS" = "Linux" ]; then
    SCOPE=system
    INSTALL_DIR="${PREFIX}/opt/svc-daemon"
  else
    SCOPE=user
    INSTALL_DIR="${PREFIX}${HOME}/.svc-daemon"
  fi
  DAEMON="$INSTALL_DIR/svc_daemon.py"

  say "installing the svc provider daemon into $INSTALL_DIR ($RUN_MODE)"
  mkdir -p "$INSTALL_DIR/work"
  # Made private also when an earlier install left them open.
  chmod 700 "$INSTALL_DIR" "$INSTALL_DIR/work"
  TMP="$DAEMON.download"
  fetch "$SVC_BACKEND_URL/api/providers/download/daemon" "$TMP" || die "could not download the daemon from $SVC_BACKEND_URL${FETCH_ERROR:+: $FETCH_ERROR}"
  "$PYTHON" -m py_compile "$TMP" || die "the downloaded daemon is not valid Python"
  rm -rf "$INSTALL_DIR/__pycache__"
  mv "$TMP" "$DAEMON"
  chmod 700 "$DAEMON"

  # Tell the service the chosen run mode (best effort: the daemon works without it).
  if command -v curl >/dev/null 2>&1; then
    printf '{"key":"%s","run_mode":"%s"}' "$SVC_API_KEY" "$RUN_MODE" |
      curl -fsS -o /dev/null -X POST -H 'content-type: application/json' --data-binary @- \
        "$SVC_BACKEND_URL/api/providers/preferences" || say "could not save the run mode (set it later in your dashboard)"
  fi

  case "$OS" in
    Linux)
      command -v systemctl >/dev/null 2>&1 || [ "$START" = 0 ] || die "systemd is needed (or run: $PYTHON $DAEMON)"
      install_systemd ;;
    Darwin) install_launchd ;;
    *) die "unsupported system '$OS': on Windows use /api/providers/setup-windows" ;;
  esac

  if ! command -v nvidia-smi >/dev/null 2>&1; then
    say "note: nvidia-smi was not found; the daemon runs CPU-only jobs until an NVIDIA driver is installed"
  fi
  say "done"
}

main "$@"
