#!/usr/bin/env bash
# The placement service end to end: the daemon's statistics merged over ranks
# equal a single rank's; moe-place optimises from the daemon's own stats file
# (also with every expert on both islands, --redundancy 2); a daemon started from the optimised placement (or from a move-limited one)
# serves bit-identical outputs to the contiguous run; bad files are refused.
source "$(dirname "$0")/lib.sh"
base=(--config "$SMALL" --set workload.steps=4)
stats=(--set stats.half_life_steps=0 --set stats.every_steps=2)  # exact counts: merging must be exact

moed_on 0 "${base[@]}" "${stats[@]}" --set "stats.file=$SCRATCH/one.stats" --dump-output "$SCRATCH/contiguous.bin" >/dev/null
moed_on 4 "${base[@]}" "${stats[@]}" --set "stats.file=$SCRATCH/four.stats" >/dev/null
"$MOE_PLACE" stats "$SCRATCH/one.stats" --json --full | grep -v '"file"' >"$SCRATCH/one.json"
"$MOE_PLACE" stats "$SCRATCH/four.stats" --json --full | grep -v '"file"' >"$SCRATCH/four.json"
cmp -s "$SCRATCH/one.json" "$SCRATCH/four.json" || fail "stats of 4 ranks differ from 1 rank's: $(diff "$SCRATCH/one.json" "$SCRATCH/four.json" | head -5)"
grep -q '"coactivation"' "$SCRATCH/one.json" || fail "moe-place stats --full lacks co-activation"
echo "ok: statistics merged over 4 ranks equal a single rank's"

"$MOE_PLACE" optimize --config "$SMALL" --stats "$SCRATCH/four.stats" --ranks 4 --ranks-per-island 2 \
  --out "$SCRATCH/metis.toml" >"$SCRATCH/optimize.txt"
grep -q "cross-island copies per token" "$SCRATCH/optimize.txt" || fail "optimize printed no cost"
moed_on 4 "${base[@]}" --placement "$SCRATCH/metis.toml" --set cluster.ranks_per_island=2 \
  --dump-output "$SCRATCH/metis.bin" >/dev/null
same_bits "$SCRATCH/contiguous.bin" "$SCRATCH/metis.bin" "served from moe-place's METIS placement (4 ranks) vs contiguous"

# --redundancy 2: every expert on both islands, and the daemon serves from it with the same bits.
"$MOE_PLACE" optimize --config "$SMALL" --stats "$SCRATCH/four.stats" --ranks 4 --ranks-per-island 2 \
  --redundancy 2 --out "$SCRATCH/redundant.toml" >/dev/null
python3 - "$SCRATCH/redundant.toml" <<'PY' || fail "--redundancy 2 left an expert on one island"
import re, sys
for line in open(sys.argv[1]):
    if line.startswith("slots = "):
        for ranks in re.findall(r"\[([0-9, ]+)\]", line[len("slots = "):]):
            islands = {int(r) // 2 for r in ranks.split(",")}
            assert islands == {0, 1}, (ranks, line)
PY
moed_on 4 "${base[@]}" --placement "$SCRATCH/redundant.toml" --set cluster.ranks_per_island=2 \
  --dump-output "$SCRATCH/redundant.bin" >/dev/null
same_bits "$SCRATCH/contiguous.bin" "$SCRATCH/redundant.bin" "served with every expert on both islands vs contiguous"

"$MOE_PLACE" make --ranks 4 --layers 3 --experts 8 --out "$SCRATCH/current.toml" >/dev/null
"$MOE_PLACE" optimize --config "$SMALL" --stats "$SCRATCH/four.stats" --ranks-per-island 2 \
  --from "$SCRATCH/current.toml" --max-moves 3 --json --out "$SCRATCH/limited.toml" >"$SCRATCH/limited.json"
# At least one move, so that serving from it is not contiguous compared with itself.
grep -Eq '"moved_slots": [1-3],?$' "$SCRATCH/limited.json" ||
  fail "--max-moves 3 should move 1 to 3 slots: $(grep moved "$SCRATCH/limited.json")"
grep -q '^epoch = 1$' "$SCRATCH/limited.toml" || fail "a placement made --from epoch 0 is not epoch 1"
moves=$("$MOE_PLACE" diff "$SCRATCH/current.toml" "$SCRATCH/limited.toml" --json | grep -c '"layer"' || true)
[ "$moves" -ge 1 ] && [ "$moves" -le 3 ] || fail "diff lists $moves moves after --max-moves 3"
moed_on 4 "${base[@]}" --placement "$SCRATCH/limited.toml" --dump-output "$SCRATCH/limited.bin" >/dev/null
same_bits "$SCRATCH/contiguous.bin" "$SCRATCH/limited.bin" "served from a move-limited placement vs contiguous"

trace="$MOED_SOURCE_DIR/tests/data/mixtral-humaneval.trace"
"$MOE_PLACE" optimize --trace "$trace" --tokens 0:169 --islands 2 --ranks-per-island 2 --out "$SCRATCH/mixtral.toml" >/dev/null
"$MOE_PLACE" evaluate --trace "$trace" --tokens 169: --placement "$SCRATCH/mixtral.toml" --islands 2 --json >"$SCRATCH/eval.json"
for key in cross_island_copies_per_token same_island_copies_per_token max_mean_rank_load max_mean_island_load; do
  grep -q "\"$key\"" "$SCRATCH/eval.json" || fail "evaluate --json lacks $key"
done
# metis chooses its pooled share on the fitted tokens alone, and says how;
# --pooled-share fixes it, and --load-cap moves the choice. The daemon's
# statistics of 1,200 tokens are enough to judge on (4 blocks of 32 tokens
# per expert of a layer: 512 at 8 experts, top-2); the Mixtral trace's 169
# tokens are not.
moed_on 0 --config "$SMALL" --set workload.steps=12 --set "stats.file=$SCRATCH/long.stats" >/dev/null
for cap in 0 1000; do
  "$MOE_PLACE" optimize --config "$SMALL" --stats "$SCRATCH/long.stats" --ranks 4 --ranks-per-island 2 \
    --redundant-slots 2 --load-cap $cap --json --out "$SCRATCH/pooled-$cap.toml" >"$SCRATCH/pooled-$cap.json"
done
python3 - "$SCRATCH/pooled-0.json" "$SCRATCH/pooled-1000.json" <<'PY' || fail "the pooled share's choice"
import json, sys
tight, loose = (json.load(open(p))["pooling"] for p in sys.argv[1:])
for c in (tight, loose):
    assert [t["share"] for t in c["front"]] == [0, 0.25, 0.5, 0.75, 1], c["front"]
    assert c["tokens_judged"] == 1200 and c["layers_judged"] == 3, c
    assert all(t["within_cap"] == (t["max_mean_rank_load"] <= c["balanced_load"] + c["load_cap"]) for t in c["front"])
    inside = [t for t in c["front"] if t["within_cap"]]
    best = min(inside, key=lambda t: (t["cross_island_copies_per_token"], t["max_mean_rank_load"])) if inside else None
    assert c["load_only"] == (best is None or c["balanced_copies"] < best["cross_island_copies_per_token"]), c
    assert best is None or c["share"] == best["share"], (c["share"], best)
copies = lambda c: c["balanced_copies"] if c["load_only"] else next(
    t for t in c["front"] if t["share"] == c["share"])["cross_island_copies_per_token"]
assert copies(loose) < copies(tight), (copies(loose), copies(tight))  # here the cap binds
name = lambda c: "greedy-load's placement" if c["load_only"] else f"pooled share {c['share']}"
print(f"ok: metis chose {name(tight)} under load cap 0, {name(loose)} under 1000")
PY
"$MOE_PLACE" optimize --config "$SMALL" --stats "$SCRATCH/long.stats" --ranks 4 --ranks-per-island 2 \
  --pooled-share 0.25 --json --out "$SCRATCH/fixed.toml" | grep -q '"pooling"' &&
  fail "a fixed --pooled-share still reports a choice"
"$MOE_PLACE" optimize --trace "$trace" --tokens 0:169 --islands 2 --ranks-per-island 2 --out "$SCRATCH/short.toml" |
  grep -q 'pooled share 0.50: too few sampled tokens to choose it (512 are needed' ||
  fail "metis did not say that 169 tokens are too few to choose its pooled share"
expect_failure 2 'pooled-share' "a pooled share above 1" -- \
  "$MOE_PLACE" optimize --trace "$trace" --islands 2 --ranks-per-island 2 --pooled-share 1.5 --out "$SCRATCH/x.toml"
expect_failure 2 'load-cap' "a negative load cap" -- \
  "$MOE_PLACE" optimize --trace "$trace" --islands 2 --ranks-per-island 2 --load-cap -1 --out "$SCRATCH/x.toml"
jsonl="$MOED_SOURCE_DIR/tests/data/mixtral-humaneval-head.jsonl"
"$MOE_PLACE" optimize --trace "$jsonl" --islands 2 --ranks-per-island 2 --out "$SCRATCH/jsonl.toml" >/dev/null
echo "ok: optimize and evaluate on the Mixtral trace, in moed-trace and JSON-lines form"

head -c 100 "$SCRATCH/four.stats" >"$SCRATCH/short.stats"
cp "$SCRATCH/four.stats" "$SCRATCH/flipped.stats"
printf '\xff' | dd of="$SCRATCH/flipped.stats" bs=1 seek=200 conv=notrunc 2>/dev/null
expect_failure 2 'short.stats' "truncated stats file" -- \
  "$MOE_PLACE" optimize --stats "$SCRATCH/short.stats" --ranks 4 --islands 2 --out "$SCRATCH/x.toml"
expect_failure 2 'flipped.stats.*(corrupt|checksum)' "corrupt stats file" -- \
  "$MOE_PLACE" optimize --stats "$SCRATCH/flipped.stats" --ranks 4 --islands 2 --out "$SCRATCH/x.toml"
sed 's/^experts = 8$/experts = 16/' "$SMALL" >"$SCRATCH/sixteen.toml"
expect_failure 2 'four.stats has 3 layers x 8 experts; the config says 3 x 16' "stats of another model" -- \
  "$MOE_PLACE" optimize --config "$SCRATCH/sixteen.toml" --stats "$SCRATCH/four.stats" --ranks 4 --islands 2 \
  --out "$SCRATCH/x.toml"
expect_failure 2 'how do ranks group into islands' "evaluate without islands" -- \
  "$MOE_PLACE" evaluate --trace "$trace" --placement "$SCRATCH/mixtral.toml"
expect_failure 2 'one of --stats FILE or --trace FILE' "optimize without input" -- \
  "$MOE_PLACE" optimize --ranks 4 --islands 2 --out "$SCRATCH/x.toml"
