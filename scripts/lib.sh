# Shared by scripts/run and scripts/test: find Python, make the virtualenv, install what is missing.
# shellcheck shell=bash
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

log() { printf '\033[1m==>\033[0m %s\n' "$*" >&2; }

pick_python() {
  # torch==2.13.0 comes from a local CPU wheel built for Python 3.11; prefer that interpreter.
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
      echo "$candidate"; return
    fi
  done
  echo "error: Python 3.11+ is required" >&2; exit 1
}

ensure_venv() {
  if [ ! -x "$PY" ]; then
    log "creating virtualenv in .venv"
    "$(pick_python)" -m venv "$VENV"
  fi
  # Reinstall only when the dependencies or their pins changed (a stamp holds the hash of
  # pyproject.toml and constraints.txt).
  local stamp="$VENV/.modelless-installed" want
  want="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing Python packages at constraints.txt's versions (torch: the local CPU wheel)"
    # pip's configured extra indexes print a warning per package; keep the real errors only.
    "$PY" -m pip install --disable-pip-version-check -q -e "${ROOT}[server,worker,train,bench,tracing,dev]" \
      --constraint "$ROOT/constraints.txt" 2>&1 | grep -v "^WARNING: Location 'file://" >&2 || true
    "$PY" -c 'import torch, onnxruntime, fastapi, redis, moto, pydantic_settings' \
      || { echo "error: Python packages failed to install" >&2; exit 1; }
    echo "$want" > "$stamp"
  fi
}

# Poll a command until it succeeds (its output discarded), for at most SECONDS; fail saying what
# never happened. The limit is generous on purpose: a service starting on a busy machine takes
# many times longer than on an idle one, and the wait ends as soon as the command succeeds.
wait_until() { # seconds "what is awaited" command [args…]
  local seconds="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "error: timed out after ${seconds} s waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}

redis_answers() { # host port
  "$PY" - "$@" <<'PYEOF' >/dev/null 2>&1
import sys, redis
redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), socket_connect_timeout=0.5).ping()
PYEOF
}

ensure_redis_server_binary() {
  if ! command -v redis-server >/dev/null 2>&1; then
    log "installing Debian's redis-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq redis-server >/dev/null
  fi
}

# The dashboard's browser test (tests/e2e/test_dashboard.py) drives Debian's chromium through
# Playwright's bundled driver; no browser is downloaded from elsewhere (no `playwright install`).
CHROMIUM="${MODELLESS_CHROMIUM:-/usr/bin/chromium}"
ensure_chromium() {
  if [ ! -x "$CHROMIUM" ]; then
    log "installing Debian's chromium (the dashboard's browser test)"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; }; then
      echo "error: could not install chromium with apt-get (the dashboard's browser test needs it;" \
        "MODELLESS_CHROMIUM names another binary)" >&2
      exit 1
    fi
  fi
  if ! "$CHROMIUM" --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1; then
    echo "error: $CHROMIUM does not run" >&2
    exit 1
  fi
  export MODELLESS_CHROMIUM="$CHROMIUM"
}

# LocalStack, for the functional tests' second AWS emulator (scripts/test-localstack). Its release
# here starts without Docker (host mode) only under Python 3.13, so it gets a virtualenv of its
# own, kept across runs outside the repository; the pins below keep its dependencies at releases
# it works with. A failed install is an error, never a skipped lane.
LOCALSTACK_VENV="${MODELLESS_LOCALSTACK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/modelless/localstack-venv}"
LOCALSTACK_REQUIREMENT="localstack-core[runtime]==2026.3.0"
LOCALSTACK_CONSTRAINTS=("cbor2<6" "pyopenssl<26.1" "localstack-twisted<26")

localstack_python() { # the 3.13 interpreter LocalStack's venv is made with
  local candidate
  for candidate in "${MODELLESS_LOCALSTACK_PYTHON:-}" python3.13 "$HOME/.pyenv/versions/3.13.0/bin/python"; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null; then
      echo "$candidate"; return
    fi
  done
  echo "error: LocalStack needs Python 3.13 (set MODELLESS_LOCALSTACK_PYTHON to its interpreter)" >&2
  return 1
}

ensure_localstack() {
  local stamp="$LOCALSTACK_VENV/.modelless-installed" want python
  want="$(printf '%s\n' "$LOCALSTACK_REQUIREMENT" "${LOCALSTACK_CONSTRAINTS[@]}" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$LOCALSTACK_VENV/bin/python" ]; then
    return 0
  fi
  python="$(localstack_python)" || return 1
  log "installing $LOCALSTACK_REQUIREMENT in $LOCALSTACK_VENV (Python 3.13)"
  rm -rf "$LOCALSTACK_VENV"
  mkdir -p "$(dirname "$LOCALSTACK_VENV")"
  "$python" -m venv "$LOCALSTACK_VENV" || { echo "error: cannot create $LOCALSTACK_VENV" >&2; return 1; }
  printf '%s\n' "${LOCALSTACK_CONSTRAINTS[@]}" > "$LOCALSTACK_VENV/constraints.txt"
  # pip's configured extra indexes print a warning per package; keep the real errors only.
  if ! "$LOCALSTACK_VENV/bin/python" -m pip install --disable-pip-version-check -q \
      --constraint "$LOCALSTACK_VENV/constraints.txt" "$LOCALSTACK_REQUIREMENT" 2>&1 \
      | { grep -v "^WARNING: Location 'file://" || true; } >&2; then
    echo "error: LocalStack failed to install in $LOCALSTACK_VENV (above)" >&2
    return 1
  fi
  "$LOCALSTACK_VENV/bin/python" -c 'import localstack.runtime.main' \
    || { echo "error: LocalStack installed but does not import" >&2; return 1; }
  echo "$want" > "$stamp"
}
