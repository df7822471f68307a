#!/usr/bin/env bash
# The dashboard at / in a real browser (Debian's headless Chromium):
#   - a 4-rank moed in 2 islands with the front door and [metrics].listen on;
#     skewed traffic through every rank's front door, a live migration
#     (moectl migrate), then traffic whose hot experts have moved;
#   - the JSON endpoints refuse bad queries with 400 and a reason;
#   - Chromium loads the page, lets its scripts fetch and draw (virtual time),
#     and dumps the DOM: the heatmap has a row of cells per expert of the
#     model, its cells add up to the tokens /metrics counts (x top-k), and
#     every figure the page shows (data-* attributes: the golden signals of
#     the job and of each rank, the layer's load figures and hottest expert,
#     the migration's state and progress) equals /metrics; the migrated
#     expert shows on its new rank; the co-activation's top pair is the one
#     `moectl stats` names;
#   - a screenshot is kept in the build tree ($MOED_BUILD_DIR/artifacts/dashboard.png).
# The front door keeps the figures still once the traffic stops, so the page
# and /metrics see the same step. Everything started here is stopped on any
# exit. Skipped (77) without chromium (ci/install-deps.sh installs it).
source "$(dirname "$0")/lib.sh"
: "${MOECTL:?}" "${MOED_BUILD_DIR:?}"
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "skip: chromium not installed (apt-get install chromium)"; exit 77; }
PYTHON=/usr/bin/python3

daemon=""
cleanup() {
  [ -n "$daemon" ] && end_daemon "$daemon"
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

run=$SCRATCH/run
mkdir -p "$run"
mpirun --bind-to none -np 4 "$MOED" --config "$SMALL" --log-level info \
  --set workload.kind=ingress --set "ingress.dir=\"$run/sock\"" --set "admin.dir=\"$run/admin\"" \
  --set cluster.ranks_per_island=2 --set workload.warmup_steps=0 \
  --set 'metrics.listen="127.0.0.1:0"' --set metrics.heatmap_columns=4096 --set metrics.heatmap_column_steps=1 \
  --set "stats.file=\"$run/stats.bin\"" --set stats.every_steps=4 --set migration.chunk_mb=0.01 \
  >"$run/log" 2>&1 &
daemon=$!
port=""
for _ in $(seq 600); do
  port=$(grep -om1 'metrics endpoint http://127.0.0.1:[0-9]*' "$run/log" | sed 's/.*://') || true
  [ -n "$port" ] && [ "$(ls "$run/sock" 2>/dev/null | grep -c 'ingress-.*sock$')" = 4 ] && break
  kill -0 $daemon 2>/dev/null || { cat "$run/log" >&2; fail "moed stopped before serving"; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$run/log" >&2; fail "no metrics endpoint logged within 60 s"; }
url=http://127.0.0.1:$port
grep -q "dashboard $url/" "$run/log" || fail "rank 0 does not log the dashboard's URL"

traffic() { $PYTHON "$MOED_SOURCE_DIR/tests/mpi/dashboard_traffic.py" "$run/sock" 4 "$1" "$2" || fail "traffic phase $1"; }
sent=$(traffic 1 12)
# moectl follows the migration to its end; its last stage (release) waits
# for a step served on the new placement, so the second phase's traffic
# finishes it: it goes on, 4 rounds at a time, for as long as the migration
# runs (a loaded machine may not have reached release after the first 12).
timeout 120 "$MOECTL" --dir "$run/admin" migrate 0 0 3 >"$SCRATCH/migrate.txt" 2>&1 &
follow=$!
sent=$((sent + $(traffic 2 12)))
while kill -0 $follow 2>/dev/null; do sent=$((sent + $(traffic 2 4))); done
wait $follow || { cat "$SCRATCH/migrate.txt" >&2; fail "moectl migrate"; }
grep -q "committed" "$SCRATCH/migrate.txt" || { cat "$SCRATCH/migrate.txt" >&2; fail "the migration did not commit"; }
echo "ok: $sent rows per layer through 4 front doors, layer 0 expert 0 migrated to rank 3 in between"

# Bad queries: 400 naming the problem.
expect_400() {
  local code
  code=$(curl -s -o "$SCRATCH/400.txt" -w '%{http_code}' "$url/$1")
  [ "$code" = 400 ] && grep -q "$2" "$SCRATCH/400.txt" || fail "/$1: HTTP $code, $(cat "$SCRATCH/400.txt")"
  echo "ok: /$1 -> 400: $(head -1 "$SCRATCH/400.txt")"
}
expect_400 "api/heatmap?layer=3" "out of range: the model has 3 MoE layers"
expect_400 "api/coactivation?layer=one" "not a layer number"
expect_400 "api/heatmap?layer=1&layer=2" "given 2 times"
expect_400 "api/health?layer=0" "unknown parameter 'layer'"
expect_400 "api/trace" "name a request"
expect_400 "api/trace?request_id=12x" "is not a request id"
# An id that was never traced: 404 naming how to trace one (the JSON of a
# traced one is moectl trace --json's, tested in mpi.trace).
code=$(curl -s -o "$SCRATCH/404.txt" -w '%{http_code}' "$url/api/trace?request_id=18446744073709551615")
[ "$code" = 404 ] && grep -q -- "--follow" "$SCRATCH/404.txt" || fail "/api/trace of an untraced id: HTTP $code, $(cat "$SCRATCH/404.txt")"
echo "ok: /api/trace of an untraced id -> 404: $(head -1 "$SCRATCH/404.txt")"

# The page in headless Chromium: the DOM once its scripts have drawn, and a screenshot.
flags=(--headless --disable-gpu --no-first-run --hide-scrollbars --user-data-dir="$SCRATCH/chromium")
[ "$(id -u)" = 0 ] && flags+=(--no-sandbox)
timeout 60 "$browser" "${flags[@]}" --virtual-time-budget=4000 --dump-dom "$url/?layer=0" \
  >"$SCRATCH/dom.html" 2>"$SCRATCH/chromium.log" || { tail "$SCRATCH/chromium.log" >&2; fail "chromium --dump-dom"; }
mkdir -p "$MOED_BUILD_DIR/artifacts"
shot=$MOED_BUILD_DIR/artifacts/dashboard.png
rm -f "$shot"
timeout 60 "$browser" "${flags[@]}" --virtual-time-budget=4000 --window-size=1400,1250 --screenshot="$shot" \
  "$url/?layer=0" >/dev/null 2>>"$SCRATCH/chromium.log" || { tail "$SCRATCH/chromium.log" >&2; fail "chromium --screenshot"; }
[ -s "$shot" ] || fail "no screenshot"
echo "ok: screenshot $shot"
curl -sf "$url/metrics" >"$SCRATCH/metrics.txt" || fail "/metrics"
"$MOECTL" --dir "$run/admin" --json stats >"$SCRATCH/stats.json" || fail "moectl stats"

$PYTHON - "$SCRATCH/dom.html" "$SCRATCH/metrics.txt" "$SCRATCH/stats.json" "$sent" <<'PY' || fail "the page against /metrics (above)"
import json, math, re, sys
from html.parser import HTMLParser
dom_path, metrics_path, stats_path, sent = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.nodes, self.stack = [], []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        a["tag"], a["parent"] = tag, self.stack[-1] if self.stack else None
        self.nodes.append(a)
        if tag not in ("meta", "rect", "br", "input", "img", "link"):
            self.stack.append(a)
    def handle_startendtag(self, tag, attrs):
        a = dict(attrs)
        a["tag"], a["parent"] = tag, self.stack[-1] if self.stack else None
        self.nodes.append(a)
    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()["tag"] != tag:
            pass
dom = Dom()
dom.feed(open(dom_path).read())
nodes = dom.nodes

metrics = {}
for line in open(metrics_path):
    if line.startswith("#") or not line.strip():
        continue
    name, value = line.rsplit(" ", 1)
    metrics[name] = float(value)
def m(name):
    if name not in metrics:
        sys.exit(f"FAIL: /metrics has no {name}")
    return metrics[name]
def same(what, shown, scraped):
    shown = float(shown)
    if not math.isclose(shown, scraped, rel_tol=1e-9, abs_tol=1e-12):
        sys.exit(f"FAIL: {what}: the page shows {shown}, /metrics {scraped}")

body = next(n for n in nodes if n["tag"] == "body")
if body.get("data-rendered") != "1":
    sys.exit(f"FAIL: the page did not finish drawing (data-rendered {body.get('data-rendered')})")
if int(body["data-measured-steps"]) != m("moed_steps_total"):
    sys.exit(f"FAIL: the page drew step {body['data-measured-steps']}, /metrics has {m('moed_steps_total')}")

# The heatmap: a row per expert of the model, every column complete.
experts = int(m('moed_expert_load_over_mean_bucket{layer="0",le="+Inf"}'))
cells = [n for n in nodes if n.get("class") == "cell"]
rows = {int(c["data-expert"]) for c in cells}
columns = {int(c["data-column"]) for c in cells}
if rows != set(range(experts)) or len(cells) != experts * len(columns) or not columns:
    sys.exit(f"FAIL: heatmap: {len(cells)} cells over experts {sorted(rows)} and {len(columns)} columns; the model has {experts} experts")
total = sum(int(c["data-load"]) for c in cells)
top_k = 2
if total != m("moed_tokens_total") * top_k or total != sent * top_k:
    sys.exit(f"FAIL: heatmap cells add up to {total}; /metrics counts {m('moed_tokens_total')} tokens x top-{top_k}, the test sent {sent} per layer")
print(f"ok: heatmap of layer 0: {experts} experts x {len(columns)} columns; its cells add up to {total} = "
      f"moed_tokens_total x top-2")
# Hot experts moved between the two traffic phases.
def hottest(cols):
    load = [0] * experts
    for c in cells:
        if int(c["data-column"]) in cols:
            load[int(c["data-expert"])] += int(c["data-load"])
    return max(range(experts), key=lambda e: load[e])
ordered = sorted(columns)
half = len(ordered) // 2
first, last = hottest(set(ordered[:half])), hottest(set(ordered[half:]))
if first == last:
    sys.exit(f"FAIL: the heatmap does not move: expert {first} is the hottest before and after the traffic changed")
print(f"ok: the hottest expert was {first} in the first half of the columns, {last} in the second")

figures = next(n for n in nodes if n.get("id") == "heatmap-figures")
same("layer 0 activation rate", figures["data-activation-rate"], m('moed_layer_activation_rate{layer="0"}'))
same("layer 0 load std/mean", figures["data-load-std-over-mean"], m('moed_layer_expert_load_std_over_mean{layer="0"}'))
same("layer 0 load max/mean", figures["data-load-max-over-mean"], m('moed_layer_expert_load_max_over_mean{layer="0"}'))
same("layer 0 hottest expert", figures["data-hot-expert"], m('moed_hot_expert{layer="0",position="1"}'))
print(f"ok: layer 0's figures as /metrics: std/mean {figures['data-load-std-over-mean']}, hottest expert {figures['data-hot-expert']}")

# The health view: the job's and each rank's golden signals.
signal_cells = [n for n in nodes if n.get("data-signal")]
def shown(rank, signal):
    for c in signal_cells:
        if c["parent"].get("data-rank") == rank and c["data-signal"] == signal:
            return c
    sys.exit(f"FAIL: the health view has no {signal} for rank {rank}")
p99 = max(m('moed_recent_alltoall_wait_ms{phase="dispatch",quantile="0.99"}'),
          m('moed_recent_alltoall_wait_ms{phase="combine",quantile="0.99"}'))
same("job activation rate", shown("job", "activation_rate")["data-value"], m("moed_activation_rate"))
same("job load std/mean", shown("job", "load_std_over_mean")["data-value"], m("moed_expert_load_std_over_mean"))
same("job all-to-all p99", shown("job", "alltoall_p99_ms")["data-value"], p99)
for r in range(4):
    same(f"rank {r} activation rate", shown(str(r), "activation_rate")["data-value"], m(f'moed_rank_activation_rate{{rank="{r}"}}'))
    same(f"rank {r} load std/mean", shown(str(r), "load_std_over_mean")["data-value"],
         m(f'moed_rank_expert_load_std_over_mean{{rank="{r}"}}'))
    same(f"rank {r} all-to-all p99", shown(str(r), "alltoall_p99_ms")["data-value"],
         m(f'moed_rank_recent_alltoall_wait_p99_ms{{rank="{r}"}}'))
spread = shown("job", "load_std_over_mean")
limit = m('moed_alert_threshold{alert="load_spread"}')
want = "out" if float(spread["data-value"]) > limit else "near" if float(spread["data-value"]) > 0.8 * limit else "ok"
if spread["data-band"] != want:
    sys.exit(f"FAIL: load std/mean {spread['data-value']} against {limit} coloured {spread['data-band']}, not {want}")
islands = sorted({(n["data-rank"], n["data-island"]) for n in nodes if n["tag"] == "tr" and n.get("data-island")})
if islands != [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")]:
    sys.exit(f"FAIL: ranks and islands {islands}")
print(f"ok: health view = /metrics for the job and 4 ranks in 2 islands; load std/mean {float(spread['data-value']):.3f} "
      f"coloured '{spread['data-band']}' against {limit}")

# The migration: state and progress as /metrics; the expert on its new rank.
mig = next((n for n in nodes if n.get("id") == "migration-progress"), None)
if mig is None or mig["data-state"] != "committed" or m('moed_migration_state{state="committed"}') != 1:
    sys.exit(f"FAIL: migration shown as {mig and mig.get('data-state')}")
same("migration progress", mig["data-progress"], m("moed_migration_progress"))
held = {(n["parent"]["data-expert"], n["data-rank"]) for n in nodes
        if n["tag"] == "td" and n.get("data-held") == "1" and n["parent"].get("data-expert") is not None}
if ("0", "3") not in held or ("0", "0") in held:
    sys.exit(f"FAIL: placement of layer 0 expert 0: ranks {sorted(r for e, r in held if e == '0')}, expected rank 3 only")
if len({e for e, r in held}) != experts:
    sys.exit("FAIL: the placement table lacks experts")
print(f"ok: migration committed, progress {mig['data-progress']} as /metrics; layer 0 expert 0 now on rank 3")

# Co-activation: E x E cells; the strongest pair is the one moectl stats names.
pairs = [n for n in nodes if n.get("class") == "pair"]
if len(pairs) != experts * experts:
    sys.exit(f"FAIL: co-activation has {len(pairs)} cells, want {experts}x{experts}")
value = {(int(p["data-a"]), int(p["data-b"])): float(p["data-value"]) for p in pairs}
if any(value[(a, b)] != value[(b, a)] for a, b in value):
    sys.exit("FAIL: the co-activation matrix is not symmetric")
top = max(value, key=lambda k: (value[k], -k[0], -k[1]))
stats = json.loads(open(stats_path).readline())
want = tuple(stats["per_layer"][0]["top_pair"])
if top != want:
    sys.exit(f"FAIL: the page's strongest co-activation is {top}, moectl stats names {want}")
print(f"ok: co-activation {experts}x{experts}, symmetric; strongest pair {top} as moectl stats")
trace = next(n for n in nodes if n.get("id") == "trace")
if "?trace=" not in open(dom_path).read().split('id="trace-body"', 1)[1][:400]:
    sys.exit("FAIL: the trace panel without ?trace= does not say how to pick a request")
print("ok: the trace panel is there and says how to pick a request (?trace=ID)")
PY
"$MOECTL" --dir "$run/admin" shutdown >/dev/null
wait $daemon || { cat "$run/log" >&2; fail "moed exited with code $?"; }
daemon=""
echo "ok: moed stopped cleanly"
