#!/usr/bin/env bash
# The README's second command: set up (venv, test tools, Debian prometheus), then lint, type-check, check the
# layering contracts and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
echo "== ruff (lint)"
.venv/bin/ruff check .
echo "== mypy (type check: the autoscaler and forecast packages, strict)"
.venv/bin/mypy
echo "== import-linter (layering contracts)"
.venv/bin/lint-imports
echo "== control plane for tests/realkube (scripts/control-plane.sh: ~8 min cold, cached after)"
[[ -n "${SKIP_REALKUBE:-}" && -z "${CI:-}" ]] || scripts/control-plane.sh >/dev/null
echo "== pytest"
exec .venv/bin/pytest "$@"
