#!/usr/bin/env bash
# The project's test command (README): every test that can run on this machine. GPU tests
# (marker `gpu`) skip themselves where no NVIDIA GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
exec python -m pytest -q -p no:cacheprovider --durations=60 tests "$@"
