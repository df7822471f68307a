#!/usr/bin/env bash
# A real Prometheus (Debian's) scrapes moed's HTTP endpoint ([metrics].listen)
# and evaluates the shipped rules (configs/prometheus/moed-alerts.yml):
#   - two jobs, a 4-rank one in 2 islands under a skewed workload ([workload].hot_ratio)
#     and a 2-rank balanced one, each serving /metrics on rank 0 at a free
#     port it chose (port 0, logged);
#   - Prometheus on loopback, in a temp dir, with its own config (1 s scrape
#     and evaluation intervals, the rules' `for` cut to 2 s);
#   - its HTTP API has the golden signals of both jobs, as many series as
#     the model's shape gives (docs/metrics.md), and MoedExpertLoadSpread
#     fires for the skewed job only; moed's own alert says the same in
#     `moectl status` and moed_alert_firing;
#   - the endpoint answers 404 with its pages elsewhere; a port in use and a
#     listen address without a host are refused at start (exit 2);
#   - 12 connections that trickle requests a byte at a time do not starve it:
#     /metrics answers and Prometheus scrapes meanwhile, and the request
#     deadline closes them with a 408 (tests/mpi/http_slow_clients.py).
# Everything started here is stopped on any exit (trap). Skipped (77)
# without prometheus and promtool (ci/install-deps.sh installs them).
source "$(dirname "$0")/lib.sh"
: "${MOECTL:?}"
command -v prometheus >/dev/null && command -v promtool >/dev/null ||
  { echo "skip: prometheus or promtool not installed (apt-get install prometheus)"; exit 77; }

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do end_daemon "$p"; done
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

# start_moed NAME RANKS [flags...]: serving in the background; sets PORT_<NAME>.
start_moed() {
  local name=$1 ranks=$2
  shift 2
  mkdir -p "$SCRATCH/$name"
  mpirun --bind-to none -np "$ranks" "$MOED" --config "$SMALL" --set workload.steps=1000000 \
    --set 'metrics.listen="127.0.0.1:0"' --set metrics.alert_for_s=1 --set "admin.dir=\"$SCRATCH/$name/admin\"" \
    --log-level info "$@" >"$SCRATCH/$name/log" 2>&1 &
  pids+=($!)
}
# wait_endpoint NAME: the port rank 0 logged, once /metrics answers 200.
wait_endpoint() {
  local name=$1 port=""
  for _ in $(seq 600); do
    port=$(grep -om1 'metrics endpoint http://127.0.0.1:[0-9]*' "$SCRATCH/$name/log" | sed 's/.*://') || true
    [ -n "$port" ] && curl -sf -o /dev/null "http://127.0.0.1:$port/metrics" && { echo "$port"; return; }
    grep -q "not serving" "$SCRATCH/$name/log" && break
    sleep 0.1
  done
  cat "$SCRATCH/$name/log" >&2
  fail "$name: no /metrics answer within 60 s"
}

start_moed skewed 4 --set workload.hot_ratio=3.5 --set cluster.ranks_per_island=2
# Over a window of 64 steps, not 8: the balanced job's sampled spread then
# stays far below 0.15 (over 8 steps it reached 0.147 in 76,000 steps).
start_moed balanced 2 --set workload.hot_ratio=1 --set metrics.load_window_steps=64
skewed=$(wait_endpoint skewed)
balanced=$(wait_endpoint balanced)
echo "ok: /metrics served on rank 0: skewed job at 127.0.0.1:$skewed, balanced job at 127.0.0.1:$balanced"

# The endpoint itself: other paths list the pages; a second daemon on the
# same port, and a listen address without a host, are refused at start.
code=$(curl -s -o "$SCRATCH/404.txt" -w '%{http_code}' "http://127.0.0.1:$skewed/nope")
[ "$code" = 404 ] && grep -q "^/metrics " "$SCRATCH/404.txt" || fail "/nope: HTTP $code, $(cat "$SCRATCH/404.txt")"
curl -sfI "http://127.0.0.1:$skewed/metrics" | grep -qi '^content-type: text/plain; version=0.0.4' ||
  fail "/metrics is not Prometheus text 0.0.4"
expect_failure 2 "\[metrics\].listen = \"127.0.0.1:$skewed\": cannot listen: the port is in use" "a port in use" -- \
  "$MOED" --config "$SMALL" --set "metrics.listen=\"127.0.0.1:$skewed\""
expect_failure 2 'name the host' "a listen address without a host" -- \
  "$MOED" --config "$SMALL" --set 'metrics.listen=":9464"'

# Prometheus: its own config and the shipped rules with `for` cut to 2 s.
promtool check rules "$MOED_SOURCE_DIR/configs/prometheus/moed-alerts.yml" >/dev/null ||
  fail "promtool rejects configs/prometheus/moed-alerts.yml"
(cd "$MOED_SOURCE_DIR/configs/prometheus" && promtool check config prometheus.yml >/dev/null) ||
  fail "promtool rejects configs/prometheus/prometheus.yml"
echo "ok: promtool accepts the shipped rules and scrape config"
prom=$SCRATCH/prometheus
mkdir -p "$prom"
sed -E 's/for: [0-9]+[sm]$/for: 2s/' "$MOED_SOURCE_DIR/configs/prometheus/moed-alerts.yml" >"$prom/rules.yml"
cat >"$prom/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [rules.yml]
scrape_configs:
  - job_name: moed
    static_configs:
      - targets: ["127.0.0.1:$skewed", "127.0.0.1:$balanced"]
YAML
promtool check config "$prom/prometheus.yml" >/dev/null || fail "promtool rejects the test's config"
web=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
prometheus --config.file="$prom/prometheus.yml" --storage.tsdb.path="$prom/data" \
  --web.listen-address="127.0.0.1:$web" --log.level=warn >"$prom/log" 2>&1 &
pids+=($!)
api="http://127.0.0.1:$web/api/v1"
for _ in $(seq 300); do curl -sf -o /dev/null "http://127.0.0.1:$web/-/ready" && break; sleep 0.1; done
curl -sf -o /dev/null "http://127.0.0.1:$web/-/ready" || { cat "$prom/log" >&2; fail "prometheus not ready in 30 s"; }

# query EXPR: one line per series, "instance value".
query() {
  curl -sfG "$api/query" --data-urlencode "query=$1" | python3 -c '
import json, sys
for r in json.load(sys.stdin)["data"]["result"]:
    print(r["metric"].get("instance", "-"), r["value"][1])'
}
both_scraped() {
  [ "$(query 'up{job="moed"} == 1 and on (instance) moed_recent_step_latency_ms{quantile="0.99"} > 0' | wc -l)" = 2 ]
}
wait_until 120 both_scraped || fail "prometheus does not scrape both jobs after 120 s"
echo "ok: prometheus scrapes both jobs"

# The golden signals of both jobs, in one query, checked in one pass (each
# process start is slow on a loaded machine).
curl -sfG "$api/query" --data-urlencode 'query={job="moed",__name__=~"moed_.*|scrape_samples_scraped"}' \
  >"$SCRATCH/signals.json" || fail "cannot query prometheus"
python3 - "$SCRATCH/signals.json" "127.0.0.1:$skewed" "127.0.0.1:$balanced" <<'PY' || fail "the golden signals (above)"
import json, sys
path, skewed, balanced = sys.argv[1:]
series = {}
for r in json.load(open(path))["data"]["result"]:
    m = dict(r["metric"])
    name, instance = m.pop("__name__"), m.pop("instance")
    m.pop("job", None)
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(m.items()))
    series[(instance, name + (f"{{{labels}}}" if labels else ""))] = float(r["value"][1])
def value(instance, name):
    if (instance, name) not in series:
        sys.exit(f"FAIL: {instance} has no {name}")
    return series[(instance, name)]
for name in ["moed_tokens_per_second", "moed_recent_tokens_per_second", "moed_tokens_total",
             'moed_recent_step_latency_ms{quantile="0.99"}',
             'moed_recent_alltoall_wait_ms{phase="combine",quantile="0.99"}',
             'moed_recent_alltoall_wait_ms{phase="dispatch",quantile="0.99"}',
             'moed_bytes_sent_total{link="cross_island"}']:
    v = value(skewed, name)
    if not v > 0:
        sys.exit(f"FAIL: {name} = {v} on the skewed job")
    print(f"ok: {name} = {v:.6g}")
for instance in (skewed, balanced):
    if value(instance, "moed_activation_rate") != 0.25:
        sys.exit(f"FAIL: activation rate {value(instance, 'moed_activation_rate')}, top-2 of 8 is 0.25")
    layers = [k for (i, k) in series if i == instance and k.startswith("moed_layer_activation_rate{")]
    if len(layers) != 3:
        sys.exit(f"FAIL: {instance}: {len(layers)} layers of activation rates, the model has 3")
    # Cardinality: 48 series for the job, 11 + 2 x 3 hot experts per layer, 3 layers, 3 per rank.
    ranks = 4 if instance == skewed else 2
    n = value(instance, "scrape_samples_scraped")
    if n != 99 + 3 * ranks:
        sys.exit(f"FAIL: {instance}: {n:.0f} series scraped, the shape gives 48 + 3 x 17 + 3 x {ranks} = {99 + 3 * ranks}")
print("ok: activation rate 0.25 (top-2 of 8) in all and in each of 3 layers; 111 and 105 series (4 and 2 ranks), as the shape gives")
spread = {i: value(i, "moed_expert_load_std_over_mean") for i in (skewed, balanced)}
print(f"ok: load std/mean: skewed {spread[skewed]:.3f}, balanced {spread[balanced]:.3f} (limit 0.15)")
if not spread[skewed] > 0.15 > spread[balanced]:
    sys.exit("FAIL: the workloads do not straddle the load limit")
PY

# The rule fires for the skewed job, and only for it.
alerts() {
  curl -sf "$api/alerts" | python3 -c '
import json, sys
for a in json.load(sys.stdin)["data"]["alerts"]:
    print(a["labels"]["alertname"], a["labels"].get("instance", "-"), a["state"], a["annotations"]["summary"])'
}
skewed_fires() { alerts | grep -q "^MoedExpertLoadSpread 127.0.0.1:$skewed firing"; }
wait_until 120 skewed_fires || true
alerts | tee "$SCRATCH/alerts.txt"
grep -q "^MoedExpertLoadSpread 127.0.0.1:$skewed firing" "$SCRATCH/alerts.txt" ||
  fail "MoedExpertLoadSpread does not fire for the skewed job within 120 s"
# (Other rules may be pending on a loaded machine: two jobs share 2 cores here.)
grep -q "^MoedExpertLoadSpread 127.0.0.1:$balanced" "$SCRATCH/alerts.txt" && fail "a load alert for the balanced job"
echo "ok: prometheus fires MoedExpertLoadSpread for the skewed job only"

# moed's own evaluation agrees.
firing=$(query 'moed_alert_firing{alert="load_spread"}' | sort)
[ "$firing" = "$(printf '127.0.0.1:%s 0\n127.0.0.1:%s 1' "$balanced" "$skewed" | sort)" ] ||
  fail "moed_alert_firing{alert=\"load_spread\"}: $firing (want 1 for the skewed job only)"
"$MOECTL" --dir "$SCRATCH/skewed/admin" status | tee "$SCRATCH/status.txt" | grep -q "expert load std/mean .* > 0.15 for .* s: .*moectl reoptimize --apply" ||
  { cat "$SCRATCH/status.txt" >&2; fail "moectl status lacks the load alert"; }
echo "ok: moectl status: $(grep -om1 'expert load std/mean [^:]*' "$SCRATCH/status.txt")"

# Slow clients cannot starve the endpoint (issue 33: 8 connections trickling
# a request a byte at a time took all 8 of its threads, and /metrics went
# silent while they lasted). 12 connections trickle, opened again as the
# request deadline closes them: /metrics answers a new connection meanwhile
# (it queues behind them in accept order), Prometheus scrapes the job
# successfully, and the deadline answers each of the first 12 with a 408.
python3 "$MOED_SOURCE_DIR/tests/mpi/http_slow_clients.py" 127.0.0.1 "$skewed" 12 >"$SCRATCH/slow.txt" &
pids+=($!)
wait_until 60 grep -q '^trickling 12' "$SCRATCH/slow.txt" || fail "the slow clients did not start"
trickling_since=$(date +%s.%N)
for _ in 1 2 3; do
  curl -sf --max-time 20 -o /dev/null "http://127.0.0.1:$skewed/metrics" ||
    fail "/metrics did not answer within 20 s beside 12 connections trickling requests"
done
scraped_while_trickling() {
  local at
  at=$(query "timestamp(up{instance=\"127.0.0.1:$skewed\"} == 1)" | awk '{print $2}')
  [ -n "$at" ] && python3 -c "import sys; sys.exit(0 if $at > $trickling_since else 1)"
}
wait_until 60 scraped_while_trickling || fail "no successful scrape by prometheus while 12 connections trickle"
timed_out_408() { [ "$(awk '/^closed/ {n = $4} END {print n + 0}' "$SCRATCH/slow.txt")" -ge 12 ]; }
wait_until 120 timed_out_408 || fail "the request deadline did not close the 12 trickling connections with a 408: $(tail -1 "$SCRATCH/slow.txt")"
echo "ok: beside 12 connections trickling requests, /metrics answers and prometheus scrapes; the request deadline closes them ($(tail -1 "$SCRATCH/slow.txt"))"
