#!/usr/bin/env bash
# The project's test command (README): every test that can run on this machine. GPU tests
# (marker `gpu`) skip themselves where no NVIDIA GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# Paths given (scripts/run_tests.sh tests/test_x.py -k y): those alone; else the whole tests/
# tree. Before, `tests` was always passed too, so naming a file still ran the whole suite.
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
        exec python -m pytest -q -p no:cacheprovider --durations=60 "$@"
    fi
done
exec python -m pytest -q -p no:cacheprovider --durations=60 tests "$@"
