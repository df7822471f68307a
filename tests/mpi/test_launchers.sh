#!/usr/bin/env bash
# The launchers without a cluster:
#   - moed-mpirun --dry-run prints the right mpirun command for the 2 nodes x
#     8 GPUs example (from --hosts and from a hostfile), with the transport's
#     settings, and --allow-run-as-root only when root;
#   - every bad input is refused with exit code 2 and a message naming it;
#   - moed-rank finds each rank's GPU and its NUMA node in a fake sysfs (two
#     sockets, four GPUs, an NVSwitch and a NIC), and picks its binder;
#   - moed-mpirun really runs the small job on localhost x 4, bit-identical to
#     a single process.
source "$(dirname "$0")/lib.sh"
LAUNCH=$(cd "$MOED_SOURCE_DIR/launch" && pwd -P)
MPIRUN_L="$LAUNCH/moed-mpirun"
RANK_L="$LAUNCH/moed-rank"
MOED_ABS=$(readlink -f "$MOED")

# expect_output WHAT EXPECTED -- COMMAND...: COMMAND succeeds and prints EXPECTED.
expect_output() {
  local what=$1 expected=$2 out rc=0
  shift 3
  out=$("$@" 2>&1) || rc=$?
  [ "$rc" = 0 ] || { echo "$out" >&2; fail "$what: exit code $rc"; }
  [ "$out" = "$expected" ] || fail "$what: printed
  $out
expected
  $expected"
  echo "ok: $what"
}

# expect_in WHAT TEXT WORDS: TEXT holds WORDS (a fixed string).
expect_in() {
  [[ $2 == *"$3"* ]] || fail "$1: '$3' missing from: $2"
}

# --- moed-mpirun --dry-run: 2 nodes x 8 GPUs ------------------------------------

root_flag=""
[ "$(id -u)" != 0 ] || root_flag="--allow-run-as-root "
cmd_2x8="mpirun ${root_flag}-np 16 --host node1:8,node2:8 --map-by ppr:8:node --bind-to none"
cmd_2x8+=" $LAUNCH/moed-rank --ranks 16 --bind auto -- $MOED_ABS --config $SMALL"

expect_output "dry run, --hosts node1,node2 --gpus-per-host 8" "$cmd_2x8" -- \
  "$MPIRUN_L" --hosts node1,node2 --gpus-per-host 8 --moed "$MOED" --dry-run -- --config "$SMALL"
for piece in "-np 16" "--map-by ppr:8:node" "--host node1:8,node2:8" "--bind-to none" "$LAUNCH/moed-rank --ranks 16"; do
  expect_in "2 x 8 dry run" "$cmd_2x8" "$piece"
done

cat >"$SCRATCH/hosts" <<'EOF'
# the 2 x 8 example
node1 slots=8
node2   # slots default to --gpus-per-host

EOF
expect_output "dry run, --hostfile (slots=8 and none) --gpus-per-host 8 --ranks 16" "$cmd_2x8" -- \
  "$MPIRUN_L" --hostfile "$SCRATCH/hosts" --gpus-per-host 8 --ranks 16 --moed "$MOED" --dry-run -- --config "$SMALL"

# Elastic serving: mpirun keeps the survivors alive, and moed is told to go on.
cmd_elastic="${cmd_2x8/--bind-to none/--bind-to none --enable-recovery -x MOED_EXIT_STATUS_DIR} --set comm.elastic=true"
expect_output "dry run, --elastic" "$cmd_elastic" -- \
  "$MPIRUN_L" --hosts node1,node2 --gpus-per-host 8 --moed "$MOED" --elastic --dry-run -- --config "$SMALL"

# A process joining a running elastic job: one moed here, no mpirun, with
# the job's arguments and what --elastic gives the job's ranks.
expect_output "dry run, --join" "$MOED --config $SMALL --set comm.elastic=true --join node1:7500" -- \
  "$MPIRUN_L" --join node1:7500 --moed "$MOED" --dry-run -- --config "$SMALL"

# The root flag follows the user who runs the launcher.
if [ "$(id -u)" = 0 ]; then
  expect_in "as root" "$cmd_2x8" "mpirun --allow-run-as-root -np 16"
  # The same command as an ordinary user, where that user can read the files.
  if command -v setpriv >/dev/null && id nobody >/dev/null 2>&1 &&
    setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups test -r "$SMALL" -a -x "$MOED_ABS" -a -x "$MPIRUN_L"; then
    expect_output "dry run as user nobody: no --allow-run-as-root" "${cmd_2x8/--allow-run-as-root /}" -- \
      setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
      "$MPIRUN_L" --hosts node1,node2 --gpus-per-host 8 --moed "$MOED" --dry-run -- --config "$SMALL"
  else
    echo "note: the non-root form is not checked (no setpriv, or user nobody cannot read the files)"
  fi
else
  [[ $cmd_2x8 != *allow-run-as-root* ]] || fail "--allow-run-as-root given to a non-root user"
  echo "note: not root, so only the form without --allow-run-as-root is checked"
fi

# Transport settings: Open MPI over UCX, with UCX's transports and devices.
ucx_settings="--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any"
out=$("$MPIRUN_L" --hosts node1,node2 --gpus-per-host 8 --moed "$MOED" --dry-run --transport ucx \
  --ucx-tls rc,sm,self --ucx-net-devices mlx5_0:1,mlx5_1:1 -- --config "$SMALL")
expect_in "--transport ucx" "$out" "--bind-to none $ucx_settings -x UCX_TLS=rc,sm,self -x UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1 $LAUNCH/moed-rank"
echo "ok: --transport ucx --ucx-tls --ucx-net-devices"
out=$(UCX_TLS=tcp,self "$MPIRUN_L" --hosts node1 --gpus-per-host 2 --moed "$MOED" --dry-run --transport ucx)
expect_in "--transport ucx, UCX_TLS from the environment" "$out" "$ucx_settings -x UCX_TLS=tcp,self $LAUNCH/moed-rank"
[[ $out != *UCX_NET_DEVICES* ]] || fail "UCX_NET_DEVICES passed without being given: $out"
out=$(UCX_TLS=tcp,self "$MPIRUN_L" --hosts node1 --gpus-per-host 2 --moed "$MOED" --dry-run)
[[ $out != *pml* && $out != *UCX_TLS* ]] || fail "--transport mpi (the default) passed UCX settings: $out"
echo "ok: UCX_TLS from the environment with ucx; no UCX settings with mpi"

# The other options reach their place in the command.
out=$("$MPIRUN_L" --hosts node1,node2 --gpus-per-host 8 --moed "$MOED" --dry-run --bind numactl \
  --set-cuda-visible-devices --log-dir /var/log/moed --mca btl_tcp_if_include eth0 -x NCCL_DEBUG=INFO \
  -- --config "$SMALL" --set "log.level=debug" --report-json "report with space.json")
expect_in "options" "$out" "--bind-to none --output-filename /var/log/moed --mca btl_tcp_if_include eth0 -x NCCL_DEBUG=INFO $LAUNCH/moed-rank"
expect_in "options" "$out" "moed-rank --ranks 16 --bind numactl --set-cuda-visible-devices -- $MOED_ABS"
expect_in "options" "$out" "--set log.level=debug --report-json 'report with space.json'"
echo "ok: --bind, --set-cuda-visible-devices, --log-dir, --mca, -x, and moed's arguments quoted"

# --- moed-mpirun: bad input, refused before launch ------------------------------------

ok=(--moed "$MOED" --dry-run)
refuse() { # PATTERN WHAT -- ARGS...: moed-mpirun ARGS exits 2 saying PATTERN
  local pattern=$1 what=$2
  shift 3
  expect_failure 2 "$pattern" "moed-mpirun refuses $what" -- "$MPIRUN_L" "$@"
}
refuse "--ranks 12 does not match the hosts: 2 host\(s\) x 8 GPUs per host = 16 ranks" "--ranks != hosts x GPUs" -- \
  --hosts node1,node2 --gpus-per-host 8 --ranks 12 "${ok[@]}"
refuse "--hosts: the host list is empty" "an empty --hosts" -- --hosts "" --gpus-per-host 8 "${ok[@]}"
refuse "an empty host name \(stray comma\?\)" "a stray comma" -- --hosts node1,,node2 --gpus-per-host 8 "${ok[@]}"
refuse "an empty host name" "a trailing comma" -- --hosts node1,node2, --gpus-per-host 8 "${ok[@]}"
refuse "host node1 is listed twice" "a duplicate host" -- --hosts node1,node2,node1 --gpus-per-host 8 "${ok[@]}"
refuse "'node 1' is not a host name" "a bad host name" -- --hosts "node 1" --gpus-per-host 8 "${ok[@]}"
refuse "no hosts: give --hosts" "no hosts" -- --gpus-per-host 8 "${ok[@]}"
refuse "--join starts one moed on this host: --hosts --gpus-per-host" "--join with hosts" -- \
  --join node1:7500 --hosts node1 --gpus-per-host 8 "${ok[@]}"
refuse "--join node1: expected HOST:PORT" "--join without a port" -- --join node1 "${ok[@]}"
refuse "give --hosts or --hostfile, not both" "both host sources" -- \
  --hosts node1 --hostfile "$SCRATCH/hosts" --gpus-per-host 8 "${ok[@]}"
refuse "--gpus-per-host G is required" "no --gpus-per-host" -- --hosts node1 "${ok[@]}"
for g in 0 -1 eight 2.5; do
  refuse "--gpus-per-host must be a positive integer, got '$g'" "--gpus-per-host $g" -- --hosts node1 --gpus-per-host "$g" "${ok[@]}"
done
refuse "--ranks must be a positive integer, got 'x'" "--ranks x" -- --hosts node1 --gpus-per-host 8 --ranks x "${ok[@]}"
printf 'node1 slots=8\nnode2 slots=4\n' >"$SCRATCH/hosts-4"
refuse "hosts-4:2: 'slots=4' for host node2, but --gpus-per-host is 8" "hostfile slots != --gpus-per-host" -- \
  --hostfile "$SCRATCH/hosts-4" --gpus-per-host 8 "${ok[@]}"
printf 'node1 slots=8\nnode1 slots=8\n' >"$SCRATCH/hosts-dup"
refuse "hosts-dup:2: host node1 is listed twice" "a hostfile's duplicate host" -- \
  --hostfile "$SCRATCH/hosts-dup" --gpus-per-host 8 "${ok[@]}"
printf 'node1 cpus=8\n' >"$SCRATCH/hosts-bad"
refuse "hosts-bad:1: 'cpus=8' is not understood" "a hostfile's unknown word" -- \
  --hostfile "$SCRATCH/hosts-bad" --gpus-per-host 8 "${ok[@]}"
printf '# nothing\n\n' >"$SCRATCH/hosts-empty"
refuse "lists no host" "an empty hostfile" -- --hostfile "$SCRATCH/hosts-empty" --gpus-per-host 8 "${ok[@]}"
refuse "--hostfile $SCRATCH/nope does not exist" "a missing hostfile" -- \
  --hostfile "$SCRATCH/nope" --gpus-per-host 8 "${ok[@]}"
refuse "moed binary $SCRATCH/no-moed does not exist" "a missing moed binary" -- \
  --hosts node1 --gpus-per-host 8 --moed "$SCRATCH/no-moed" --dry-run
touch "$SCRATCH/not-exec"
refuse "moed binary $SCRATCH/not-exec is not an executable file" "a non-executable moed" -- \
  --hosts node1 --gpus-per-host 8 --moed "$SCRATCH/not-exec" --dry-run
refuse "no moed binary: give --moed PATH" "no moed anywhere" -- \
  --hosts node1 --gpus-per-host 8 --moed "" --dry-run
refuse "config file $SCRATCH/no.toml \(moed --config\) does not exist" "a missing --config" -- \
  --hosts node1 --gpus-per-host 8 "${ok[@]}" -- --config "$SCRATCH/no.toml"
refuse "config file $SCRATCH/no.toml \(moed --config=$SCRATCH/no.toml\) does not exist" "a missing --config=F" -- \
  --hosts node1 --gpus-per-host 8 "${ok[@]}" -- --config="$SCRATCH/no.toml"
refuse "config file $SCRATCH/no.toml \(moed -c\) does not exist" "a missing -c F" -- \
  --hosts node1 --gpus-per-host 8 "${ok[@]}" -- -c "$SCRATCH/no.toml"
refuse "unknown argument '--frobnicate'" "an unknown flag" -- --hosts node1 --gpus-per-host 8 --frobnicate "${ok[@]}"
refuse "unknown argument '--config'.*moed's own arguments go after --" "moed's flag before --" -- \
  --hosts node1 --gpus-per-host 8 "${ok[@]}" --config "$SMALL"
refuse "--transport must be mpi or ucx, got 'tcp'" "an unknown transport" -- \
  --hosts node1 --gpus-per-host 8 --transport tcp "${ok[@]}"
refuse "--ucx-tls and --ucx-net-devices need --transport ucx" "UCX settings without ucx" -- \
  --hosts node1 --gpus-per-host 8 --ucx-tls tcp "${ok[@]}"
refuse "--bind must be auto, hwloc, numactl or none, got 'socket'" "an unknown binding" -- \
  --hosts node1 --gpus-per-host 8 --bind socket "${ok[@]}"
refuse "--hosts needs a value" "a flag without its value" -- --gpus-per-host 8 "${ok[@]}" --hosts
# Refused before launch means: even without --dry-run, no mpirun runs.
refuse "--ranks 3 does not match" "a mismatch without --dry-run" -- \
  --hosts localhost --gpus-per-host 4 --ranks 3 --moed "$MOED" -- --config "$SMALL"

# --- moed-rank: GPU, NUMA node, binder, rank count -------------------------------

# pci_device SYS ADDRESS VENDOR CLASS NUMA_NODE
pci_device() {
  local d="$1/bus/pci/devices/$2"
  mkdir -p "$d"
  echo "$3" >"$d/vendor"
  echo "$4" >"$d/class"
  echo "$5" >"$d/numa_node"
}
# numa_node SYS NODE CPULIST
numa_node() {
  mkdir -p "$1/devices/system/node/node$2"
  echo "$3" >"$1/devices/system/node/node$2/cpulist"
}

# Two sockets; GPUs 0-1 on node 0, 2-3 on node 1 (one of them a VGA-class
# device); an NVSwitch and a NIC that are not GPUs; a memory-only node 2.
SYS2="$SCRATCH/sys-2x4"
numa_node "$SYS2" 0 0-15
numa_node "$SYS2" 1 16-31
numa_node "$SYS2" 2 ""
pci_device "$SYS2" 0000:05:00.0 0x10de 0x068000 0 # NVSwitch
pci_device "$SYS2" 0000:17:00.0 0x15b3 0x020700 0 # InfiniBand NIC
pci_device "$SYS2" 0000:1b:00.0 0x10de 0x030200 0
pci_device "$SYS2" 0000:3b:00.0 0x10de 0x030200 0
pci_device "$SYS2" 0000:8a:00.0 0x10de 0x030000 1
pci_device "$SYS2" 0000:ba:00.0 0x10de 0x030200 1
# No GPU, and more NUMA nodes than one digit: node 2 must not sort after node 10.
SYS11="$SCRATCH/sys-11"
for n in $(seq 0 10); do numa_node "$SYS11" "$n" "$((4 * n))-$((4 * n + 3))"; done
# A GPU whose firmware does not give its NUMA node.
SYSU="$SCRATCH/sys-unknown"
numa_node "$SYSU" 0 0-7
numa_node "$SYSU" 1 8-15
pci_device "$SYSU" 0000:1b:00.0 0x10de 0x030200 -1

# Stand-ins for the binders, so that every branch is checked whatever this
# machine has installed (--dry-run never runs them).
BIN_BOTH="$SCRATCH/bin-both" BIN_NUMACTL="$SCRATCH/bin-numactl" BIN_NONE="$SCRATCH/bin-none"
mkdir -p "$BIN_BOTH" "$BIN_NUMACTL" "$BIN_NONE"
for b in "$BIN_BOTH/hwloc-bind" "$BIN_BOTH/numactl" "$BIN_NUMACTL/numactl"; do
  printf '#!/bin/sh\nexit 1\n' >"$b"
  chmod +x "$b"
done

# rank_dry SYS BINDIR ENV... -- ARGS...: moed-rank --dry-run for one rank with
# only BINDIR on PATH (moed-rank needs no other program).
rank_dry() {
  local sys=$1 bindir=$2
  shift 2
  local -a envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env -i PATH="$bindir" MOED_SYSFS="$sys" "${envs[@]}" "$BASH" "$RANK_L" --dry-run "$@"
}

# expect_rank WHAT SYS LOCAL_RANK EXPECTED_SUMMARY_PART EXPECTED_COMMAND [ENV...] [-- OPTIONS]
expect_rank() {
  local what=$1 sys=$2 lr=$3 summary=$4 command=$5 out
  shift 5
  local -a envs=() opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ $# -eq 0 ] || { shift; opts=("$@"); }
  out=$(rank_dry "$sys" "$BIN_BOTH" OMPI_COMM_WORLD_LOCAL_RANK="$lr" OMPI_COMM_WORLD_RANK="$lr" \
    OMPI_COMM_WORLD_SIZE=16 "${envs[@]}" -- "${opts[@]}" "$MOED_ABS" --config "$SMALL" 2>&1) ||
    { echo "$out" >&2; fail "moed-rank, $what: failed"; }
  expect_in "moed-rank, $what" "$out" "$summary"
  command="${command:+$command }$MOED_ABS --config $SMALL"
  [ "$(tail -n 1 <<<"$out")" = "$command" ] ||
    fail "moed-rank, $what: command is '$(tail -n 1 <<<"$out")', expected '$command'"
  echo "ok: moed-rank, $what: $(head -n 1 <<<"$out" | sed 's/^moed-rank: //' | cut -c1-110)"
}

expect_rank "local rank 0" "$SYS2" 0 "GPU 0, NUMA node 0 (NUMA node of GPU 0 (0000:1b:00.0))" \
  "hwloc-bind --physical numa:0 --"
expect_rank "local rank 1" "$SYS2" 1 "GPU 1, NUMA node 0 (NUMA node of GPU 1 (0000:3b:00.0))" \
  "hwloc-bind --physical numa:0 --"
expect_rank "local rank 2 (a VGA-class GPU)" "$SYS2" 2 "GPU 2, NUMA node 1 (NUMA node of GPU 2 (0000:8a:00.0))" \
  "hwloc-bind --physical numa:1 --"
expect_rank "local rank 7 of 8 on 4 GPUs" "$SYS2" 7 "GPU 3, NUMA node 1" "hwloc-bind --physical numa:1 --"
expect_rank "Slurm's local id" "$SYS2" 0 "local rank 3: GPU 3, NUMA node 1" "hwloc-bind --physical numa:1 --" \
  OMPI_COMM_WORLD_LOCAL_RANK= SLURM_LOCALID=3
expect_rank "CUDA_VISIBLE_DEVICES=3,2,1,0" "$SYS2" 0 "GPU 3, NUMA node 1 (NUMA node of GPU 3 (0000:ba:00.0))" \
  "hwloc-bind --physical numa:1 --" CUDA_VISIBLE_DEVICES=3,2,1,0
expect_rank "--set-cuda-visible-devices" "$SYS2" 2 "binding: hwloc, CUDA_VISIBLE_DEVICES=2" \
  "hwloc-bind --physical numa:1 --" -- --set-cuda-visible-devices
expect_rank "MOED_SET_CUDA_VISIBLE_DEVICES=1 with Slurm's list" "$SYS2" 1 "GPU 2, NUMA node 1" \
  "hwloc-bind --physical numa:1 --" CUDA_VISIBLE_DEVICES=0,2 MOED_SET_CUDA_VISIBLE_DEVICES=1
expect_rank "--bind numactl" "$SYS2" 3 "binding: numactl" "numactl --cpunodebind=1 --" -- --bind numactl
expect_rank "--bind none" "$SYS2" 3 "binding: none" "" -- --bind none
expect_rank "no GPU: local rank 2 of 11 NUMA nodes" "$SYS11" 2 "GPU none, NUMA node 2 (local rank 2 mod 11 NUMA node(s))" \
  "hwloc-bind --physical numa:2 --"
expect_rank "no GPU: local rank 12 of 11 NUMA nodes" "$SYS11" 12 "NUMA node 1 (local rank 12 mod 11" \
  "hwloc-bind --physical numa:1 --"
expect_rank "a GPU the host lacks; memory-only node skipped" "$SYS2" 2 \
  "GPU 9, NUMA node 0 (local rank 2 mod 2 NUMA node(s) (GPU 9's node unknown))" \
  "hwloc-bind --physical numa:0 --" CUDA_VISIBLE_DEVICES=9
expect_rank "a GPU's unknown NUMA node" "$SYSU" 1 "GPU 0, NUMA node 1 (local rank 1 mod 2 NUMA node(s) (GPU 0's node unknown))" \
  "hwloc-bind --physical numa:1 --" CUDA_VISIBLE_DEVICES=0
expect_rank "no sysfs at all" "$SCRATCH/no-sys" 5 "GPU none, NUMA node 0" "hwloc-bind --physical numa:0 --"

# Binder choice by what is installed: hwloc-bind, else numactl, else none with a warning.
out=$(rank_dry "$SYS2" "$BIN_NUMACTL" OMPI_COMM_WORLD_LOCAL_RANK=2 -- "$MOED_ABS" 2>&1)
[ "$(tail -n 1 <<<"$out")" = "numactl --cpunodebind=1 -- $MOED_ABS" ] || fail "moed-rank without hwloc-bind: $out"
echo "ok: moed-rank without hwloc-bind takes numactl"
out=$(rank_dry "$SYS2" "$BIN_NONE" OMPI_COMM_WORLD_LOCAL_RANK=2 -- "$MOED_ABS" 2>&1)
expect_in "moed-rank without binders" "$out" "warning: neither hwloc-bind (package hwloc) nor numactl found"
[ "$(tail -n 1 <<<"$out")" = "$MOED_ABS" ] || fail "moed-rank without binders: $out"
echo "ok: moed-rank without hwloc-bind or numactl runs unbound, with a warning"

# A real exec: bound where the node exists; unbound with a warning where it
# does not (this machine has no NUMA node 1, the fake sysfs says GPU 2 is there).
if command -v hwloc-bind >/dev/null; then
  out=$(OMPI_COMM_WORLD_LOCAL_RANK=0 "$RANK_L" --bind hwloc --verbose "$MOED_ABS" --version 2>&1) ||
    { echo "$out" >&2; fail "moed-rank --bind hwloc on this machine failed"; }
  expect_in "moed-rank, a real run" "$out" "exec hwloc-bind --physical numa:0 -- $MOED_ABS --version"
  expect_in "moed-rank, a real run" "$out" "moed "
  out=$(MOED_SYSFS="$SYS2" OMPI_COMM_WORLD_LOCAL_RANK=2 "$RANK_L" --bind hwloc "$MOED_ABS" --version 2>&1) ||
    { echo "$out" >&2; fail "moed-rank bound to a node this machine lacks did not run moed"; }
  expect_in "moed-rank, a node it cannot bind to" "$out" "hwloc-bind cannot bind rank 0 to NUMA node 1 here; it runs unbound"
  expect_in "moed-rank, a node it cannot bind to" "$out" "moed "
  echo "ok: moed-rank runs moed bound by hwloc-bind, or unbound with a warning when the node cannot be used"
fi

# Bad input and wrong job sizes: exit 2, before moed runs.
rank_refuses() { # PATTERN WHAT ENV... -- ARGS...
  local pattern=$1 what=$2
  shift 2
  expect_failure 2 "$pattern" "moed-rank refuses $what" -- rank_dry "$SYS2" "$BIN_BOTH" "$@"
}
export -f rank_dry
export BIN_BOTH RANK_L
rank_refuses "the job has 4 ranks \(srun\), fewer than the 8 wanted" "a Slurm job smaller than wanted" \
  SLURM_NTASKS=4 SLURM_PROCID=0 SLURM_LOCALID=0 MOED_RANKS=8 -- "$MOED_ABS"
rank_refuses "the job has 16 ranks \(mpirun\), more than the 8 wanted" "an mpirun job larger than wanted" \
  OMPI_COMM_WORLD_SIZE=16 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0 -- --ranks 8 "$MOED_ABS"
rc=0
out=$(rank_dry "$SYS2" "$BIN_BOTH" SLURM_NTASKS=4 SLURM_PROCID=3 SLURM_LOCALID=3 -- --ranks 8 "$MOED_ABS" 2>&1) || rc=$?
[ "$rc" = 2 ] && [ -z "$out" ] || fail "moed-rank on rank 3 of a job too small: exit $rc, output '$out' (expected 2, silent)"
echo "ok: moed-rank refuses a job too small on every rank, and only rank 0 says why"
rank_refuses "--ranks/MOED_RANKS must be a positive integer, got '0'" "--ranks 0" -- --ranks 0 "$MOED_ABS"
rank_refuses "unknown option '--numa'" "an unknown option" -- --numa 1 "$MOED_ABS"
rank_refuses "--bind/MOED_BIND must be auto, hwloc, numactl or none, got 'core'" "an unknown binder" -- --bind core "$MOED_ABS"
expect_failure 2 "--bind hwloc: hwloc-bind not found \(package hwloc\)" "moed-rank refuses a missing hwloc-bind" -- \
  rank_dry "$SYS2" "$BIN_NONE" -- --bind hwloc "$MOED_ABS"
expect_failure 2 "--bind numactl: numactl not found \(package numactl\)" "moed-rank refuses a missing numactl" -- \
  rank_dry "$SYS2" "$BIN_NONE" -- --bind numactl "$MOED_ABS"
rank_refuses "no program to run" "no program" -- --ranks 4
rank_refuses "moed binary $SCRATCH/no-moed does not exist" "a missing moed" -- "$SCRATCH/no-moed"
rank_refuses "moed binary $SCRATCH/not-exec is not an executable file" "a non-executable moed" -- "$SCRATCH/not-exec"
rank_refuses "moed binary 'moed-nowhere' is not on PATH" "a moed not on PATH" -- moed-nowhere

# --- a real run: moed-mpirun on localhost x 4 --------------------------------------

moed_on 0 --config "$SMALL" --dump-output "$SCRATCH/one.bin" >/dev/null
"$MPIRUN_L" --hosts localhost --gpus-per-host 4 --moed "$MOED" -- --config "$SMALL" --log-level info \
  --dump-output "$SCRATCH/four.bin" >"$SCRATCH/four.log" 2>&1 ||
  { cat "$SCRATCH/four.log" >&2; fail "moed-mpirun --hosts localhost --gpus-per-host 4 failed"; }
grep -q "^moed-mpirun: mpirun .*-np 4 --host localhost:4 --map-by ppr:4:node" "$SCRATCH/four.log" ||
  { cat "$SCRATCH/four.log" >&2; fail "moed-mpirun did not print the command it ran"; }
binding="; cores? [0-9][0-9,-]*.*, (no GPU|GPU [0-9]+ of [0-9]+)"
for r in 0 1 2 3; do
  line=$(grep -m1 "local rank $r of 4, launched by mpirun" "$SCRATCH/four.log") ||
    { cat "$SCRATCH/four.log" >&2; fail "moed-mpirun: no rank logged local rank $r of 4"; }
  # Where the daemon describes its binding: the cores and the GPU.
  if [[ $line == *"launched by mpirun;"* && ! $line =~ launched\ by\ mpirun$binding ]]; then
    fail "moed-mpirun: rank $r's binding is not 'cores LIST ..., GPU' in: $line"
  fi
done
same_bits "$SCRATCH/one.bin" "$SCRATCH/four.bin" "moed-mpirun --hosts localhost --gpus-per-host 4 vs 1 process"
