#!/usr/bin/env python3
"""Writes deploy/k8s/base/prometheusrule.yaml from monitoring/alerts.yml.

    monitoring/make_prometheusrule.py           rewrite the PrometheusRule
    monitoring/make_prometheusrule.py --check   exit 1 when it is out of date

alerts.yml stays the one source of the rules (promtool checks and unit-tests
it); the PrometheusRule (Prometheus Operator, monitoring.coreos.com/v1) carries
the same groups verbatim under spec.groups. tests/deploy checks both that the
file is up to date and that the rendered object's groups equal alerts.yml's.
"""
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "monitoring", "alerts.yml")
TARGET = os.path.join(ROOT, "deploy", "k8s", "base", "prometheusrule.yaml")

HEADER = """\
# GENERATED from monitoring/alerts.yml by monitoring/make_prometheusrule.py:
# edit alerts.yml and rerun the script (tests/deploy fails when they differ).
# Prometheus Operator: the alert and recording rules of monitoring/alerts.yml,
# evaluated by the Prometheus that selects this rule (ruleSelector).
"""


def render():
    with open(SOURCE) as f:
        groups = yaml.safe_load(f)["groups"]
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "pagedserve", "labels": {"app.kubernetes.io/name": "pagedserve"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.safe_dump(obj, sort_keys=False, width=100, allow_unicode=True)


def main():
    text = render()
    if sys.argv[1:] == ["--check"]:
        current = open(TARGET).read() if os.path.exists(TARGET) else ""
        if current != text:
            print(f"{os.path.relpath(TARGET, ROOT)} is out of date: run monitoring/make_prometheusrule.py")
            return 1
        print("prometheusrule.yaml matches monitoring/alerts.yml")
        return 0
    if sys.argv[1:]:
        sys.exit(__doc__)
    with open(TARGET, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
