#!/usr/bin/env python3
"""Write the GPUScalingPolicy CRD (deploy/base/crd-gpuscalingpolicies.yaml) from the pydantic models.

python deploy/generate_crd.py          # rewrite the file
python deploy/generate_crd.py --check  # exit 1 when the committed file is out of date (CI)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = ROOT / "deploy" / "base" / "crd-gpuscalingpolicies.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="do not write; fail when the file differs")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from autoscaler.adapters.kubernetes.crd import crd_yaml

    text = crd_yaml()
    if args.check:
        if not CRD_FILE.exists() or CRD_FILE.read_text() != text:
            print(f"{CRD_FILE.relative_to(ROOT)} is out of date: run python deploy/generate_crd.py", file=sys.stderr)
            return 1
        return 0
    CRD_FILE.write_text(text)
    print(f"wrote {CRD_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
