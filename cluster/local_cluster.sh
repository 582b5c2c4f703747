#!/usr/bin/env bash
# A two-node Ray cluster on this machine: a head node (custom resource "node1") and a second
# node (custom resource "node2") with its own ports and temp dir. Every port either node listens on
# lies in PORT .. PORT+299, so two clusters with different PORTs never collide.
#   cluster/local_cluster.sh start [PORT]   -> prints the address; `--address auto` finds it too
#   cluster/local_cluster.sh stop
# `ray` is the one of the project's Python: $PYTHON, else the active virtualenv, else the
# repository's .venv, else python3 (never whatever `ray` is first on PATH), run through
# ray_loopback.py so that the nodes keep 127.0.0.1 and listen on loopback only. $RAY overrides it
# (and then Ray picks the nodes' address itself).
set -euo pipefail
HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then PYTHON="$VIRTUAL_ENV/bin/python"
  elif [ -x "$HERE/../.venv/bin/python" ]; then PYTHON="$HERE/../.venv/bin/python"
  else PYTHON="python3"; fi
fi
ray_cli() {
  if [ -n "${RAY:-}" ]; then "$RAY" "$@"; else "$PYTHON" "$HERE/ray_loopback.py" "$@"; fi
}
PORT="${2:-${REPLICAS_CLUSTER_PORT:-6390}}"
BASE="${REPLICAS_CLUSTER_DIR:-/tmp/replicas-cluster}"
# Where Ray's "auto" looks first (after $RAY_ADDRESS) for the cluster to join: `ray start` writes
# it in its own temp dir, which is $BASE/ray here, so "auto" would pick any Ray on the machine.
# Ray's default temp dir on Linux: $RAY_TMPDIR, else $TMPDIR, else /tmp.
CURRENT="${RAY_TMPDIR:-${TMPDIR:-/tmp}}/ray/ray_current_cluster"
export RAY_USAGE_STATS_ENABLED=0
# A driver that already joined another Ray exports RAY_ADDRESS: this cluster is a new one.
unset RAY_ADDRESS
# Ray's token authentication, as for any `ray start` cluster (RAY_AUTH_MODE=disabled turns it off):
# the token is Ray's own (~/.ray/auth_token, made here if missing). A driver of this package finds
# out which mode the cluster uses before it joins (replicas/cluster/address.py).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
case "${1:-}" in
  start)
    mkdir -p "$BASE"
    if [ "$RAY_AUTH_MODE" = token ]; then ray_cli get-auth-token --generate >/dev/null 2>&1; fi
    ray_cli start --head --port="$PORT" --node-ip-address=127.0.0.1 --temp-dir="$BASE/ray" \
      --num-cpus=1 --resources='{"node1": 1000}' --include-dashboard=false --disable-usage-stats \
      --node-manager-port=$((PORT + 1)) --object-manager-port=$((PORT + 2)) \
      --dashboard-agent-listen-port=$((PORT + 6)) \
      --dashboard-agent-grpc-port=$((PORT + 7)) --runtime-env-agent-port=$((PORT + 8)) \
      --metrics-export-port=$((PORT + 9)) \
      --min-worker-port=$((PORT + 100)) --max-worker-port=$((PORT + 199)) >"$BASE/head.log" 2>&1 \
      || { tail -n 30 "$BASE/head.log" >&2; exit 1; }
    ray_cli start --address="127.0.0.1:$PORT" --node-ip-address=127.0.0.1 \
      --num-cpus=1 --resources='{"node2": 1000}' \
      --node-manager-port=$((PORT + 3)) --object-manager-port=$((PORT + 4)) \
      --dashboard-agent-listen-port=$((PORT + 10)) --dashboard-agent-grpc-port=$((PORT + 11)) \
      --runtime-env-agent-port=$((PORT + 12)) --metrics-export-port=$((PORT + 13)) \
      --min-worker-port=$((PORT + 200)) --max-worker-port=$((PORT + 299)) \
      --disable-usage-stats >"$BASE/node2.log" 2>&1 \
      || { tail -n 30 "$BASE/node2.log" >&2; exit 1; }
    mkdir -p "$(dirname "$CURRENT")"
    echo "127.0.0.1:$PORT" >"$CURRENT"
    echo "127.0.0.1:$PORT" >"$BASE/address"
    echo "127.0.0.1:$PORT"
    ;;
  stop)
    # Only this cluster's processes (their command lines name $BASE): `ray stop` would also end
    # every other Ray session on the machine, such as a test run's own.
    # Ray's agents rename themselves ("ray::DashboardAgent"): found by the logs they hold open.
    agents() {
      for pid in $(pgrep -f -- "^ray::" || true); do
        ls -l "/proc/$pid/fd" 2>/dev/null | grep -q -- "$BASE/ray" && echo "$pid"
      done
      return 0
    }
    stray="$(agents)"
    pkill -TERM -f -- "$BASE/ray" >/dev/null 2>&1 || true
    [ -z "$stray" ] || kill -TERM $stray 2>/dev/null || true
    for _ in $(seq 25); do
      pgrep -f -- "$BASE/ray" >/dev/null || [ -n "$(agents)" ] || break
      sleep 0.2
    done
    pkill -KILL -f -- "$BASE/ray" >/dev/null 2>&1 || true
    stray="$(agents)"
    [ -z "$stray" ] || kill -KILL $stray 2>/dev/null || true
    if [ -f "$BASE/address" ] && [ "$(cat "$CURRENT" 2>/dev/null)" = "$(cat "$BASE/address")" ]; then
      rm -f "$CURRENT"
    fi
    rm -f "$BASE/address"
    ;;
  *)
    echo "usage: $0 start|stop [PORT]" >&2
    exit 2
    ;;
esac
