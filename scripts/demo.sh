#!/usr/bin/env bash
# The README's first command: set up, then run the simulator on the packaged default scenario (no cluster needed).
# Extra arguments go to `autoscaler simulate` (see `.venv/bin/autoscaler simulate --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/autoscaler simulate "$@"
