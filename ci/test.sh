#!/usr/bin/env bash
# Command two of the README: install, build, lint the commit's changes
# (ci/lint.sh), and run the whole test suite (unit tests, the multi-rank tests
# under mpirun, then the admin protocol fuzzer).
set -euo pipefail
cd "$(dirname "$0")/.."
./ci/install-deps.sh
./ci/build.sh
./ci/lint.sh
cd build
ctest --output-on-failure -j 2 -L unit
ctest --output-on-failure -j 1 -L mpi
ctest --output-on-failure -L fuzz
