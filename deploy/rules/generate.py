"""Generate deploy/base/prometheusrule.yaml (a Prometheus Operator PrometheusRule) from the plain rule file.

The plain file (deploy/rules/gpu-autoscaler.rules.yml) is the source because promtool can check and unit-test it;
the PrometheusRule is its ``groups`` under ``spec``. The copy is textual (indented, comments kept) so that the
installed object reads like the source and a reviewer sees the same comments in both.

    python deploy/rules/generate.py                 # write deploy/base/prometheusrule.yaml
    python deploy/rules/generate.py --check         # exit 1 when the committed file is out of date
    python deploy/rules/generate.py --runbook-base https://git.example.com/org/repo/-/blob/main/deploy/runbooks
                                                    # point every runbook_url (rules and their tests) elsewhere
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

RULES_DIR = Path(__file__).resolve().parent
SOURCE = RULES_DIR / "gpu-autoscaler.rules.yml"
TARGET = RULES_DIR.parent / "base" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/rules/gpu-autoscaler.rules.yml by deploy/rules/generate.py: edit that file, then run
#     python deploy/rules/generate.py
# Recording rules and alerts of the GPU autoscaler; each alert's runbook_url points at deploy/runbooks/<alert>.md.
# kube-prometheus-stack only loads PrometheusRules matching its ruleSelector (often a `release: <name>` label):
# add that label in an overlay if your Prometheus needs it.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: gpu-autoscaler
  labels:
    app.kubernetes.io/name: gpu-autoscaler
    app.kubernetes.io/component: controller
spec:
"""

# runbook_url: <base>/<AlertName>.md, in the rule file and in the expected annotations of its unit tests.
RUNBOOK_URL = re.compile(r"(runbook_url: *['\"]?)(\S+?)/(\w+\.md)")


def render(source: str) -> str:
    """The PrometheusRule text for the plain rule file's text (its leading comment block is replaced by HEADER)."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise ValueError(f"{SOURCE.name} has no top-level 'groups:'")
    body = ["  " + line if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def set_runbook_base(base: str) -> list[Path]:
    """Rewrite every runbook_url to ``<base>/<AlertName>.md`` in the rule file and its tests; returns changed files."""
    base = base.rstrip("/")
    changed = []
    for path in [SOURCE, *sorted(RULES_DIR.glob("*_test.yml"))]:
        text = path.read_text()
        new = RUNBOOK_URL.sub(lambda m: f"{m.group(1)}{base}/{m.group(3)}", text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed PrometheusRule is out of date")
    parser.add_argument("--runbook-base", metavar="URL", help="set the runbook_url base, then regenerate")
    args = parser.parse_args(argv)
    if args.runbook_base and args.check:
        parser.error("--runbook-base rewrites files; it cannot be combined with --check")
    if args.runbook_base:
        for path in set_runbook_base(args.runbook_base):
            print(f"updated {path.relative_to(RULES_DIR.parents[1])}")
    wanted = render(SOURCE.read_text())
    if args.check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != wanted:
            print(f"{TARGET} is out of date: run python deploy/rules/generate.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(wanted)
    print(f"wrote {TARGET.relative_to(RULES_DIR.parents[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
