#!/usr/bin/env bash
# Every bad input is refused with exit code 2 and a message naming what is
# wrong; under mpirun every rank agrees at start-up and nothing hangs.
# Usage: test_bad_inputs.sh config|weights|trace|placement|cli
source "$(dirname "$0")/lib.sh"
group=${1:?group}
base=(--config "$SMALL")

case "$group" in
config)
  bad() {  # bad PATTERN WHAT -- TOML-TEXT
    local pattern=$1 what=$2
    printf '%s\n' "$4" >"$SCRATCH/bad.toml"
    expect_failure 2 "$pattern" "config: $what" -- "$MOED" --config "$SCRATCH/bad.toml" --print-config
  }
  bad 'unknown section \[modle\].*did you mean .model.' "unknown section" -- $'[modle]\nlayers = 2'
  bad 'unknown key \[model\]\.layer .*did you mean .layers.' "unknown key" -- $'[model]\nlayer = 2'
  bad '\[model\]\.layers must be an integer, got string "four" \(at .*bad.toml:2\)' "wrong type" -- $'[model]\nlayers = "four"'
  bad '\[router\]\.temperature must be a number' "string for a number" -- $'[router]\ntemperature = "hot"'
  bad '\[log\]\.per_step must be true or false' "integer for a boolean" -- $'[log]\nper_step = 1'
  bad '\[model\]\.dtype must be a string' "integer for a string" -- $'[model]\ndtype = 16'
  bad '\[model\]\.top_k = 0 is out of range: allowed integer from 1 to 64' "below range" -- $'[model]\ntop_k = 0'
  bad '\[router\]\.top_p = 1.5 is out of range' "above range" -- $'[router]\ntop_p = 1.5'
  bad '\[model\]\.dtype = "fp8" is not allowed: one of "f32", "bf16"' "bad choice" -- $'[model]\ndtype = "fp8"'
  bad '\[comm\]\.backend = "carrier-pigeon" is not allowed' "unknown backend" -- $'[comm]\nbackend = "carrier-pigeon"'
  bad '\[model\]\.top_k = 9 exceeds \[model\]\.experts = 8' "top_k above experts" -- $'[model]\ntop_k = 9'
  bad '\[workload\]\.kind = "trace" needs \[workload\]\.trace' "trace without file" -- $'[workload]\nkind = "trace"'
  bad '\[workload\]\.hot_ratio = 5 is unreachable' "unreachable hot ratio" -- $'[workload]\nhot_ratio = 5.0'
  bad "'layers' in .* is not a section" "key outside a section" -- 'layers = 4'
  bad 'bad.toml:2:' "TOML syntax error" -- $'[model]\nlayers = = 3'
  expect_failure 2 'cannot open .*/missing.toml' "missing config file" -- "$MOED" --config "$SCRATCH/missing.toml"
  expect_failure 2 "config: $SCRATCH is a directory, not a config file" "a directory as config" -- "$MOED" --config "$SCRATCH"
  expect_failure 2 '--set expects section.key=value' "malformed --set" -- "$MOED" --set layers=3 --print-config
  expect_failure 2 'unknown key \[model\]\.depth' "unknown key by --set" -- "$MOED" --set model.depth=3 --print-config
  expect_failure 2 '\[log\]\.level = "loud" is not allowed' "bad --log-level" -- "$MOED" --log-level loud --print-config
  expect_failure 2 'MOED_FAULT' "bad fault injection syntax" -- env MOED_FAULT=sometimes "$MOED" "${base[@]}"
  : >"$SCRATCH/not-a-dir"
  expect_failure 2 '\[admin\]\.dir: cannot create the admin socket dir .*/not-a-dir/run' "admin dir under a file" -- \
    moed_on 2 "${base[@]}" --set "admin.dir=\"$SCRATCH/not-a-dir/run\""
  expect_failure 2 'admin socket dir .*/not-a-dir is not a directory' "admin dir that is a file" -- \
    moed_on 2 "${base[@]}" --set "admin.dir=\"$SCRATCH/not-a-dir\""
  expect_failure 2 'budget|memory_mb' "a negative migration memory budget" -- \
    "$MOED" --set migration.memory_mb=-1 --print-config
  # Experts on a GPU where none is usable (or this build cannot run them there): refused naming the cause.
  expect_failure 2 '\[experts\]\.device = "cuda" cannot run here: (this build|no usable GPU)' "experts on a missing GPU" -- \
    moed_on 2 "${base[@]}" --set 'experts.device="cuda"'
  expect_failure 2 '\[comm\]\.backend = "nccl" cannot run here: ' "the NCCL transport without GPU rows" -- \
    moed_on 2 "${base[@]}" --set 'comm.backend="nccl"'
  # Sizes the config allows but no host holds: refused before allocating, naming the keys.
  huge=(--set model.hidden=1048576 --set model.ffn=4194304)
  expect_failure 2 'memory: rank [01] needs about [0-9]+ bytes .*more than the [0-9]+ bytes .* available .*\[model\]\.hidden 1048576 x \[model\]\.ffn 4194304' \
    "a model larger than memory" -- moed_on 2 "${base[@]}" "${huge[@]}"
  expect_failure 2 'memory: --generate-weights needs about [0-9]+ bytes .*\[model\]\.hidden 1048576 x \[model\]\.ffn 4194304' \
    "generating a model larger than memory" -- "$MOED" "${base[@]}" "${huge[@]}" --generate-weights "$SCRATCH/huge.safetensors"
  ;;
weights)
  "$MOED" "${base[@]}" --generate-weights "$SCRATCH/good.safetensors" >/dev/null
  size=$(stat -c %s "$SCRATCH/good.safetensors")
  head -c $((size / 2)) "$SCRATCH/good.safetensors" >"$SCRATCH/truncated.safetensors"
  printf '\x10\x00\x00\x00\x00\x00\x00\x00{"not json!!    ' >"$SCRATCH/badheader.safetensors"  # 16 bytes
  "$MOED" "${base[@]}" --set model.layers=2 --generate-weights "$SCRATCH/two-layers.safetensors" >/dev/null
  "$MOED" "${base[@]}" --set model.hidden=32 --generate-weights "$SCRATCH/h32.safetensors" >/dev/null
  # Each refused on 2 ranks: exit 2, the file named, no hang.
  expect_failure 2 'truncated.safetensors' "truncated weights file" -- \
    moed_on 2 "${base[@]}" --weights "$SCRATCH/truncated.safetensors"
  expect_failure 2 'badheader.safetensors.*(JSON|json)' "bad header" -- \
    moed_on 2 "${base[@]}" --weights "$SCRATCH/badheader.safetensors"
  expect_failure 2 "two-layers.safetensors.*model\.layers\.2\." "missing tensor" -- \
    moed_on 2 "${base[@]}" --weights "$SCRATCH/two-layers.safetensors"
  expect_failure 2 "h32.safetensors.*model\.layers\.0\..*shape" "wrong shape" -- \
    moed_on 2 "${base[@]}" --weights "$SCRATCH/h32.safetensors"
  expect_failure 2 "good.safetensors.*(F32|BF16).*(BF16|bf16)" "wrong dtype" -- \
    moed_on 2 "${base[@]}" --set model.dtype=bf16 --weights "$SCRATCH/good.safetensors"
  expect_failure 2 "nowhere.safetensors" "missing weights file" -- \
    moed_on 2 "${base[@]}" --weights "$SCRATCH/nowhere.safetensors"
  # A tensor that only rank 1 reads: rank 0 starts fine, yet nobody serves.
  "$MOED" "${base[@]}" --generate-weights "$SCRATCH/e7.safetensors" >/dev/null
  python3 - "$SCRATCH/e7.safetensors" <<'PY' 2>/dev/null || sed -i 's/experts\.7\.w2/experts.7.wX/' "$SCRATCH/e7.safetensors"
import sys
p = sys.argv[1]
data = bytearray(open(p, 'rb').read())
i = data.find(b'experts.7.w2')
data[i:i + 12] = b'experts.7.wX'
open(p, 'wb').write(data)
PY
  expect_failure 2 "\[rank 1\].*e7.safetensors.*experts\.7\.w2" "tensor missing on one rank only" -- \
    moed_on 2 "${base[@]}" --weights "$SCRATCH/e7.safetensors"
  # A tensor named twice in the header (JSON would keep the last entry).
  cp "$SCRATCH/good.safetensors" "$SCRATCH/dup.safetensors"
  python3 - "$SCRATCH/dup.safetensors" <<'PY'
import sys
p = sys.argv[1]
data = bytearray(open(p, 'rb').read())
i = data.find(b'layers.0.block_sparse_moe.experts.7.w2')
data[i:i + 38] = b'layers.0.block_sparse_moe.experts.6.w2'
open(p, 'wb').write(data)
PY
  expect_failure 2 "dup.safetensors: tensor 'model\.layers\.0\.block_sparse_moe\.experts\.6\.w2\.weight' appears twice" \
    "duplicate tensor name" -- moed_on 2 "${base[@]}" --weights "$SCRATCH/dup.safetensors"
  # Weights holding NaN or inf ([model].check_finite, on by default).
  spoil() {  # spoil IN OUT TENSOR ELEMENT VALUE: OUT is IN with one F32 element replaced
    python3 - "$@" <<'PY'
import json, struct, sys
src, dst, name, element, value = sys.argv[1:]
data = bytearray(open(src, 'rb').read())
n = struct.unpack('<Q', data[:8])[0]
begin = json.loads(data[8:8 + n])[name]['data_offsets'][0]
at = 8 + n + begin + 4 * int(element)
data[at:at + 4] = struct.pack('<f', float(value))
open(dst, 'wb').write(data)
PY
  }
  gate=model.layers.1.block_sparse_moe.gate.weight
  w2=model.layers.2.block_sparse_moe.experts.5.w2.weight
  spoil "$SCRATCH/good.safetensors" "$SCRATCH/nan-gate.safetensors" "$gate" 70 nan
  spoil "$SCRATCH/good.safetensors" "$SCRATCH/inf-expert.safetensors" "$w2" 100 inf
  expect_failure 2 "nan-gate.safetensors: tensor '${gate//./\\.}' holds nan at element 70 \(index \[1, 6\]" \
    "NaN in a gate" -- moed_on 2 "${base[@]}" --weights "$SCRATCH/nan-gate.safetensors"
  expect_failure 2 "inf-expert.safetensors: tensor '${w2//./\\.}' holds inf at element 100 \(index \[1, 4\]" \
    "inf in an expert" -- moed_on 2 "${base[@]}" --weights "$SCRATCH/inf-expert.safetensors"
  ;;
trace)
  tr=(--set workload.kind=trace)
  printf 'moed-trace v1\nlayers 3\nexperts 8\ntop_k 2\ntokens 1\n0:0.5 9:0.5 | 1:1 | 2:1\n' >"$SCRATCH/range.trace"
  printf 'moed-trace v1\nlayers 2\nexperts 8\ntop_k 2\ntokens 1\n0:0.5 1:0.5 | 1:1\n' >"$SCRATCH/short.trace"
  printf 'moed-trace v2\n' >"$SCRATCH/version.trace"
  printf '{"layer": 0, "experts": [1, 2], "gating_probs": [0.5]}\n' >"$SCRATCH/bad.jsonl"
  expect_failure 2 'range.trace:6: .*expert 9' "expert out of range" -- \
    moed_on 2 "${base[@]}" "${tr[@]}" --set "workload.trace=$SCRATCH/range.trace"
  expect_failure 2 'short.trace: the trace has 2 layers' "trace shorter than the model" -- \
    moed_on 2 "${base[@]}" "${tr[@]}" --set "workload.trace=$SCRATCH/short.trace"
  expect_failure 2 'version.trace:1' "unknown trace version" -- \
    moed_on 0 "${base[@]}" "${tr[@]}" --set "workload.trace=$SCRATCH/version.trace"
  expect_failure 2 'bad.jsonl:1' "bad JSONL trace" -- \
    moed_on 0 "${base[@]}" "${tr[@]}" --set "workload.trace=$SCRATCH/bad.jsonl"
  expect_failure 2 'absent.trace' "missing trace" -- \
    moed_on 0 "${base[@]}" "${tr[@]}" --set "workload.trace=$SCRATCH/absent.trace"
  ;;
placement)
  "$MOE_PLACE" make --ranks 4 --layers 3 --experts 8 --out "$SCRATCH/four.toml" >/dev/null
  sed 's/^slots = \[\[0\], /slots = [[], /' "$SCRATCH/four.toml" >"$SCRATCH/unplaced.toml"
  sed 's/^slots = \[\[0\], /slots = [[7], /' "$SCRATCH/four.toml" >"$SCRATCH/rank7.toml"
  printf 'format = "moed-placement-v1"\nepoch = \n' >"$SCRATCH/syntax.toml"
  expect_failure 2 'four.toml: placement is for 4 ranks.*this run has 2 ranks' "placement for other ranks" -- \
    moed_on 2 "${base[@]}" --placement "$SCRATCH/four.toml"
  expect_failure 2 'unplaced.toml: layer 0 expert 0 has no slot' "unplaced expert" -- \
    moed_on 4 "${base[@]}" --placement "$SCRATCH/unplaced.toml"
  expect_failure 2 'rank7.toml: layer 0 expert 0 is placed on rank 7' "rank out of range" -- \
    moed_on 4 "${base[@]}" --placement "$SCRATCH/rank7.toml"
  expect_failure 2 'syntax.toml:2' "placement syntax error" -- \
    moed_on 0 "${base[@]}" --placement "$SCRATCH/syntax.toml"
  expect_failure 2 'capacity of 4 per rank' "capacity exceeded" -- \
    moed_on 4 "${base[@]}" --placement "$SCRATCH/four.toml" --set placement.max_slots_per_rank=4
  ;;
cli)
  expect_failure 2 'unknown|not expected|extra' "unknown flag" -- "$MOED" --frobnicate
  expect_failure 2 'Expected|required|argument' "flag without its value" -- "$MOED" --config
  expect_failure 2 'cannot create' "unwritable dump path" -- \
    moed_on 0 "${base[@]}" --dump-output /nonexistent-dir/out.bin
  expect_failure 2 'ranks|required' "moe-place make without ranks" -- "$MOE_PLACE" make --layers 2 --experts 4 --out "$SCRATCH/x.toml"
  ;;
*) fail "unknown group $group" ;;
esac
