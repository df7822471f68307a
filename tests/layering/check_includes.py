#!/usr/bin/env python3
"""Every #include of a moed header points down the layers, never up, and
never into another room's internals: a newcomer can read the tree bottom-up,
and a room's interface is the few headers its row names.

LAYERS below is the whole rule. For each folder (a part, or a room of
runtime/): the folders it may include from besides itself, and its
interface, the headers other folders may include (None: every header).
"room:a.h b.h" narrows what one folder may take from a room. Prints each
include that breaks the rule with its file and line; exits 1 if there is one
(CTest layering.includes).
"""
import pathlib
import re
import sys

# folder: (may include from, interface)
LAYERS = {
    "common": ([], None),
    "kernels": (["common"], None),
    "comm": (["common"], None),
    "routing": (["common"], None),
    "launch": (["common"], None),
    "client": ([], None),  # its library stays small: on nothing
    "placement": (["common", "routing"], None),
    # runtime/, room by room, bottom up.
    "runtime/admin": (["common"], ["protocol.h", "admin_client.h", "moectl_format.h"]),
    "runtime/config": (["common", "comm:comm_config.h", "placement"], ["config.h", "memory_estimate.h"]),
    "runtime/router": (["common", "kernels", "runtime/config"],
                       ["router.h", "policies/router_policies.h", "policies/jitter.h", "policies/spread_bound.h"]),
    "runtime/weights": (["common", "kernels", "placement", "runtime/config"],
                        ["model.h", "expert_store.h", "synthetic_model.h", "safetensors.h", "safetensors_format.h"]),
    "runtime/workload": (["common", "kernels", "routing", "runtime/config", "runtime/router"],
                         ["workload.h", "token_order.h"]),
    "runtime/trace": (["common", "runtime/admin", "runtime/router"],
                      ["tracer.h", "trace_selector.h", "trace_records.h", "token_identity.h"]),
    "runtime/ingress": (["common", "client"], ["front_door.h"]),
    # `moed --join`: a joiner's bootstrap outside MPI, and rank 0's listener.
    "runtime/join": (["common", "comm", "client"], ["join_bootstrap.h", "join_listener.h", "join_wire.h"]),
    "runtime/engine": (["common", "comm", "kernels", "placement", "routing", "runtime/config", "runtime/router",
                        "runtime/weights", "runtime/workload", "runtime/trace"],
                       ["engine.h", "step_record.h", "expert_device.h"]),
    # The observe side reads what a step measured, never the engine or the control plane.
    "runtime/observe": (["common", "placement", "routing", "runtime/config", "runtime/router", "runtime/weights",
                         "runtime/trace", "runtime/engine:step_record.h"],
                        ["report.h", "alerts.h", "load_heatmap.h", "prometheus_text.h", "snapshot.h",
                         "http/http_server.h", "http/dashboard_routes.h"]),
    # The control plane talks over the control channel and migrates through a weight mover, never a transport.
    "runtime/control": (["common", "comm:control_channel.h weight_mover.h", "placement", "routing", "runtime/admin",
                         "runtime/config", "runtime/weights", "runtime/observe", "runtime/engine:step_record.h"],
                        ["control_plane.h", "snapshot_answer.h", "admin_server.h", "fault_injection.h"]),
    "runtime/daemon": (["common", "comm", "kernels", "placement", "routing", "launch", "runtime/admin",
                        "runtime/config", "runtime/router", "runtime/weights", "runtime/workload", "runtime/trace",
                        "runtime/ingress", "runtime/join", "runtime/engine", "runtime/observe", "runtime/control"],
                       ["daemon.h"]),
}
# The mains, on any folder's interface.
LAYERS["apps"] = (sorted(LAYERS), None)

SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^#include "([a-z_]+/[^"]+)"')


def folder_of(path):
    """The row a path belongs to: a room of runtime/ (a subfolder), else its top folder."""
    parts = path.split("/")
    if parts[0] == "runtime" and len(parts) > 2:
        return "runtime/" + parts[1]
    return parts[0]


def check_file(rel, text, problems):
    """Appends each include of `rel` that breaks the table; returns how many includes it checked."""
    here = folder_of(rel)
    allowed = {}
    for item in LAYERS[here][0]:
        name, _, only = item.partition(":")
        allowed[name] = only.split() if only else None
    checked = 0
    for number, line in enumerate(text.splitlines(), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        target = m.group(1)
        there = folder_of(target)
        if there not in LAYERS:
            continue  # a generated header, a test helper
        checked += 1
        if there == here:
            continue
        inner = target[len(there) + 1:]
        where = f"{rel}:{number}: includes {target}"
        if there not in allowed:
            problems.append(f"{where}, but {here} may include only from: {', '.join(LAYERS[here][0]) or 'nothing else'}")
        elif allowed[there] is not None and inner not in allowed[there]:
            problems.append(f"{where}; {here} may take from {there} only {', '.join(allowed[there])}")
        elif LAYERS[there][1] is not None and inner not in LAYERS[there][1]:
            problems.append(f"{where}, an internal header of {there} (its interface: {', '.join(LAYERS[there][1])})")
    return checked


def self_test():
    """The rule catches what it must: an upward include, another room's
    internal header, a narrowed room, and passes what is allowed."""
    cases = [
        ("runtime/router/router.cc", '#include "runtime/engine/engine.h"', "may include only from"),
        ("runtime/daemon/daemon.cc", '#include "runtime/engine/layer_pass.h"', "an internal header of runtime/engine"),
        ("runtime/observe/report.cc", '#include "runtime/engine/engine.h"', "may take from runtime/engine only"),
        ("common/x.cc", '#include "kernels/cpu/gemm.h"', "may include only from: nothing else"),
        ("runtime/daemon/daemon.cc", '#include "runtime/engine/engine.h"', None),
        ("runtime/engine/engine.cc", '#include "runtime/engine/layer_pass.h"', None),
        ("runtime/observe/report.cc", '#include "runtime/engine/step_record.h"', None),
        ("apps/moed_main.cc", '#include "runtime/daemon/daemon.h"', None),
    ]
    failed = 0
    for rel, line, expect in cases:
        problems = []
        check_file(rel, line, problems)
        ok = (not problems) if expect is None else (len(problems) == 1 and expect in problems[0])
        if not ok:
            print(f"self-test: {rel} with {line}: expected {expect or 'no problem'}, got {problems}")
            failed += 1
    print(f"self-test: {len(cases) - failed} of {len(cases)} cases as expected")
    return 1 if failed else 0


def main():
    if sys.argv[1:2] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2]
    problems, checked = [], 0
    for top in sorted({f.split("/")[0] for f in LAYERS}):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SUFFIXES:
                continue
            rel = path.relative_to(root).as_posix()
            if folder_of(rel) not in LAYERS:
                problems.append(f"{rel}: in {folder_of(rel)}, a folder the table does not name (add it to LAYERS)")
                continue
            checked += check_file(rel, path.read_text(encoding="utf-8"), problems)
    if checked < 100:
        print(f"only {checked} includes found under {root}: wrong folder?", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    if not problems:
        print(f"ok: {checked} includes, none runs upward or into another room's internals")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
