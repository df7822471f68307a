#!/usr/bin/env bash
# Never hang silently: a rank that stops answering makes its peers' deadline
# fire with the phase, step, layer and the rank they wait for, and the job ends.
source "$(dirname "$0")/lib.sh"
expect_failure 1 'rank [02]: expert counts of step 1 layer 0: deadline of 1500 ms expired; still waiting for data from ranks \[1\]' \
  "a stalled rank ends the job with a diagnostic" -- \
  env MOED_FAULT=stall:rank=1,step=1 \
  mpirun --bind-to none -np 3 "$MOED" --config "$SMALL" --set comm.timeout_ms=1500 --set comm.backend=mpi
deadline_soon_after_stall
