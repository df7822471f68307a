#!/usr/bin/env bash
# Benchmark: a hot expert ([workload].hot_ratio = 2.75, the synthetic
# workload's default: 2.75x the mean load) in every layer, on 2 ranks of one
# island, served
#   neither     on its rank alone (contiguous placement)
#   replicated  with a replica on the other rank (x2: chunks of its rows alternate)
#   sharded     split into 2 shards, one per rank (x2: each computes F/2 for every row)
#   replicated-512  replicated, with the default [experts].chunk_rows = 512
#               (more than the hot expert's rows a step: its chunks are then
#               sized from the step's counts, one per replica)
# all with [experts].ffn_chunks = 2, plus "neither" with one chunk (today's
# numerics: what canonical chunks cost). Reports step p50/p99, per-rank
# memory (expert weights held, and peak RSS), and bytes sent per step, in the
# same run, with ratios against "neither"; checks that every case with 2
# chunks gives the same output bits. Prints figures, asserts nothing else
# (the machine is shared and noisy).
#
#   tests/bench/sharding.sh [--steps N] [--repeats N] [--keep DIR] [BUILD_DIR]
#
# --steps: measured steps per run (default 30). --repeats: runs per case; the
# table shows the median of their p50s and p99s (default 3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

steps=30 repeats=3 keep="" build=$root/build
while [ $# -gt 0 ]; do
  case "$1" in
  --steps) steps=${2:?--steps needs a value}; shift 2 ;;
  --repeats) repeats=${2:?--repeats needs a value}; shift 2 ;;
  --keep) keep=${2:?--keep needs a directory}; shift 2 ;;
  -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "sharding.sh: unknown option $1" >&2; exit 2 ;;
  *) build=$1; shift ;;
  esac
done
for n in "$steps" "$repeats"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "sharding.sh: --steps and --repeats take positive integers" >&2; exit 2; }
done
moed=$build/apps/moed
place=$build/apps/moe-place
for b in "$moed" "$place"; do
  [ -x "$b" ] || { echo "build first: $b is missing (ci/build.sh)" >&2; exit 2; }
done
[ -x /usr/bin/time ] || { echo "sharding.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }

if [ -n "$keep" ]; then
  mkdir -p "$keep"
  work=$(cd "$keep" && pwd)
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench-sharding.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
[ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1

# 8 experts of H=512, F=2048 (12.6 MB each in fp32) per layer, top-2, 256
# tokens per step: the experts' GEMMs dominate a step. Chunks of 64 rows: the
# hot expert's ~180 rows a step make 3 chunks, which its two replicas share
# (with the default 512, one chunk, all of a step's rows go to one replica,
# alternating by step, and replication cannot balance a step).
cfg=$work/bench.toml
cat >"$cfg" <<EOF
[model]
layers = 4
experts = 8
top_k = 2
hidden = 512
ffn = 2048
[workload]
tokens_per_step = 256
steps = $((steps + 2))
warmup_steps = 2
hot_ratio = 2.75
[experts]
ffn_chunks = 2
chunk_rows = 64
[log]
level = "warn"
per_step = false
EOF

# The hot expert of each layer, from a first run's statistics.
mpirun --bind-to none -np 2 "$moed" --config "$cfg" --set "stats.file=\"$work/stats.bin\"" \
  --set workload.steps=4 >"$work/stats.log" 2>&1
"$place" stats --json "$work/stats.bin" >"$work/stats.json"

# Placements: contiguous (experts 0-3 on rank 0, 4-7 on rank 1), with each
# layer's hot expert replicated onto, or split with, the other rank.
python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
stats = json.load(open(f"{work}/stats.json"))
def write(name, entry):
    lines = ['format = "moed-placement-v1"', "epoch = 0", "ranks = 2", "layers = 4", "experts = 8"]
    for layer in stats["per_layer"]:
        hot = layer["hottest_expert"]
        slots = []
        for e in range(8):
            home = e // 4
            slots.append(entry(home) if e == hot else f"[{home}]")
        lines += ["[[layer]]", "slots = [" + ", ".join(slots) + "]"]
    open(f"{work}/{name}.toml", "w").write("\n".join(lines) + "\n")
write("neither", lambda home: f"[{home}]")
write("replicated", lambda home: f"[{home}, {1 - home}]")
write("sharded", lambda home: f"{{shards = [{home}, {1 - home}]}}")
hot = [(l["hottest_expert"], round(l["hottest_over_mean"], 2)) for l in stats["per_layer"]]
print(f"hot expert per layer (expert, load over mean): {hot}")
EOF

# case NAME PLACEMENT FFN_CHUNKS CHUNK_ROWS
cases=("neither neither 2 64" "replicated replicated 2 64" "sharded sharded 2 64" "neither-1-chunk neither 1 64"
       "replicated-512 replicated 2 512")
for r in $(seq "$repeats"); do
  for c in "${cases[@]}"; do
    read -r name placement chunks rows <<<"$c"
    out=$work/$name-$r
    # Each rank under /usr/bin/time: its peak RSS in KB, to $out.rss.<rank>.
    mpirun --bind-to none -np 2 bash -c 'exec /usr/bin/time -f %M -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' "$out" \
      "$moed" --config "$cfg" --placement "$work/$placement.toml" --set experts.ffn_chunks="$chunks" \
      --set experts.chunk_rows="$rows" \
      --report-json "$out.json" --dump-output "$out.bin" >"$out.log" 2>&1 ||
      { cat "$out.log" >&2; echo "sharding.sh: case $name failed" >&2; exit 1; }
  done
done

python3 - "$work" "$repeats" "$place" <<'EOF'
import filecmp, json, statistics, subprocess, sys
work, repeats = sys.argv[1], int(sys.argv[2])
H, F, L = 512, 2048, 4
expert_mb = 3 * H * F * 4 / 1e6

def expert_memory(placement):
    """Expert weights held per rank (MB), from the placement: a shard is 1/S of an expert."""
    held = [0.0, 0.0]
    text = open(f"{work}/{placement}.toml").read()
    for line in text.splitlines():
        if not line.startswith("slots = "):
            continue
        body = line[len("slots = ["):-1]
        import re
        for m in re.finditer(r"\{shards = \[([0-9, ]+)\]\}|\[([0-9, ]+)\]", body):
            if m.group(1):
                ranks = [int(x) for x in m.group(1).split(",")]
                for r in ranks:
                    held[r] += expert_mb / len(ranks)
            else:
                for r in (int(x) for x in m.group(2).split(",")):
                    held[r] += expert_mb
    return held

rows = []
for name, placement in [("neither", "neither"), ("replicated", "replicated"), ("sharded", "sharded"),
                        ("neither-1-chunk", "neither"), ("replicated-512", "replicated")]:
    reports = [json.load(open(f"{work}/{name}-{r}.json")) for r in range(1, repeats + 1)]
    p50 = statistics.median(r["step_latency_ms"]["p50"] for r in reports)
    p99 = statistics.median(r["step_latency_ms"]["p99"] for r in reports)
    sent = statistics.median(sum(r["bytes_sent"].values()) / r["measured_steps"] for r in reports)
    rss = [max(int(open(f"{work}/{name}-{r}.rss.{k}").read().split()[-1]) for r in range(1, repeats + 1)) / 1e3
           for k in (0, 1)]
    rows.append((name, p50, p99, expert_memory(placement), rss, sent))

base = rows[0]
print(f"\n{'case':<16} {'step p50 ms':>11} {'p99 ms':>8} {'vs neither':>10}  "
      f"{'experts MB r0/r1':>16} {'peak RSS MB r0/r1':>18} {'MB sent/step':>12} {'vs neither':>10}")
for name, p50, p99, held, rss, sent in rows:
    print(f"{name:<16} {p50:>11.1f} {p99:>8.1f} {base[1] / p50:>9.2f}x  "
          f"{held[0]:>7.1f}/{held[1]:<8.1f} {rss[0]:>8.0f}/{rss[1]:<9.0f} {sent / 1e6:>12.2f} {sent / base[5]:>9.2f}x")
print("(vs neither: step speed-up, p50 over p50; bytes, ratio. Medians of", repeats, "runs per case.)")

same = all(filecmp.cmp(f"{work}/neither-1.bin", f"{work}/{n}-{r}.bin", shallow=False)
           for n in ("neither", "replicated", "sharded", "replicated-512") for r in range(1, repeats + 1))
print("outputs of every case with 2 chunks bit-identical:", "yes" if same else "NO")
differs = not filecmp.cmp(f"{work}/neither-1.bin", f"{work}/neither-1-chunk-1.bin", shallow=False)
print("2 chunks change the bits against 1 chunk (the redefinition):", "yes" if differs else "no")
if not same:
    sys.exit(1)
EOF
