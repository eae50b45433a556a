#!/usr/bin/env python3
"""Renders a kustomize overlay and validates every object offline.

    validate_manifests.py OVERLAY_DIR [--kubernetes-version 1.30.0 ...]

1. `kubectl kustomize OVERLAY_DIR` (or `kustomize build` when kubectl is absent).
2. Built-in kinds: kubernetes-validate (PyPI; ships the Kubernetes OpenAPI
   schemas), strict mode (unknown fields are errors), for each version given.
3. Custom resources: JSON schemas in tests/deploy/schemas, every error reported.
   ServiceMonitor and ScaledObject: upstream's (prometheus-operator v0.80.1,
   KEDA v2.16.1), extracted from pinned PyPI packages by
   tests/deploy/extract_schemas.py. LeaderWorkerSet, PrometheusRule and
   InferencePool (Gateway API Inference Extension): no registry package ships
   their CRDs; hand-written subsets whose $comment names the upstream file and
   revision they follow. The pod templates inside a
   LeaderWorkerSet are validated as core/v1 Pods with kubernetes-validate.
4. Cross-object checks that no schema sees: Service selectors select a pod
   template, named target ports and probe ports exist, the ServiceMonitor
   selects the Service and names one of its ports, the dashboard ConfigMap
   carries grafana_dashboard: "1" and valid JSON, pods run as non-root, the
   grace period is longer than the preStop drain budget.
5. Serving contract: a container with an `http` port has startup and
   readiness probes on GET /health of that port and a liveness probe that is
   not /health (liveness must not wait for the model or a step), and a preStop
   drain.
6. Multi-node DNS (the LeaderWorkerSet controller's rule): the controller
   creates a headless Service named after the LeaderWorkerSet (subdomainPolicy
   Shared; <lws>-<group> for UniquePerReplica) selecting
   leaderworkerset.sigs.k8s.io/name; if a rendered Service already has that
   name it is not created. A pod <hostname>.<subdomain>.<namespace> resolves
   only when a headless Service <subdomain> selects the pod. The entry point
   (deploy/docker/entrypoint.sh leader, with stand-ins for mpirun and ssh) is
   run with the variables the controller sets for group 0, and every host
   name it writes into the hostfile or reaches over ssh must resolve.
7. Alerts: a PrometheusRule's groups equal monitoring/alerts.yml's, and every
   job="..." its expressions select is a job a ServiceMonitor produces
   (jobLabel: the Service's label value, else the Service's name).
8. Security (docs/security.md): the NetworkPolicy admits the request ports
   (http, zmq) only from the gateway's pods, the metrics port only from
   Prometheus pods, its portless rule only from pagedserve's own pods, and no
   rule lacks `from`; the CurveZMQ and TLS Secrets are mounted at the
   directories deploy/docker/entrypoint.sh reads, and both CurveZMQ Secrets
   are mounted.

9. Disruption budget: a PodDisruptionBudget selects pods, and its
   minAvailable (when an integer) is below the workload's smallest replica
   count (a budget no eviction can meet blocks node drains for good).
10. Autoscaling (KEDA ScaledObject, schema from extract_schemas.py): it scales
   a rendered Deployment that sets no spec.replicas (kubectl apply would reset
   the autoscaler's count), never to zero (a model takes minutes to load), its
   scale-down stabilization window is at least the scaled pods' startup budget
   (startupProbe period x failureThreshold), and every metric its Prometheus
   queries name is exported and every job="..." is a job a ServiceMonitor
   produces.
11. Inference routing (InferencePool, a hand-written subset of the Gateway API
   Inference Extension CRD): the pool selects the pods that serve HTTP, its
   target port is their `http` container port, endpointPickerRef names a
   rendered Service and port whose pods run the endpoint picker for this pool
   (--pool-name), and every metric name the picker's flags read
   (--total-queued-requests-metric, --kv-cache-usage-percentage-metric,
   --lora-info-metric, whose defaults apply when a flag is absent) is exported
   or turned off with "".
   Metric names (10, 11) are checked against the families a live /metrics
   serves: --metrics-url (deploy_test passes a real Metrics endpoint).

Prints one line per object and exits 1 on the first class of error found
(all errors are printed).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import jsonschema
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "schemas")
ROOT = os.path.dirname(os.path.dirname(HERE))
ENTRYPOINT = os.path.join(ROOT, "deploy", "docker", "entrypoint.sh")
ALERTS = os.path.join(ROOT, "monitoring", "alerts.yml")
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"

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


TLS_DIR = "/etc/pagedserve/tls"  # where deploy/docker/entrypoint.sh looks for tls.crt / tls.key


def entrypoint_default(variable):
    """The default directory deploy/docker/entrypoint.sh gives ${variable:-...}."""
    with open(ENTRYPOINT) as f:
        m = re.search(r"\$\{" + variable + r":-([^}]+)\}", f.read())
    if not m:
        sys.exit(f"validate_manifests: no default for {variable} in {ENTRYPOINT}")
    return m.group(1)


# Secret -> entry point variable whose default directory it must be mounted at:
# a Secret mounted elsewhere would leave the entry point serving without CURVE
# (or without the client allow-list) and nothing would say so.
SECRET_DIRS = {"pagedserve-curve": "PAGEDSERVE_CURVE_DIR",
               "pagedserve-curve-clients": "PAGEDSERVE_CURVE_CLIENTS_DIR",
               "pagedserve-tls": "PAGEDSERVE_TLS_DIR"}


def check_secret_mounts(templates):
    mounted = set()
    for label, template in templates:
        spec = template.get("spec", {})
        secret_of = {v["name"]: v["secret"].get("secretName") for v in spec.get("volumes", []) if "secret" in v}
        for c in spec.get("containers", []):
            for m in c.get("volumeMounts", []):
                secret = secret_of.get(m.get("name"))
                if secret not in SECRET_DIRS:
                    continue
                mounted.add(secret)
                want = entrypoint_default(SECRET_DIRS[secret])
                if m.get("mountPath") != want:
                    error(label, f"Secret {secret} is mounted at {m.get('mountPath')} in {c['name']}, "
                                 f"but the entry point reads {want}")
    for secret in ("pagedserve-curve", "pagedserve-curve-clients"):
        if templates and secret not in mounted:
            error("workloads", f"no container mounts the CurveZMQ Secret {secret}")


def tls_secret(label, spec, c):
    """True when container c mounts a Secret at the entry point's TLS directory (the
    server then speaks only HTTPS); an optional Secret there is an error: without it
    the server would fall back to plain HTTP behind probes that expect TLS."""
    tls_dir = next((e.get("value") for e in c.get("env", []) if e.get("name") == "PAGEDSERVE_TLS_DIR"), TLS_DIR)
    for m in c.get("volumeMounts", []):
        if m.get("mountPath", "").rstrip("/") != tls_dir:
            continue
        vol = next((v for v in spec.get("volumes", []) if v.get("name") == m.get("name")), {})
        if "secret" not in vol:
            error(label, f"{tls_dir} of {c['name']} is not mounted from a Secret")
            return False
        if vol["secret"].get("optional"):
            error(label, f"TLS Secret {vol['secret'].get('secretName')} of {c['name']} is optional: without it "
                         "the API port falls back to plain HTTP")
        return True
    return False


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
        if "http" in ports:
            want = "HTTPS" if tls_secret(label, spec, c) else "HTTP"
            for probe in ("startupProbe", "readinessProbe"):
                get = c.get(probe, {}).get("httpGet", {})
                if get.get("path") != "/health" or get.get("port") not in ("http", 8000):
                    error(label, f"{probe} of {c['name']} must be GET /health on port http, got {get}")
                if probe in c and get.get("scheme", "HTTP") != want:
                    error(label, f"{probe} of {c['name']} uses {get.get('scheme', 'HTTP')}, but the API port "
                                 f"serves {want} (TLS pair {'' if want == 'HTTPS' else 'not '}mounted at "
                                 f"{TLS_DIR})")
            live = c.get("livenessProbe", {}).get("httpGet", {})
            if live.get("path") == "/health":
                error(label, f"livenessProbe of {c['name']} is /health, which fails while the model "
                             "loads or a drain runs: use an endpoint that never waits for a step")
            if "drain" not in c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", []):
                error(label, f"container {c['name']} serves HTTP but has no preStop drain")
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


def lws_pods(lws, group=0):
    """The pods the LWS controller makes for one group: (name, labels, subdomain, template)."""
    name = lws["metadata"]["name"]
    lwt = lws["spec"]["leaderWorkerTemplate"]
    policy = lws["spec"].get("networkConfig", {}).get("subdomainPolicy", "Shared")
    subdomain = name if policy == "Shared" else f"{name}-{group}"
    size = lwt.get("size", 1)
    pods = []
    for i in range(size):
        key = "leaderTemplate" if i == 0 and "leaderTemplate" in lwt else "workerTemplate"
        template = lwt[key]
        labels = dict(template.get("metadata", {}).get("labels", {}))
        labels.update({LWS_NAME_LABEL: name, "leaderworkerset.sigs.k8s.io/group-index": str(group),
                       "leaderworkerset.sigs.k8s.io/worker-index": str(i)})
        pod = f"{name}-{group}" if i == 0 else f"{name}-{group}-{i}"
        pods.append((pod, labels, subdomain, template))
    return pods


def entrypoint_hosts(lws, pods, namespace):
    """Host names deploy/docker/entrypoint.sh leader resolves, run as the LWS leader of group 0."""
    leader, _, subdomain, template = pods[0]
    container = template["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in container.get("env", []) if "value" in e}
    with tempfile.TemporaryDirectory() as tmp:
        bindir = os.path.join(tmp, "bin")
        os.makedirs(bindir)
        stubs = {
            "mpirun": '#!/bin/bash\nprev=\nfor a in "$@"; do [[ $prev == --hostfile ]] && '
                      'sed "s/^/HOST /" "$a"; prev=$a; done\n',
            "ssh": f'#!/bin/bash\nfor a in "$@"; do last=$a; done\necho "$@" >> {tmp}/ssh.log\n',
            "hostname": f"#!/bin/bash\necho {leader}\n",
        }
        for tool, text in stubs.items():
            path = os.path.join(bindir, tool)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o755)
        model = os.path.join(tmp, "model.gguf")
        open(model, "w").close()
        os.makedirs(os.path.join(tmp, "ssh"))
        for key in ("id_ed25519", "id_ed25519.pub"):
            open(os.path.join(tmp, "ssh", key), "w").close()
        env.update({
            "PATH": f"{bindir}:/usr/bin:/bin", "HOME": tmp, "PAGEDSERVE_MODEL": model,
            "PAGEDSERVE_SSH_KEY_DIR": os.path.join(tmp, "ssh"),
            "PAGEDSERVE_GPUS_PER_POD": env.get("PAGEDSERVE_GPUS_PER_POD", "1"),
            # What the LWS controller injects into every pod of the group.
            "LWS_LEADER_ADDRESS": f"{leader}.{subdomain}.{namespace}",
            "LWS_GROUP_SIZE": str(len(pods)), "LWS_WORKER_INDEX": "0", "LWS_NAME": lws["metadata"]["name"],
        })
        args = container.get("args", [])
        out = subprocess.run(["bash", ENTRYPOINT] + args, env=env, capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            error(name_of(lws), f"entrypoint {' '.join(args)} failed as the leader: {out.stderr}")
            return leader, []
        hosts = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("HOST ")]
        log = os.path.join(tmp, "ssh.log")
        if os.path.exists(log):
            hosts += [line.split()[-2] for line in open(log) if len(line.split()) >= 2]
        return leader, sorted(set(hosts))


def check_lws_dns(objs):
    services = [o for o in objs if o["kind"] == "Service"]
    for lws in (o for o in objs if o["kind"] == "LeaderWorkerSet"):
        namespace = lws["metadata"].get("namespace", "default")
        pods = lws_pods(lws)
        subdomain = pods[0][2]
        # The controller's headless Service, unless the name is taken.
        headless = [s for s in services if s["metadata"]["name"] == subdomain
                    and s["metadata"].get("namespace", "default") == namespace]
        if headless:
            error(name_of(headless[0]), f"takes the name of the headless Service the LeaderWorkerSet "
                  f"controller creates for {name_of(lws)}: the controller leaves it alone, so the "
                  f"group's pod DNS names never resolve; give the client Service another name")
        else:
            headless = [{"kind": "Service", "metadata": {"name": subdomain, "namespace": namespace},
                         "spec": {"clusterIP": "None", "selector": {LWS_NAME_LABEL: lws["metadata"]["name"]}}}]
        leader, hosts = entrypoint_hosts(lws, pods, namespace)
        if len(pods) > 1 and not hosts:
            error(name_of(lws), "the entrypoint resolved no worker host names")
        for host in hosts:
            if host == leader:
                continue  # the leader itself: mpirun starts those ranks locally
            parts = host.split(".")
            pod = next((p for p in pods if p[0] == parts[0]), None)
            sub, ns = (parts[1], parts[2]) if len(parts) >= 3 else (None, None)
            published = pod is not None and any(
                s["metadata"]["name"] == sub and s["metadata"].get("namespace", "default") == ns
                and s["spec"].get("clusterIP") == "None"
                and selects(s["spec"].get("selector", {}), pod[1]) and pod[2] == sub
                for s in headless)
            if not published:
                error(name_of(lws), f"host name '{host}' (used by the entrypoint) is published by no "
                      f"headless Service selecting that pod")
            else:
                print(f"resolves {host}")


def jobs_of(objs):
    services = [o for o in objs if o["kind"] == "Service"]
    jobs = set()
    for sm in (o for o in objs if o["kind"] == "ServiceMonitor"):
        match = sm["spec"]["selector"].get("matchLabels", {})
        for s in services:
            if selects(match, s["metadata"].get("labels", {})):
                label = sm["spec"].get("jobLabel")
                jobs.add(s["metadata"]["labels"].get(label, s["metadata"]["name"]) if label
                         else s["metadata"]["name"])
    return jobs


def check_alert_rules(objs):
    rules = [o for o in objs if o["kind"] == "PrometheusRule"]
    if not rules:
        return
    with open(ALERTS) as f:
        groups = yaml.safe_load(f)["groups"]
    jobs = jobs_of(objs)
    for r in rules:
        if r["spec"].get("groups") != groups:
            error(name_of(r), "spec.groups differ from monitoring/alerts.yml "
                              "(run monitoring/make_prometheusrule.py)")
        for g in r["spec"].get("groups", []):
            for rule in g.get("rules", []):
                for job in re.findall(r'job\s*=\s*"([^"]*)"', str(rule.get("expr", ""))):
                    if job not in jobs:
                        error(name_of(r), f"rule {rule.get('alert') or rule.get('record')} selects "
                              f"job=\"{job}\", but the ServiceMonitors produce {sorted(jobs)}")


# Who may reach which port (docs/security.md, deploy/k8s/base/networkpolicy.yaml):
# request ports only from the gateway's pods of this namespace, the metrics port
# only from Prometheus pods, the rule without ports only from pagedserve's own
# pods. A rule without `from` (every source), an ipBlock, or a peer of another
# kind on these ports is an error.
REQUEST_PORTS = {"http", "zmq"}
METRICS_PORTS = {"metrics"}
GATEWAY = {"app.kubernetes.io/part-of": "pagedserve", "app.kubernetes.io/component": "gateway"}
PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}
SELF = {"app.kubernetes.io/name": "pagedserve"}
# The Inference Extension's endpoint picker scrapes GET /metrics on the API port.
ENDPOINT_PICKER = {"app.kubernetes.io/part-of": "pagedserve", "app.kubernetes.io/component": "endpoint-picker"}


def peer_kind(peer):
    if set(peer) - {"podSelector", "namespaceSelector"} or "podSelector" not in peer:
        return None  # ipBlock, or a namespaceSelector alone (every pod of those namespaces)
    pods = peer["podSelector"]
    if set(pods) != {"matchLabels"}:
        return None  # matchExpressions, or {} (every pod)
    labels = pods["matchLabels"]
    if "namespaceSelector" not in peer and all(labels.get(k) == v for k, v in GATEWAY.items()):
        return "gateway"
    if "namespaceSelector" not in peer and all(labels.get(k) == v for k, v in SELF.items()):
        return "self"
    if "namespaceSelector" not in peer and all(labels.get(k) == v for k, v in ENDPOINT_PICKER.items()):
        return "endpoint-picker"
    if all(labels.get(k) == v for k, v in PROMETHEUS.items()):
        return "prometheus"
    return None


def check_network_policy_peers(label, pol):
    for i, rule in enumerate(pol["spec"].get("ingress", [])):
        peers = rule.get("from") or []
        ports = {p.get("port") for p in rule.get("ports", [])}
        if not peers:
            error(label, f"ingress rule {i} has no 'from': every source may reach "
                         f"{sorted(map(str, ports)) or 'every port'}")
            continue
        kinds = [peer_kind(p) for p in peers]
        if not ports:
            allowed = {"self"}
        elif ports & REQUEST_PORTS and ports & METRICS_PORTS:
            allowed = set()
        elif ports == {"http"}:
            allowed = {"gateway", "endpoint-picker"}
        elif ports & REQUEST_PORTS:
            allowed = {"gateway"}
        elif ports & METRICS_PORTS:
            allowed = {"prometheus"}
        else:
            allowed = {"gateway", "prometheus", "self"}
        for p, k in zip(peers, kinds):
            if k not in allowed:
                error(label, f"ingress rule {i} lets {json.dumps(p, sort_keys=True)} reach "
                             f"{sorted(map(str, ports)) or 'every port'} (only {sorted(allowed) or 'nobody'} may)")


def exported_families(url):
    """Metric family names a live Prometheus text endpoint serves (# TYPE lines)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def histogram_series(family):
    return [family + suffix for suffix in ("_bucket", "_sum", "_count")]


class MetricNames:
    """The exported families, fetched once when a check needs them."""

    def __init__(self, url):
        self.url = url
        self.names = None

    def check(self, label, name, where):
        if not self.url:
            error(label, f"{where} reads {name}: run with --metrics-url to check that it is exported")
            return
        if self.names is None:
            families = exported_families(self.url)
            self.names = set(families)
            for f in families:
                self.names.update(histogram_series(f))
        if name not in self.names:
            error(label, f"{where} reads {name}, which /metrics does not export")


# A PromQL metric name: a word with ':' allowed, not a function (followed by '(')
# or a keyword, not a label name or value inside {...}.
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
                   "and", "or", "unless"}


def promql_metrics(query):
    """Metric names in a PromQL query: words outside {...} and [...], not followed
    by '(' (functions, aggregations), not keywords, not inside by/without/on/ignoring (...)."""
    stripped = re.sub(r'\{[^}]*\}|\[[^\]]*\]', " ", query)
    stripped = re.sub(r'\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)', " ", stripped)
    names = []
    for m in re.finditer(r'[a-zA-Z_:][a-zA-Z0-9_:]*', stripped):
        if stripped[m.end():].lstrip().startswith("(") or m.group(0) in PROMQL_KEYWORDS:
            continue
        names.append(m.group(0))
    return names


def workloads(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs
            if o["kind"] in ("Deployment", "StatefulSet", "LeaderWorkerSet")}


def startup_budget(template):
    """Seconds a pod may take before its startup probe gives up (the model load)."""
    budget = 0
    for c in template.get("spec", {}).get("containers", []):
        p = c.get("startupProbe")
        if p:
            budget = max(budget, p.get("initialDelaySeconds", 0)
                         + p.get("periodSeconds", 10) * p.get("failureThreshold", 3))
    return budget


def check_scaled_objects(objs, metrics):
    loads = workloads(objs)
    jobs = jobs_of(objs)
    for so in (o for o in objs if o["kind"] == "ScaledObject"):
        label = name_of(so)
        spec = so["spec"]
        ref = spec.get("scaleTargetRef", {})
        target = loads.get((ref.get("kind", "Deployment"), ref.get("name")))
        if target is None:
            error(label, f"scaleTargetRef {ref.get('kind', 'Deployment')}/{ref.get('name')} is not a rendered workload")
        elif "replicas" in target["spec"]:
            error(label, f"scales {name_of(target)}, which sets spec.replicas: every kubectl apply would "
                         "reset the autoscaler's replica count")
        if spec.get("minReplicaCount", 0) < 1:
            error(label, "minReplicaCount is 0: the first request after idling would wait for a model load")
        down = (spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
                .get("scaleDown", {}))
        if target is not None:
            need = startup_budget(target["spec"]["template"])
            window = down.get("stabilizationWindowSeconds", 300)
            if window < need:
                error(label, f"scaleDown stabilizationWindowSeconds {window} is shorter than the {need} s "
                             f"a new pod of {name_of(target)} may take to load (startupProbe)")
        for i, trig in enumerate(spec.get("triggers", [])):
            if trig.get("type") != "prometheus":
                continue
            query = trig.get("metadata", {}).get("query", "")
            names = promql_metrics(query)
            if not names:
                error(label, f"trigger {i}: no metric in query {query!r}")
            for name in names:
                metrics.check(label, name, f"trigger {i}")
            for job in re.findall(r'job\s*=\s*"([^"]*)"', query):
                if job not in jobs:
                    error(label, f"trigger {i} selects job=\"{job}\", but the ServiceMonitors produce {sorted(jobs)}")


# The endpoint picker's metric flags and their defaults (Gateway API Inference
# Extension, cmd/epp/runner/options.go at commit 9cdc2980a8ad6bc0269e77fec8cfe45d3defc92b).
EPP_METRIC_FLAGS = {"--total-queued-requests-metric": "vllm:num_requests_waiting",
                    "--kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
                    "--lora-info-metric": "vllm:lora_requests_info"}


def flag_values(args):
    out = {}
    for i, a in enumerate(args):
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        elif a.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[a] = args[i + 1]
    return out


def check_inference_pools(objs, templates, metrics):
    services = [o for o in objs if o["kind"] == "Service"]
    for pool in (o for o in objs if o["kind"] == "InferencePool"):
        label = name_of(pool)
        spec = pool["spec"]
        match = spec.get("selector", {}).get("matchLabels", {})
        chosen = [(l, t) for l, t in templates if selects(match, t.get("metadata", {}).get("labels", {}))]
        if not chosen:
            error(label, f"selector {match} selects no pod template")
        port = spec.get("targetPorts", [{}])[0].get("number")
        for l, t in chosen:
            http = [p.get("containerPort") for c in t["spec"]["containers"] for p in c.get("ports", [])
                    if p.get("name") == "http"]
            if http != [port]:
                error(label, f"target port {port} is not the http container port {http} of {l}")
        ref = spec.get("endpointPickerRef", {})
        svc = next((s for s in services if s["metadata"]["name"] == ref.get("name")), None)
        if ref.get("kind", "Service") != "Service" or svc is None:
            error(label, f"endpointPickerRef names no rendered Service: {ref.get('name')}")
            continue
        sport = next((p for p in svc["spec"].get("ports", []) if p.get("port") == ref.get("port", {}).get("number")), None)
        if sport is None:
            error(label, f"endpointPickerRef port {ref.get('port', {}).get('number')} is not a port of {name_of(svc)}")
        pickers = [(l, t) for l, t in templates if selects(svc["spec"].get("selector", {}),
                                                             t.get("metadata", {}).get("labels", {}))]
        if not pickers:
            error(label, f"{name_of(svc)} selects no pod: no endpoint picker")
        for l, t in pickers:
            for c in t["spec"]["containers"]:
                flags = flag_values(c.get("args", []))
                if flags.get("--pool-name") != pool["metadata"]["name"]:
                    error(label, f"the endpoint picker {l} serves pool {flags.get('--pool-name')}, not this one")
                for flag, default in EPP_METRIC_FLAGS.items():
                    spec_str = flags.get(flag, default)
                    if spec_str == "":
                        continue  # turned off
                    metrics.check(label, spec_str.split("{")[0].strip(), f"endpoint picker {l} ({flag})")


def check_disruption_budgets(objs, templates):
    loads = workloads(objs)
    scaled = {(o["spec"]["scaleTargetRef"].get("kind", "Deployment"), o["spec"]["scaleTargetRef"].get("name")):
              o["spec"].get("minReplicaCount", 0) for o in objs if o["kind"] == "ScaledObject"}
    for pdb in (o for o in objs if o["kind"] == "PodDisruptionBudget"):
        label = name_of(pdb)
        match = pdb["spec"].get("selector", {}).get("matchLabels", {})
        chosen = [w for w in loads.values()
                  for _, t in pod_templates(w) if selects(match, t.get("metadata", {}).get("labels", {}))]
        if not chosen:
            error(label, f"selector {match} selects no pod template")
        least = min((scaled.get((w["kind"], w["metadata"]["name"]), w["spec"].get("replicas", 1))
                     for w in chosen), default=1)
        floor = pdb["spec"].get("minAvailable")
        if isinstance(floor, int) and floor >= least:
            error(label, f"minAvailable {floor} with {least} replica(s): no pod may ever be evicted, "
                         "node drains block for good")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("overlay")
    ap.add_argument("--kubernetes-version", action="append", dest="versions")
    ap.add_argument("--metrics-url", help="a pagedserve /metrics endpoint: the metric names it exports")
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
            validator = jsonschema.validators.validator_for(schema)(schema)
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
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

    check_secret_mounts(templates)
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
        # Each port a Service publishes for these pods (HTTP API, ZeroMQ, metrics)
        # must be opened by some rule that names ports: the rule without ports
        # admits only pagedserve's own pods, so a port left out of the others
        # would be unreachable for every client behind the Service.
        opened = {p.get("port") for rule in pol["spec"].get("ingress", []) for p in rule.get("ports", [])}
        for svc in services:
            if not any(selects(svc["spec"].get("selector", {}), t.get("metadata", {}).get("labels", {}))
                       for t in chosen):
                continue
            for port in svc["spec"].get("ports", []):
                target = port.get("targetPort")
                if isinstance(target, str) and target not in opened:
                    error(label, f"port '{target}' of {name_of(svc)} is opened by no ingress rule "
                                 "(only pagedserve's own pods could reach it)")
        check_network_policy_peers(label, pol)
    check_lws_dns(objs)
    check_alert_rules(objs)
    metrics = MetricNames(args.metrics_url)
    check_disruption_budgets(objs, templates)
    check_scaled_objects(objs, metrics)
    check_inference_pools(objs, templates, metrics)
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
