#!/usr/bin/env bash
# The README's first command: set up, then run the simulator on the packaged scenarios (no cluster needed): the
# default one (14 days of an LLM chat trace), then the mixed one (inference and training sharing a full cluster:
# preemption, lost training work and burst nodes). Extra arguments go to `autoscaler simulate` instead (one run; see
# `.venv/bin/autoscaler simulate --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ "$#" -gt 0 ]; then
    exec .venv/bin/autoscaler simulate "$@"
fi
.venv/bin/autoscaler simulate
echo
exec .venv/bin/autoscaler simulate autoscaler/sim/scenarios/mixed-training.yaml
