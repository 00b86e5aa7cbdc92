"""``python -m megdet.monitoring generate|check``: write or verify the generated chart files.

``generate`` (``make dashboards``) writes the dashboards' JSON and the PrometheusRule template
into charts/megdet-operator; ``check`` exits 1 and names the stale files when the committed
copies differ from what monitoring/ builds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megdet.monitoring.alerts import prometheusrule_template
from megdet.monitoring.dashboards import DASHBOARDS, render

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "megdet-operator"
DASHBOARD_DIR = CHART / "files" / "dashboards"
RULE_TEMPLATE = CHART / "templates" / "prometheusrule.yaml"
# The operator chart's helper templates (charts/megdet-operator/templates/_helpers.tpl).
FULLNAME_HELPER = "megdet-operator.fullname"
LABELS_HELPER = "megdet-operator.labels"


def generated_files() -> dict[Path, str]:
    """Every generated file and the text it must hold."""
    files = {DASHBOARD_DIR / f"{name}.json": render(build()) for name, build in DASHBOARDS.items()}
    files[RULE_TEMPLATE] = prometheusrule_template(FULLNAME_HELPER, LABELS_HELPER)
    return files


def stale_files() -> list[Path]:
    """Generated files whose committed text differs from what monitoring/ builds."""
    return [
        path
        for path, text in generated_files().items()
        if not path.is_file() or path.read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megdet.monitoring", description=__doc__)
    parser.add_argument("command", choices=["generate", "check"])
    args = parser.parse_args(argv)
    if args.command == "generate":
        for path, text in generated_files().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    stale = stale_files()
    for path in stale:
        print(f"stale: {path.relative_to(ROOT)} (run `make dashboards`)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
