#!/usr/bin/env bash
# Regenerates the test topologies of this folder (see ../README.md, "topology/").
# Needs only hwloc's tools (Debian package hwloc) and bash:
#   1. lstopo exports a synthetic topology (2 packages, one NUMA node each,
#      4 cores of 2 PUs each) as XML;
#   2. this script splices in the PCI/OS-device subtrees (host bridge, PCI
#      bridge, NVIDIA GPU with its NVML and CUDA OS devices, NICs, a BMC VGA,
#      NVSwitches) below each package, in hwloc 2.x's XML form;
#   3. hwloc-annotate sets the root's HostName and adds the NVLinkBandwidth
#      distances matrix, so hwloc itself writes the distances2 element and its
#      exact length attributes.
# Bandwidths are in MB/s as hwloc's NVML backend reports them: 25000 per
# NVLink 2-4 link, summed over the links between two devices, and 1000000 on
# the diagonal.
#
# Usage: tests/data/topology/make-topologies.sh   (writes into its own folder)
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gp=1000  # gp_index of spliced objects, far above the synthetic ones
next_gp() { gp=$((gp + 1)); }

# gpu BUS INDEX MODEL PCIID WITH_CUDA: host bridge -> PCI bridge on bus BUS-1 -> GPU at BUS:00.0.
gpu() {
  local bus=$1 i=$2 model=$3 pciid=$4 with_cuda=$5
  local up; up=$(printf '%02x' $((16#$bus - 1)))
  printf '      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" bridge_pci="0000:[%s-%s]">\n' $gp "$up" "$bus"; next_gp
  printf '        <object type="Bridge" gp_index="%d" bridge_type="1-1" depth="1" bridge_pci="0000:[%s-%s]" pci_busid="0000:%s:00.0" pci_type="0604 [1000:c030] [1000:100b] b0" pci_link_speed="31.507692">\n' $gp "$bus" "$bus" "$up"; next_gp
  printf '          <object type="PCIDev" gp_index="%d" pci_busid="0000:%s:00.0" pci_type="0302 [10de:%s] [10de:16c1] a1" pci_link_speed="31.507692">\n' $gp "$bus" "$pciid"; next_gp
  printf '            <info name="PCIVendor" value="NVIDIA Corporation"/>\n'
  printf '            <object type="OSDev" gp_index="%d" name="nvml%d" subtype="NVML" osdev_type="1">\n' $gp "$i"; next_gp
  printf '              <info name="Backend" value="NVML"/>\n'
  printf '              <info name="GPUVendor" value="NVIDIA Corporation"/>\n'
  printf '              <info name="GPUModel" value="%s"/>\n' "$model"
  printf '            </object>\n'
  if [ "$with_cuda" = 1 ]; then
    printf '            <object type="OSDev" gp_index="%d" name="cuda%d" subtype="CUDA" osdev_type="5">\n' $gp "$i"; next_gp
    printf '              <info name="Backend" value="CUDA"/>\n'
    printf '              <info name="GPUVendor" value="NVIDIA Corporation"/>\n'
    printf '              <info name="GPUModel" value="%s"/>\n' "$model"
    printf '            </object>\n'
  fi
  printf '          </object>\n        </object>\n      </object>\n'
}

# nic BUS NAME: a Mellanox ConnectX NIC and its OpenFabrics OS device.
nic() {
  printf '      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" bridge_pci="0000:[%s-%s]">\n' $gp "$1" "$1"; next_gp
  printf '        <object type="PCIDev" gp_index="%d" pci_busid="0000:%s:00.0" pci_type="0207 [15b3:1021] [15b3:0041] 00" pci_link_speed="31.507692">\n' $gp "$1"; next_gp
  printf '          <object type="OSDev" gp_index="%d" name="%s" osdev_type="3"/>\n' $gp "$2"; next_gp
  printf '        </object>\n      </object>\n'
}

# bmc_vga BUS: the ASPEED VGA of a server's BMC, a DRM GPU OS device "card0"
# that is not an NVIDIA GPU and must not count as one.
bmc_vga() {
  printf '      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" bridge_pci="0000:[%s-%s]">\n' $gp "$1" "$1"; next_gp
  printf '        <object type="PCIDev" gp_index="%d" pci_busid="0000:%s:00.0" pci_type="0300 [1a03:2000] [1a03:2000] 52" pci_link_speed="0.000000">\n' $gp "$1"; next_gp
  printf '          <object type="OSDev" gp_index="%d" name="card0" osdev_type="1"/>\n' $gp; next_gp
  printf '        </object>\n      </object>\n'
}

# nvswitch BUS: an NVSwitch as hwloc's NVML backend records it (a PCI device
# of class 0680 with subtype NVSwitch, which keeps it under the io filter).
nvswitch() {
  printf '      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" bridge_pci="0000:[%s-%s]">\n' $gp "$1" "$1"; next_gp
  printf '        <object type="PCIDev" gp_index="%d" pci_busid="0000:%s:00.0" subtype="NVSwitch" pci_type="0680 [10de:22a3] [10de:1796] a1" pci_link_speed="0.000000"/>\n' $gp "$1"; next_gp
  printf '      </object>\n'
}

# splice OUT FRAGMENT0 FRAGMENT1: the synthetic CPU part with fragment N
# inserted at the end of package N (the packages' closing tags are the only
# lines that are exactly four spaces and </object>).
splice() {
  local out=$1 f0=$2 f1=$3
  rm -f "$work/cpu.xml"
  lstopo-no-graphics --if synthetic --input "pack:2 [numa] core:4 pu:2" --of xml "$work/cpu.xml"
  awk -v f0="$f0" -v f1="$f1" '
    $0 == "    </object>" { file = (n++ == 0) ? f0 : f1; while ((getline line < file) > 0) print line }
    { print }' "$work/cpu.xml" >"$out"
  [ "$(grep -c '^    </object>$' "$work/cpu.xml")" = 2 ] || { echo "unexpected synthetic export" >&2; exit 1; }
}

# matrix NAME N OBJECTS... VALUES...: a distances file for hwloc-annotate.
matrix() {
  local file=$1 n=$2
  shift 2
  { echo "name=NVLinkBandwidth"; echo 9; echo "$n"; printf '%s\n' "$@"; } >"$file"
}

finish() {  # finish SPLICED HOSTNAME [DISTANCES] OUT
  local in=$1 host=$2 dist=${3:-} out=${4:-}
  hwloc-annotate "$in" "$work/named.xml" root info HostName "$host"
  if [ -n "$dist" ]; then
    hwloc-annotate "$work/named.xml" "$out" root distances "$dist"
  else
    cp "$work/named.xml" "$out"
  fi
}

# --- 2 hosts x 4 GPUs, NVLink pairs {0,1} and {2,3} -----------------------------
# H100 NVL pairs: 12 NVLink-4 links between the two GPUs of a pair, none across.
pairs_values() {
  local i j
  for i in 0 1 2 3; do
    for j in 0 1 2 3; do
      if [ $i = $j ]; then echo 1000000
      elif [ $((i / 2)) = $((j / 2)) ]; then echo 300000
      else echo 0; fi
    done
  done
}
for h in 1 2; do
  gp=1000
  { gpu 1a 0 "NVIDIA H100 NVL" 2321 $((h == 1)); gpu 3c 1 "NVIDIA H100 NVL" 2321 $((h == 1)); nic 4d mlx5_0; } >"$work/p0"
  { gpu 9c 2 "NVIDIA H100 NVL" 2321 $((h == 1)); gpu bd 3 "NVIDIA H100 NVL" 2321 $((h == 1));
    [ $h = 2 ] && bmc_vga e3; true; } >"$work/p1"
  splice "$work/h.xml" "$work/p0" "$work/p1"
  matrix "$work/pairs.txt" 4 os=nvml0 os=nvml1 os=nvml2 os=nvml3 $(pairs_values)
  finish "$work/h.xml" "host$h" "$work/pairs.txt" "2x4-nvlink-pairs-host$h.xml"
done

# --- NVSwitch host: 8 GPUs, 4 NVSwitches, every GPU linked to every switch -------
# As on an HGX H100 board: 18 links per GPU, 5+4+4+5 to the four switches; no
# direct GPU-GPU link, so all GPU-GPU entries are 0 and the paths go through
# the switches.
gp=1000
{ gpu 18 0 "NVIDIA H100 80GB HBM3" 2330 0; gpu 2a 1 "NVIDIA H100 80GB HBM3" 2330 0
  gpu 3a 2 "NVIDIA H100 80GB HBM3" 2330 0; gpu 5d 3 "NVIDIA H100 80GB HBM3" 2330 0
  nvswitch 05; nvswitch 06; } >"$work/p0"
{ gpu 9a 4 "NVIDIA H100 80GB HBM3" 2330 0; gpu ab 5 "NVIDIA H100 80GB HBM3" 2330 0
  gpu ba 6 "NVIDIA H100 80GB HBM3" 2330 0; gpu db 7 "NVIDIA H100 80GB HBM3" 2330 0
  nvswitch 07; nvswitch 08; } >"$work/p1"
splice "$work/h.xml" "$work/p0" "$work/p1"
switch_links=(5 4 4 5)
nvswitch_values() {
  local i j
  for i in $(seq 0 11); do
    for j in $(seq 0 11); do
      if [ $i = $j ]; then echo 1000000
      elif [ $i -lt 8 ] && [ $j -ge 8 ]; then echo $((switch_links[j - 8] * 25000))
      elif [ $i -ge 8 ] && [ $j -lt 8 ]; then echo $((switch_links[i - 8] * 25000))
      else echo 0; fi
    done
  done
}
# The switches by logical PCI index (pci=BUSID also matches their bridges):
# 0000:05, 0000:06 follow package 0's four GPUs, 0000:07, 0000:08 package 1's.
matrix "$work/nvswitch.txt" 12 os=nvml{0..7} pci:4 pci:5 pci:10 pci:11 $(nvswitch_values)
finish "$work/h.xml" dgx1 "$work/nvswitch.txt" nvswitch-8gpu.xml

# --- PCIe-only host: 4 GPUs, no NVLink matrix ------------------------------------
gp=1000
{ gpu 1b 0 "NVIDIA L40S" 26b9 0; gpu 3d 1 "NVIDIA L40S" 26b9 0; } >"$work/p0"
{ gpu 9d 2 "NVIDIA L40S" 26b9 0; gpu be 3 "NVIDIA L40S" 26b9 0; } >"$work/p1"
splice "$work/h.xml" "$work/p0" "$work/p1"
finish "$work/h.xml" pcie1 "" no-nvlink-4gpu.xml

# Every file must load with the io filter and keep its GPUs and matrix.
for f in 2x4-nvlink-pairs-host1.xml 2x4-nvlink-pairs-host2.xml nvswitch-8gpu.xml no-nvlink-4gpu.xml; do
  lstopo-no-graphics --if xml --input "$f" --filter io:important >"$work/tree.txt"
  lstopo-no-graphics --if xml --input "$f" --filter io:important --distances >"$work/dist.txt"
  echo "$f: host $(sed -n 's/.*name="HostName" value="\([^"]*\)".*/\1/p' "$f")," \
    "$(grep -c '"nvml[0-9]*"' "$work/tree.txt" || true) NVML GPUs," \
    "$(grep -c 'NVLinkBandwidth' "$work/dist.txt" || true) NVLinkBandwidth matrix"
  sed -n '/NVLinkBandwidth/,$p' "$work/dist.txt" | sed -n 2p
done
