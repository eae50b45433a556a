#!/usr/bin/env python3
"""Renders a kustomize overlay and validates every object offline.

    validate_manifests.py OVERLAY_DIR [--kubernetes-version 1.30.0 ...]

1. `kubectl kustomize OVERLAY_DIR` (or `kustomize build` when kubectl is absent).
2. Built-in kinds: kubernetes-validate (PyPI; ships the Kubernetes OpenAPI
   schemas), strict mode (unknown fields are errors), for each version given.
3. Custom resources: JSON schemas in tests/deploy/schemas (a hand-written subset
   of the CRDs: LeaderWorkerSet, ServiceMonitor). The pod templates inside a
   LeaderWorkerSet are validated as core/v1 Pods with kubernetes-validate.
4. Cross-object checks that no schema sees: Service selectors select a pod
   template, named target ports and probe ports exist, the ServiceMonitor
   selects the Service and names one of its ports, the dashboard ConfigMap
   carries grafana_dashboard: "1" and valid JSON, pods run as non-root, the
   grace period is longer than the preStop drain budget.

Prints one line per object and exits 1 on the first class of error found
(all errors are printed).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "schemas")

errors = []


def error(obj, msg):
    errors.append(f"{obj}: {msg}")


def render(overlay):
    if shutil.which("kubectl"):
        cmd = ["kubectl", "kustomize", overlay]
    elif shutil.which("kustomize"):
        cmd = ["kustomize", "build", overlay]
    else:
        sys.exit("validate_manifests: neither kubectl nor kustomize found (scripts/install-deps)")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"validate_manifests: {' '.join(cmd)} failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def name_of(obj):
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def custom_schema(obj):
    group_version = obj["apiVersion"].replace("/", "_")
    path = os.path.join(SCHEMAS, f"{group_version}_{obj['kind']}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def k8s_validate(obj, label, versions):
    for v in versions:
        try:
            kubernetes_validate.validate(obj, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path) if hasattr(e, "path") else ""
            error(label, f"kubernetes {v}: {getattr(e, 'message', e)} at {path}")
        except kubernetes_validate.SchemaNotFoundError as e:
            error(label, f"kubernetes {v}: no schema: {e}")


def pod_templates(obj):
    """(label, pod template) pairs of a workload."""
    kind = obj["kind"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield name_of(obj), obj["spec"]["template"]
    elif kind == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            if key in lwt:
                yield f"{name_of(obj)}.{key}", lwt[key]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_pod(label, template):
    spec = template.get("spec", {})
    psc = spec.get("securityContext", {})
    for c in spec.get("containers", []):
        csc = c.get("securityContext", {})
        if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
            error(label, f"container {c['name']}: runAsNonRoot is not set")
        if csc.get("allowPrivilegeEscalation", True):
            error(label, f"container {c['name']}: allowPrivilegeEscalation is not false")
        ports = {p.get("name") for p in c.get("ports", [])}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            p = c.get(probe)
            if not p:
                continue
            for kind in ("httpGet", "tcpSocket"):
                port = p.get(kind, {}).get("port")
                if isinstance(port, str) and port not in ports:
                    error(label, f"{probe} uses port '{port}', not a named port of {c['name']}")
        if "readinessProbe" not in c or "livenessProbe" not in c:
            error(label, f"container {c['name']}: needs readiness and liveness probes")
        pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if "drain" in pre:
            budget = int(pre[pre.index("drain") + 1]) if len(pre) > pre.index("drain") + 1 else 240
            grace = spec.get("terminationGracePeriodSeconds", 30)
            if grace <= budget:
                error(label, f"terminationGracePeriodSeconds {grace} <= preStop drain budget {budget}")
    mounts = {m["name"] for c in spec.get("containers", []) for m in c.get("volumeMounts", [])}
    volumes = {v["name"] for v in spec.get("volumes", [])}
    for m in mounts - volumes:
        error(label, f"volumeMount '{m}' has no volume")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("overlay")
    ap.add_argument("--kubernetes-version", action="append", dest="versions")
    args = ap.parse_args()
    versions = args.versions or ["1.30.0", "1.37.0"]

    objs = render(args.overlay)
    if not objs:
        sys.exit(f"validate_manifests: {args.overlay} rendered no objects")
    templates = []
    for obj in objs:
        label = name_of(obj)
        schema = custom_schema(obj)
        if schema is not None:
            try:
                jsonschema.validate(obj, schema)
            except jsonschema.ValidationError as e:
                error(label, f"CRD schema: {e.message} at /{'/'.join(str(p) for p in e.absolute_path)}")
        elif "." in obj["apiVersion"].split("/")[0] and obj["apiVersion"].split("/")[0] not in (
                "apps", "batch", "networking.k8s.io", "policy", "rbac.authorization.k8s.io",
                "autoscaling", "storage.k8s.io"):
            error(label, f"custom resource {obj['apiVersion']} without a schema in {SCHEMAS}")
        else:
            k8s_validate(obj, label, versions)
        for tlabel, template in pod_templates(obj):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "template", **template.get("metadata", {})},
                   "spec": template.get("spec", {})}
            if obj["kind"] == "LeaderWorkerSet":  # built-in workloads were validated whole
                k8s_validate(pod, tlabel, versions)
            check_pod(tlabel, template)
            templates.append((tlabel, template))
        print(f"validated {label}")

    services = [o for o in objs if o["kind"] == "Service"]
    for svc in services:
        label = name_of(svc)
        selector = svc["spec"].get("selector", {})
        chosen = [(l, t) for l, t in templates if selects(selector, t.get("metadata", {}).get("labels", {}))]
        if not chosen:
            error(label, f"selector {selector} selects no pod template")
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort")
            if isinstance(target, str):
                for l, t in chosen:
                    names = {p.get("name") for c in t["spec"]["containers"] for p in c.get("ports", [])}
                    if target not in names:
                        error(label, f"targetPort '{target}' is not a container port of {l}")
    for sm in (o for o in objs if o["kind"] in ("ServiceMonitor",)):
        label = name_of(sm)
        match = sm["spec"]["selector"].get("matchLabels", {})
        svcs = [s for s in services if selects(match, s["metadata"].get("labels", {}))]
        if not svcs:
            error(label, f"selector {match} selects no Service")
        for ep in sm["spec"].get("endpoints", []):
            for s in svcs:
                if ep.get("port") not in {p.get("name") for p in s["spec"]["ports"]}:
                    error(label, f"endpoint port '{ep.get('port')}' is not a port of {name_of(s)}")
    # NetworkPolicy: it selects some pod, and each named port of its rules is a
    # container port of a selected pod (a typo would silently allow nothing).
    for pol in (o for o in objs if o["kind"] == "NetworkPolicy"):
        label = name_of(pol)
        match = pol["spec"].get("podSelector", {}).get("matchLabels", {})
        chosen = [t for _, t in templates if selects(match, t.get("metadata", {}).get("labels", {}))]
        if not chosen:
            error(label, f"podSelector {match} selects no pod template")
        names = {p.get("name") for t in chosen for c in t["spec"]["containers"] for p in c.get("ports", [])}
        for rule in pol["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                if isinstance(port.get("port"), str) and port["port"] not in names:
                    error(label, f"ingress port '{port['port']}' is not a container port of the selected pods")
    dashboards = [o for o in objs if o["kind"] == "ConfigMap"
                  and o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    if len(dashboards) != 1:
        error("ConfigMap", f"expected one ConfigMap labelled grafana_dashboard: \"1\", found {len(dashboards)}")
    for cm in dashboards:
        for key, text in cm.get("data", {}).items():
            try:
                json.loads(text)
            except ValueError as e:
                error(name_of(cm), f"{key} is not JSON: {e}")

    for e in errors:
        print("ERROR", e)
    print(f"{len(objs)} objects, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
