"""``python -m dashboards``: regenerate dashboards/generated/ and infra/grafana/provisioning/."""

from __future__ import annotations

import sys

from dashboards.build import ROOT, write


def main() -> int:
    """Write every generated file and say which ones changed."""
    before = write(ROOT)
    print(before.describe() if before else "generated files were up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
