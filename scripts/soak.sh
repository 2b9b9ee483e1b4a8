#!/usr/bin/env bash
# A soak of `tandem serve`: starts target/release/tandem serve -m MODEL on a free loopback port with
# issue 45's settings (--kv-budget 256M --max-queue 16, short client time limits, then any extra serve
# flags given), waits for /health, runs `tandem bench serve --soak MINUTES` with 12 clients against it,
# then stops the server with SIGTERM and checks that it exits 0 within 10 s. Exits non-zero when the soak misses a target or the
# server does not stop cleanly.
#
#   scripts/soak.sh MODEL MINUTES [extra serve flags]
#
# SOAK_ARGS replaces the soak's load flags (default: --short-tokens 32 --long-every 8); SOAK_JSON, a path,
# keeps the report as JSON too.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  echo "usage: $0 MODEL MINUTES [extra serve flags]" >&2
  exit 2
fi
model=$1
minutes=$2
shift 2
tandem=target/release/tandem
soak_args=${SOAK_ARGS:---short-tokens 32 --long-every 8}

log=$(mktemp)
server=
# Whether a child is still running: an exited one is a zombie until waited for, which kill -0 still finds.
alive() {
  [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}
cleanup() {
  if [ -n "$server" ] && alive "$server"; then
    kill -KILL "$server" 2>/dev/null || true
  fi
  rm -f "$log"
}
trap cleanup EXIT

# Port 0: the kernel picks a free port, and the server prints the address it bound.
# Head and body limits under the soak's 4 s stalls, the idle limit under its 8 s idle connections, so the
# soak sees the server cut every slow client (later flags override these).
"$tandem" serve -m "$model" --host 127.0.0.1 --port 0 --kv-budget 256M --max-queue 16 \
  --timeout-head 2 --timeout-body 2 --timeout-idle 3 "$@" 2>"$log" &
server=$!

addr=
for _ in $(seq 1 240); do
  addr=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -n 1 | sed 's|http://||') || true
  [ -n "$addr" ] && break
  if ! alive "$server"; then
    echo "soak: the server exited before it listened:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.5
done
if [ -z "$addr" ]; then
  echo "soak: the server did not listen within 120 s" >&2
  cat "$log" >&2
  exit 1
fi
port=${addr##*:}

# GET /health over bash's /dev/tcp (no curl needed); true when the answer is a 200.
health() {
  timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port &&
    printf 'GET /health HTTP/1.1\r\nHost: $addr\r\nConnection: close\r\n\r\n' >&3 &&
    head -n 1 <&3 | grep -q ' 200 '" 2>/dev/null
}
for _ in $(seq 1 60); do
  health && break
  sleep 0.5
done
if ! health; then
  echo "soak: $addr/health did not answer 200 within 30 s" >&2
  exit 1
fi
echo "soak: server pid $server on $addr ($model, --kv-budget 256M --max-queue 16${*:+ $*})" >&2

status=0
json_args=()
if [ -n "${SOAK_JSON:-}" ]; then
  json_args=(--json "$SOAK_JSON")
fi
# shellcheck disable=SC2086 # SOAK_ARGS is a list of flags
"$tandem" bench serve --addr "$addr" --soak "$minutes" --clients 12 --server-pid "$server" \
  $soak_args "${json_args[@]}" || status=$?

kill -TERM "$server"
stopped=
for _ in $(seq 1 100); do
  if ! alive "$server"; then
    stopped=1
    break
  fi
  sleep 0.1
done
if [ -z "$stopped" ]; then
  echo "soak: the server did not exit within 10 s of SIGTERM" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
server_status=0
wait "$server" || server_status=$?
server=
if [ "$server_status" -ne 0 ]; then
  echo "soak: the server exited with status $server_status after SIGTERM" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
echo "soak: the server stopped cleanly after SIGTERM" >&2
exit "$status"
