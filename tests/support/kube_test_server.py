#!/usr/bin/env python3
"""A Kubernetes API test server for the deploy tests: enough of the real HTTP API
for the real kubectl (and later helm) to work against it on loopback.

  kube_test_server.py --port P --fixtures DIR [--schemas DIR] [--kubeconfig OUT]

Speaks: legacy discovery (/api, /apis, /api/v1, /apis/<group>/<version>, /version)
and OpenAPI v3 as far as kubectl reads it (each kind's PATCH with its fieldValidation
parameter); GET of collections (cluster-wide and per namespace, with labelSelector
and fieldSelector=spec.nodeName=X), of single objects, and watches (initial events,
bookmarks, then changes); server-side apply (PATCH with application/apply-patch+yaml),
create (POST) and replace (PUT), in JSON, YAML or, for the Secrets Helm keeps its
releases in, Kubernetes protobuf; bodies validated against the published JSON
Schemas (--schemas: ../shared/deploy/schemas) strictly, answering 422 with causes as
the API server does; metadata.generation as the API server keeps it; DELETE; pod
logs. A DaemonSet gets the status its controller would report and a Ready pod on
each node it selects (node selector and required node affinity) and tolerates (so `helm --wait`, `kubectl rollout status` and
`deploy verify` see it running).
Objects come from the JSON files in --fixtures (a List or single objects).
Writes a kubeconfig pointing at itself when --kubeconfig is given, then prints
"ready" on stdout.

With --kubelet DIR, an applied Indexed Job gets its pods, scheduled onto the
fixture nodes as the scheduler would (node selector, the GPU taint, one pod per
node, requests against allocatable; a pod that fits nowhere stays Pending with the
scheduler's message, e.g. "0/3 nodes are available: 2 Insufficient
vpc.amazonaws.com/efa"), and each scheduled pod runs as a local process: the
container's command with its environment (the downward API's labels, name and
namespace resolved), JOB_COMPLETION_INDEX and HOSTNAME as Kubernetes sets them, the
Job's name and UID as its pod labels (batch.kubernetes.io/controller-uid), ConfigMap volumes written under DIR/<pod>/ (arguments naming
the mount path are pointed there) and the working directory there too. The test
cluster has no DNS, so MASTER_ADDR is set to 127.0.0.1 where the pod does not set
it: the pods' "<job>-0.<service>" name stands for this host. Pod phases, logs and
the Job's Complete / Failed conditions follow the processes. Containers' $(VAR)
references are expanded and secretKeyRef resolved as the kubelet does. The
operators of kube_test_operators.py run RayClusters, RayJobs and PyTorchJobs the
same way; README.md in this directory says where each behaviour comes from.
"""
import argparse
import copy
import http.server
import random
import signal
import re
import string
import subprocess
import json
import os
import sys
import threading
import time
import urllib.parse
import uuid

try:
    import yaml  # python3-yaml
except ImportError:  # pragma: no cover
    yaml = None
try:
    import jsonschema  # python3-jsonschema
except ImportError:  # pragma: no cover
    jsonschema = None

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
# Files the rendered Dockerfile installs into the image, taken from this checkout
# when a container names them.
IMAGE_FILES = {"/opt/shardtrain/ray_driver.py": os.path.join(SOURCE, "src/deploy/ray_driver.py")}

# group/version -> [(plural, kind, namespaced)]
RESOURCES = {
    "v1": [("nodes", "Node", False), ("namespaces", "Namespace", False), ("pods", "Pod", True),
           ("services", "Service", True), ("configmaps", "ConfigMap", True), ("secrets", "Secret", True),
           ("serviceaccounts", "ServiceAccount", True), ("events", "Event", True)],
    "apps/v1": [("daemonsets", "DaemonSet", True), ("deployments", "Deployment", True)],
    "batch/v1": [("jobs", "Job", True)],
    "rbac.authorization.k8s.io/v1": [("clusterroles", "ClusterRole", False), ("clusterrolebindings", "ClusterRoleBinding", False),
                                     ("roles", "Role", True), ("rolebindings", "RoleBinding", True)],
    "ray.io/v1": [("rayclusters", "RayCluster", True), ("rayjobs", "RayJob", True)],
    "kubeflow.org/v1": [("pytorchjobs", "PyTorchJob", True)],
}
SHORT_NAMES = {"nodes": ["no"], "namespaces": ["ns"], "pods": ["po"], "services": ["svc"], "configmaps": ["cm"],
               "serviceaccounts": ["sa"], "events": ["ev"], "daemonsets": ["ds"], "deployments": ["deploy"]}
KIND_OF = {(gv, plural): (kind, ns) for gv, rs in RESOURCES.items() for plural, kind, ns in rs}
PLURAL_OF = {(gv, kind): plural for gv, rs in RESOURCES.items() for plural, kind, _ in rs}


def status(code, reason, message, causes=None, name=None, kind=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
         "reason": reason, "code": code}
    if causes:
        s["details"] = {"name": name or "", "kind": kind or "", "causes": causes}
    return s


def make_strict(s):
    if isinstance(s, dict):
        if "properties" in s and "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
        for v in s.values():
            make_strict(v)
    elif isinstance(s, list):
        for v in s:
            make_strict(v)


class Store:
    def __init__(self, fixtures, schemas):
        self.lock = threading.Lock()
        self.objects = {}  # (gv, plural, namespace, name) -> object
        self.logs = {}     # (namespace, pod) -> text
        self.rv = 1
        self.schemas_dir = schemas
        self.validators = {}
        if fixtures:
            for f in sorted(os.listdir(fixtures)):
                path = os.path.join(fixtures, f)
                if f.endswith(".json"):
                    doc = json.load(open(path))
                    for o in doc.get("items", []) if doc.get("kind", "").endswith("List") else [doc]:
                        self.put(o)
                elif f.endswith(".log"):  # <namespace>.<pod>.log
                    ns, pod = f[:-4].split(".", 1)
                    self.logs[(ns, pod)] = open(path).read()
            # Once every node is there: the DaemonSets' status (and pods) as their
            # controller would have them.
            for key, o in list(self.objects.items()):
                if o.get("kind") == "DaemonSet":
                    self.daemonset_controller(o)

    def put(self, o, old=None):
        gv, kind = o["apiVersion"], o["kind"]
        plural = PLURAL_OF[(gv, kind)]
        md = o.setdefault("metadata", {})
        md.setdefault("uid", str(uuid.uuid4()))
        md.setdefault("creationTimestamp", "2026-12-03T00:00:00Z")
        if "spec" in o:  # as the API server: a new spec is a new generation
            before = (old or {}).get("metadata", {}).get("generation", 0)
            md["generation"] = before + (0 if old and old.get("spec") == o["spec"] else 1) if old else md.get("generation", 1)
        if kind == "DaemonSet":
            self.daemonset_controller(o)
        self.rv += 1
        md["resourceVersion"] = str(self.rv)
        ns = md.get("namespace", "") if KIND_OF[(gv, plural)][1] else ""
        self.objects[(gv, plural, ns, md["name"])] = o
        return o

    def daemonset_controller(self, ds):
        """Status as the DaemonSet controller would report it once its pods run: one
        per node it selects and tolerates."""
        spec = ds.get("spec", {}).get("template", {}).get("spec", {})
        n = 0
        for (gv, p, _, _), node in list(self.objects.items()):
            if gv != "v1" or p != "nodes":
                continue
            if not selects(spec, node) or untolerated(spec, node, ("NoSchedule",)):
                continue
            n += 1
            owned = [o for o in list(self.objects.values()) if o.get("kind") == "Pod"
                     and o["spec"].get("nodeName") == node["metadata"]["name"]
                     and any(r.get("name") == ds["metadata"]["name"] for r in o["metadata"].get("ownerReferences", []))]
            if not owned:  # the controller's pod on this node, running
                suffix = "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(5))
                self.put({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": ds["metadata"]["name"] + "-" + suffix,
                                       "namespace": ds["metadata"].get("namespace", "default"),
                                       "labels": dict(ds.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})),
                                       "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                            "name": ds["metadata"]["name"], "uid": ds["metadata"].get("uid", ""),
                                                            "controller": True}]},
                          "spec": {"nodeName": node["metadata"]["name"], "containers": copy.deepcopy(spec.get("containers", []))},
                          "status": {"phase": "Running", "qosClass": "BestEffort",
                                     "conditions": [{"type": "Ready", "status": "True"}]}})
        ds["status"] = {"currentNumberScheduled": n, "desiredNumberScheduled": n, "numberAvailable": n,
                        "numberReady": n, "updatedNumberScheduled": n, "numberMisscheduled": 0,
                        "observedGeneration": ds["metadata"].get("generation", 1)}

    def validate(self, o):
        if not self.schemas_dir or jsonschema is None:
            return []
        key = o.get("apiVersion", "") + "/" + o.get("kind", "")
        if key not in self.validators:
            index = json.load(open(os.path.join(self.schemas_dir, "index.json")))["schemas"]
            if key not in index:
                self.validators[key] = None
            else:
                schema = json.load(open(os.path.join(self.schemas_dir, index[key]["file"])))
                make_strict(schema)
                self.validators[key] = jsonschema.Draft7Validator(schema)
        v = self.validators[key]
        if v is None:
            return []
        return [{"reason": "FieldValueInvalid", "message": e.message,
                 "field": ".".join(str(p) for p in e.absolute_path)} for e in v.iter_errors(o)]


# ---- Kubernetes protobuf, as much as clients send here: Helm stores its releases in
# Secrets and client-go writes built-in kinds as protobuf ("k8s\\0" + runtime.Unknown).

def _varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def _fields(b):
    """(field number, wire type, value) of a protobuf message; value is bytes for
    length-delimited fields, an int for varints."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("protobuf wire type %d" % wt)
        yield num, wt, v


def _map_entry(b):
    k = v = b""
    for num, _, val in _fields(b):
        if num == 1:
            k = val
        elif num == 2:
            v = val
    return k, v


def _object_meta(b):
    # k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta: name 1, generateName 2,
    # namespace 3, resourceVersion 6, labels 11, annotations 12.
    md = {}
    for num, _, v in _fields(b):
        if num == 1:
            md["name"] = v.decode()
        elif num == 2:
            md["generateName"] = v.decode()
        elif num == 3:
            md["namespace"] = v.decode()
        elif num == 6:
            md["resourceVersion"] = v.decode()
        elif num in (11, 12):
            k, val = _map_entry(v)
            md.setdefault("labels" if num == 11 else "annotations", {})[k.decode()] = val.decode()
    return md


def decode_protobuf(body):
    """A Secret or ConfigMap (the kinds Helm's storage writes) from Kubernetes
    protobuf, as the JSON object the API server would store."""
    import base64
    if not body.startswith(b"k8s\x00"):
        raise ValueError("not a Kubernetes protobuf envelope")
    api_version = kind = ""
    raw = b""
    for num, _, v in _fields(body[4:]):  # runtime.Unknown: typeMeta 1, raw 2
        if num == 1:
            for n2, _, v2 in _fields(v):
                if n2 == 1:
                    api_version = v2.decode()
                elif n2 == 2:
                    kind = v2.decode()
        elif num == 2:
            raw = v
    o = {"apiVersion": api_version, "kind": kind, "metadata": {}}
    for num, _, v in _fields(raw):
        if num == 1:
            o["metadata"] = _object_meta(v)
        elif num == 2:  # data: map<string, bytes> (Secret), map<string, string> (ConfigMap)
            k, val = _map_entry(v)
            o.setdefault("data", {})[k.decode()] = (base64.b64encode(val).decode() if kind == "Secret"
                                                    else val.decode())
        elif num == 3 and kind == "Secret":
            o["type"] = v.decode()
        elif num == 5 and kind == "Secret":
            o["immutable"] = bool(v)
    return o


def selects(pod_spec, node):
    """Whether the pod's nodeSelector and required node affinity admit the node."""
    labels = node["metadata"].get("labels", {}) or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    terms = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if not terms:
        return True

    def holds(e):
        has, value = e["key"] in labels, labels.get(e["key"])
        op, values = e["operator"], e.get("values") or []
        if op == "In":
            return has and value in values
        if op == "NotIn":
            return not has or value not in values
        if op == "Exists":
            return has
        if op == "DoesNotExist":
            return not has
        if op in ("Gt", "Lt"):
            return has and (int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0]))
        return False
    return any(all(holds(e) for e in t.get("matchExpressions") or []) for t in terms)


def untolerated(pod_spec, node, effects=("NoSchedule", "NoExecute")):
    """The node's taints of these effects that no toleration of the pod matches."""
    def tolerates(x, t):
        op = x.get("operator", "Equal")
        key_ok = x.get("key", "") == t.get("key") or (not x.get("key") and op == "Exists")
        value_ok = op == "Exists" or x.get("value", "") == t.get("value", "")
        return key_ok and value_ok and x.get("effect", "") in ("", t.get("effect"))
    return [t for t in (node.get("spec", {}).get("taints") or []) if t.get("effect") in effects
            and not any(tolerates(x, t) for x in pod_spec.get("tolerations") or [])]


def quantity(q):
    """A Kubernetes quantity as a float: "40", "47810m", "160Gi", "192800664Ki"."""
    q = str(q)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    for u, f in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if q.endswith(u):
            return float(q[:-len(u)]) * f
    return float(q)


class Kubelet:
    def __init__(self, store, root):
        self.store, self.root = store, os.path.abspath(root)
        self.used = {}  # node -> {resource: amount}
        self.procs = []  # every pod process started, stopped with the server

    def requests(self, pod_spec):
        total = {}
        for c in pod_spec.get("containers", []):
            r = c.get("resources", {})
            for k, v in (r.get("requests") or r.get("limits") or {}).items():
                total[k] = total.get(k, 0) + quantity(v)
        return total

    def schedule(self, pod):
        """The node for the pod, or None and the scheduler's message."""
        spec, labels = pod["spec"], pod["metadata"].get("labels", {})
        want = self.requests(spec)
        nodes = [o for (gv, p, _, _), o in sorted(self.store.objects.items()) if gv == "v1" and p == "nodes"]
        reasons = {}
        for n in nodes:
            name = n["metadata"]["name"]
            why = None
            if not selects(spec, n):
                why = "node(s) didn't match Pod's node affinity/selector"
            for t in untolerated(spec, n)[:1] if why is None else []:
                why = "node(s) had untolerated taint {%s: %s}" % (t.get("key"), t.get("value", ""))
            if why is None:  # required pod anti-affinity by hostname: matchLabels against the node's pods
                terms = (((spec.get("affinity") or {}).get("podAntiAffinity") or {})
                         .get("requiredDuringSchedulingIgnoredDuringExecution") or [])
                for term in terms:
                    want_labels = (term.get("labelSelector") or {}).get("matchLabels") or {}
                    for o in self.store.objects.values():
                        if o.get("kind") == "Pod" and o["spec"].get("nodeName") == name \
                                and o["status"].get("phase") in ("Pending", "Running") \
                                and all(o["metadata"].get("labels", {}).get(k) == v for k, v in want_labels.items()):
                            why = "node(s) didn't match pod anti-affinity rules"
            if why is None:
                alloc = n.get("status", {}).get("allocatable", {})
                for res, amount in sorted(want.items()):
                    free = quantity(alloc.get(res, "0")) - self.used.get(name, {}).get(res, 0)
                    if amount > free:
                        why = "Insufficient " + res
                        break
            if why is None:
                for res, amount in want.items():
                    self.used.setdefault(name, {})[res] = self.used.get(name, {}).get(res, 0) + amount
                return name, None
            reasons[why] = reasons.get(why, 0) + 1
        msg = "0/%d nodes are available: %s." % (len(nodes), ", ".join("%d %s" % (c, w) for w, c in sorted(reasons.items())))
        return None, msg

    def run_job(self, job):
        """An Indexed Job (the Job controller): one pod per completion index, labelled
        as the Job controller labels them, run to their end; then the Job's
        Complete / Failed condition."""
        md, spec = job["metadata"], job["spec"]
        ns, name = md.get("namespace", "default"), md["name"]
        tmpl = spec["template"]
        indexed = spec.get("completionMode") == "Indexed"
        procs = []
        for i in range(int(spec.get("completions", 1))):
            pod_name = "%s-%s%s" % (name, "%d-" % i if indexed else "", suffix())
            labels = dict(tmpl.get("metadata", {}).get("labels", {}))
            # As the Job controller labels its pods: the Job's name and UID (old and
            # new keys) and the completion index.
            labels.update({"batch.kubernetes.io/job-name": name, "job-name": name,
                           "batch.kubernetes.io/controller-uid": md.get("uid", ""), "controller-uid": md.get("uid", "")})
            annotations = {}
            extra = {}
            if indexed:
                labels["batch.kubernetes.io/job-completion-index"] = str(i)
                annotations["batch.kubernetes.io/job-completion-index"] = str(i)
                extra = {"JOB_COMPLETION_INDEX": str(i), "HOSTNAME": "%s-%d" % (name, i)}
            pod = self.new_pod(ns, pod_name, labels, tmpl["spec"],
                               {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": md.get("uid", "")},
                               annotations)
            proc = self.run_pod(pod, extra)
            if proc:
                procs.append((pod, proc))
        for pod, proc in procs:
            self.finish_pod(pod, proc.wait())
        with self.store.lock:
            pods = [o for o in self.store.objects.values() if o.get("kind") == "Pod"
                    and o["metadata"].get("labels", {}).get("batch.kubernetes.io/controller-uid") == md.get("uid")]
            ok = sum(p["status"]["phase"] == "Succeeded" for p in pods)
            bad = sum(p["status"]["phase"] == "Failed" for p in pods)
            cond = "Complete" if ok == int(spec.get("completions", 1)) else ("Failed" if bad else None)
            job["status"] = {"succeeded": ok, "failed": bad}
            if cond:
                job["status"]["conditions"] = [{"type": cond, "status": "True"}]
            self.store.put(job)

    def new_pod(self, ns, name, labels, pod_spec, owner, annotations=None):
        owner = dict(owner, controller=True)
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations or {},
                             "uid": str(uuid.uuid4()), "ownerReferences": [owner]},
                "spec": copy.deepcopy(pod_spec), "status": {"phase": "Pending", "qosClass": "Guaranteed"}}

    def place(self, pod):
        """Schedules the pod and stores it: Running on its node (True), or Pending with
        the scheduler's message (False)."""
        with self.store.lock:
            node, why = self.schedule(pod)
            if node is None:
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": why}]
                self.store.put(pod)
                return False
            pod["spec"]["nodeName"] = node
            pod["status"]["phase"] = "Running"
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]
            self.store.put(pod)
            return True

    def run_pod(self, pod, extra_env=None):
        """Schedules the pod and starts its container as a process (None when it stays
        Pending). A Secret the container's env names that does not exist holds the
        container in CreateContainerConfigError until it does, as the kubelet does."""
        if not self.place(pod):
            return None
        while True:
            env, missing = self.pod_env(pod, extra_env)
            if not missing:
                break
            with self.store.lock:
                pod["status"]["containerStatuses"] = [{
                    "name": pod["spec"]["containers"][0]["name"], "ready": False, "restartCount": 0,
                    "image": pod["spec"]["containers"][0].get("image", ""), "imageID": "",
                    "state": {"waiting": {"reason": "CreateContainerConfigError", "message": missing}}}]
                self.store.put(pod)
            time.sleep(0.3)
        try:
            return self.start(pod, env)
        except OSError as e:  # the container's command could not start
            with open(os.path.join(self.root, pod["metadata"]["name"], "log"), "a") as f:
                f.write("cannot start %s: %s\n" % (pod["spec"]["containers"][0].get("command"), e))
            return subprocess.Popen(["false"])

    def finish_pod(self, pod, code):
        with self.store.lock:
            pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            pod["status"]["conditions"][1]["status"] = "False"
            pod["status"]["containerStatuses"] = [{"name": pod["spec"]["containers"][0]["name"], "ready": False,
                                                   "restartCount": 0, "image": pod["spec"]["containers"][0].get("image", ""),
                                                   "imageID": "", "state": {"terminated": {"exitCode": code}}}]
            self.store.put(pod)
            self.used.pop(pod["spec"]["nodeName"], None)

    def pod_env(self, pod, extra=None):
        """The first container's environment as the kubelet gives it: this process's
        own (PATH to shardtrain and kubectl), the container's env with the downward
        API and Secret references resolved, then `extra` (what a controller or the
        kubelet sets). Returns (env, "") or (None, why) when a Secret is missing. The
        test cluster has no DNS: a MASTER_ADDR naming a pod or Service stands for this
        host, 127.0.0.1, and so does a pod that sets none."""
        import base64
        c = pod["spec"]["containers"][0]
        ns = pod["metadata"]["namespace"]
        env = dict(os.environ)
        for e in c.get("env", []):
            env[e["name"]] = expand(e.get("value", ""), env)
            src = e.get("valueFrom") or {}
            ref = src.get("fieldRef", {}).get("fieldPath", "")
            m = re.match(r"metadata\.(labels|annotations)\['([^']+)'\]$", ref)
            if m:  # the downward API
                env[e["name"]] = pod["metadata"].get(m.group(1), {}).get(m.group(2), "")
            elif ref in ("metadata.name", "metadata.namespace", "spec.nodeName"):
                part, key = ref.split(".")
                env[e["name"]] = pod[part].get(key, "")
            if "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                with self.store.lock:
                    sec = self.store.objects.get(("v1", "secrets", ns, ref["name"]))
                if sec is None or ref["key"] not in (sec.get("data") or {}):
                    if ref.get("optional"):
                        continue
                    return None, ('secret "%s" not found' % ref["name"] if sec is None
                                  else "couldn't find key %s in Secret %s/%s" % (ref["key"], ns, ref["name"]))
                env[e["name"]] = base64.b64decode(sec["data"][ref["key"]]).decode()
        env.update(extra or {})
        addr = env.get("MASTER_ADDR", "")
        if not re.match(r"^[0-9.]+$", addr):
            env["MASTER_ADDR"] = "127.0.0.1"
        return env, ""

    def mount_volumes(self, pod):
        """The first container's volume mounts as directories under <kubelet>/<pod>/
        (a ConfigMap's keys written as files): {mountPath: local directory}."""
        c = pod["spec"]["containers"][0]
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        root = os.path.join(self.root, name)
        os.makedirs(root, exist_ok=True)
        mounts = {}
        for v in pod["spec"].get("volumes", []):
            for m in c.get("volumeMounts", []):
                if m["name"] != v["name"]:
                    continue
                local = os.path.join(root, m["mountPath"].lstrip("/"))
                os.makedirs(local, exist_ok=True)
                if "configMap" in v:
                    cm = self.store.objects.get(("v1", "configmaps", ns, v["configMap"]["name"]), {})
                    for k, text in (cm.get("data") or {}).items():
                        with open(os.path.join(local, k), "w") as f:
                            f.write(text)
                mounts[m["mountPath"]] = local
        return mounts

    def start(self, pod, env):
        c = pod["spec"]["containers"][0]
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        root = os.path.join(self.root, name)
        mounts = self.mount_volumes(pod)

        def local_path(a):
            return container_path(a, mounts)
        argv = [local_path(expand(a, env)) for a in (c.get("command", []) + c.get("args", []))]
        env["KUBE_TEST_POD_DIR"] = root
        cwd = local_path(c.get("workingDir", "/")) if c.get("workingDir") in mounts else root
        log = os.path.join(root, "log")
        self.store.logs[(ns, name)] = log
        out = open(log, "w")
        # Its own process group, as a container: stopping it stops what it started.
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                kill_group(p, signal.SIGTERM)  # `shardtrain launch` passes it on to its ranks
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(p, signal.SIGKILL)


def kill_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def container_path(a, mounts):
    """A path as the container sees it, here: under a volume's directory, or a file
    the image installs (from this checkout)."""
    for mp, loc in mounts.items():
        if a == mp or a.startswith(mp + "/"):
            return loc + a[len(mp):]
    for img, loc in IMAGE_FILES.items():
        a = a.replace(img, loc)
    return a


def suffix(n=5):
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def expand(text, env):
    """$(VAR) from env as Kubernetes expands command, args and env values; $$ is a
    literal $; an unknown $(VAR) stays as it is."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def matches(o, label_selector, field_selector):
    labels = o.get("metadata", {}).get("labels", {}) or {}
    for term in filter(None, (label_selector or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    for term in filter(None, (field_selector or "").split(",")):
        k, v = term.split("=", 1)
        cur = o
        for part in k.split("."):
            cur = cur.get(part, {}) if isinstance(cur, dict) else {}
        if cur != v:
            return False
    return True


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store = None
    kubelet = None
    operators = None

    def log_message(self, *args):
        pass

    def reply(self, code, body, content_type="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def route(self):
        """(gv, plural, namespace, name, sub) of the request path, or None."""
        u = urllib.parse.urlparse(self.path)
        parts = [p for p in u.path.split("/") if p]
        q = dict(urllib.parse.parse_qsl(u.query))
        if parts[:1] == ["api"]:
            gv, rest = "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            gv, rest = parts[1] + "/" + parts[2], parts[3:]
        else:
            return None, q
        ns = ""
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        if not rest:
            return None, q
        plural, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
        if rest[0] == "namespaces" and len(rest) >= 2 and not ns:
            plural, name = "namespaces", rest[1]
        return (gv, plural, ns, name, sub), q

    def discovery(self, path):
        if path == "/version":
            return {"major": "1", "minor": "36", "gitVersion": "v1.36.2-shardtrain-test", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if path == "/apis":
            groups = []
            for gv in RESOURCES:
                if "/" in gv:
                    g, v = gv.split("/")
                    groups.append({"name": g, "versions": [{"groupVersion": gv, "version": v}],
                                   "preferredVersion": {"groupVersion": gv, "version": v}})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        for gv, rs in RESOURCES.items():
            if path == ("/api/" + gv if gv == "v1" else "/apis/" + gv):
                res = []
                for plural, kind, ns in rs:
                    res.append({"name": plural, "singularName": kind.lower(), "namespaced": ns, "kind": kind,
                                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                                "shortNames": SHORT_NAMES.get(plural, [])})
                    if plural == "pods":
                        res.append({"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod",
                                    "verbs": ["get"]})
                return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": res}
        # OpenAPI v3, as much as kubectl reads: per group-version, the PATCH operation of
        # each kind with its fieldValidation parameter (so kubectl leaves validation to
        # the server, which validates against the published schemas).
        if path == "/openapi/v3":
            return {"paths": {(("api/" if gv == "v1" else "apis/") + gv): {
                "serverRelativeURL": "/openapi/v3/" + ("api/" if gv == "v1" else "apis/") + gv + "?hash=0"}
                for gv in RESOURCES}}
        for gv, rs in RESOURCES.items():
            if path == "/openapi/v3/" + ("api/" if gv == "v1" else "apis/") + gv:
                g, v = (gv.split("/") if "/" in gv else ("", gv))
                paths = {}
                for plural, kind, ns in rs:
                    base = "/" + ("api/" if gv == "v1" else "apis/") + gv + ("/namespaces/{namespace}" if ns else "")
                    gvk = {"group": g, "version": v, "kind": kind}
                    params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                              {"name": "fieldManager", "in": "query", "schema": {"type": "string"}}]
                    paths[base + "/" + plural + "/{name}"] = {
                        "get": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "get"},
                        "patch": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "patch",
                                  "parameters": params},
                        "parameters": params}
                    paths[base + "/" + plural] = {
                        "post": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "post",
                                 "parameters": params}}
                return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.36.2"}, "paths": paths,
                        "components": {"schemas": {}}}
        return None

    def do_GET(self):
        self.log_request_line()
        path = urllib.parse.urlparse(self.path).path.rstrip("/")
        d = self.discovery(path)
        if d is not None:
            return self.reply(200, d)
        r, q = self.route()
        if r is None or (r[0], r[1]) not in KIND_OF:
            return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
        gv, plural, ns, name, sub = r
        kind, _ = KIND_OF[(gv, plural)]
        with self.store.lock:
            if name and sub == "log":
                text = self.store.logs.get((ns, name))
                if text is not None and os.path.isfile(text):
                    text = open(text).read()
                if text is None:
                    return self.reply(404, status(404, "NotFound", 'pods "%s" not found' % name))
                return self.reply(200, text, "text/plain")
            if name:
                o = self.store.objects.get((gv, plural, ns, name))
                if o is None:
                    return self.reply(404, status(404, "NotFound", '%s "%s" not found' % (plural, name)))
                return self.reply(200, o)
            items = [o for (g, p, n, _), o in sorted(self.store.objects.items())
                     if g == gv and p == plural and (not ns or n == ns)
                     and matches(o, q.get("labelSelector"), q.get("fieldSelector"))]
            if q.get("watch") not in ("true", "1"):
                return self.reply(200, {"kind": kind + "List", "apiVersion": gv,
                                        "metadata": {"resourceVersion": str(self.store.rv)}, "items": items})
        return self.watch(gv, plural, ns, q, items)

    def watch(self, gv, plural, ns, q, initial):
        """A watch: the objects as ADDED events (when asked for initial events or from
        resource version 0), then MODIFIED / ADDED / DELETED as they change, until
        timeoutSeconds (at most 60 s) or the client goes."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(event):
            data = (json.dumps(event) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        seen = {}
        since = int(q.get("resourceVersion") or 0)
        initial_events = q.get("sendInitialEvents") == "true" or since == 0
        for o in initial:
            seen[o["metadata"]["name"]] = o["metadata"]["resourceVersion"]
        try:
            for o in initial:
                if initial_events or int(o["metadata"]["resourceVersion"]) > since:
                    send({"type": "ADDED", "object": o})
            if q.get("sendInitialEvents") == "true":
                send({"type": "BOOKMARK", "object": {"kind": initial[0]["kind"] if initial else "Status",
                                                     "apiVersion": gv, "metadata": {
                                                         "resourceVersion": str(self.store.rv),
                                                         "annotations": {"k8s.io/initial-events-end": "true"}}}})
            deadline = time.time() + min(float(q.get("timeoutSeconds", 60)), 60)
            while time.time() < deadline:
                time.sleep(0.2)
                with self.store.lock:
                    now = {n: o for (g, p, nsx, n), o in self.store.objects.items()
                           if g == gv and p == plural and (not ns or nsx == ns)
                           and matches(o, q.get("labelSelector"), q.get("fieldSelector"))}
                for n, o in now.items():
                    if seen.get(n) != o["metadata"]["resourceVersion"]:
                        send({"type": "MODIFIED" if n in seen else "ADDED", "object": o})
                        seen[n] = o["metadata"]["resourceVersion"]
                for n in [n for n in seen if n not in now]:
                    send({"type": "DELETED", "object": {"kind": "Status", "metadata": {"name": n}}})
                    del seen[n]
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def body_object(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        ctype = self.headers.get("Content-Type", "").split(";")[0]
        if ctype == "application/vnd.kubernetes.protobuf":
            return decode_protobuf(body)
        return json.loads(body) if ctype == "application/json" or not yaml else yaml.safe_load(body.decode())

    def do_POST(self):  # create
        self.log_request_line()
        o = self.body_object()
        r, q = self.route()
        if r is None or (r[0], r[1]) not in KIND_OF:
            return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
        gv, plural, ns, _, _ = r
        name = o.get("metadata", {}).get("name", "")
        causes = self.store.validate(o)
        if causes:
            return self.reply(422, status(422, "Invalid", '%s "%s" is invalid' % (o.get("kind"), name), causes, name,
                                          o.get("kind")))
        if ns:
            o["metadata"]["namespace"] = ns
        with self.store.lock:
            if (gv, plural, ns, name) in self.store.objects:
                return self.reply(409, status(409, "AlreadyExists", '%s "%s" already exists' % (plural, name)))
            if q.get("dryRun") != "All":
                self.store.put(o)
        if self.operators and q.get("dryRun") != "All":
            self.operators.created(o)
        return self.reply(201, o)

    def do_PUT(self):  # replace
        self.log_request_line()
        o = self.body_object()
        r, _ = self.route()
        if r is None or (r[0], r[1]) not in KIND_OF:
            return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
        gv, plural, ns, name, _ = r
        with self.store.lock:
            if (gv, plural, ns, name) not in self.store.objects:
                return self.reply(404, status(404, "NotFound", '%s "%s" not found' % (plural, name)))
            if ns:
                o["metadata"]["namespace"] = ns
            self.store.put(o)
        return self.reply(200, o)

    def do_PATCH(self):
        self.log_request_line()
        r, q = self.route()
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        if r is None or (r[0], r[1]) not in KIND_OF:
            return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
        gv, plural, ns, name, _ = r
        if self.headers.get("Content-Type", "").split(";")[0] != "application/apply-patch+yaml":
            return self.reply(415, status(415, "UnsupportedMediaType", "only server-side apply is supported here"))
        o = yaml.safe_load(body) if yaml else json.loads(body)
        causes = self.store.validate(o)
        if causes:
            msg = '%s "%s" is invalid: %s' % (o.get("kind"), name, "; ".join(c["field"] + ": " + c["message"]
                                                                            for c in causes))
            return self.reply(422, status(422, "Invalid", msg, causes, name, o.get("kind")))
        if ns:
            o.setdefault("metadata", {})["namespace"] = ns
        with self.store.lock:
            old = self.store.objects.get((gv, plural, ns, name))
            code = 200 if old else 201
            if old:
                o["metadata"]["uid"] = old["metadata"]["uid"]
                if "status" in old:
                    o.setdefault("status", old["status"])
            self.store.put(o, old)
        if self.operators and code == 201 and q.get("dryRun") != "All":
            self.operators.created(o)
        return self.reply(code, o)

    def log_request_line(self):
        if os.environ.get("KUBE_TEST_SERVER_TRACE"):
            sys.stderr.write("%s %s %s\n" % (self.command, self.path, self.headers.get("Content-Type", "")))

    def do_DELETE(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))  # DeleteOptions
        r, _ = self.route()
        if r is None:
            return self.reply(404, status(404, "NotFound", "not found"))
        gv, plural, ns, name, _ = r
        with self.store.lock:
            o = self.store.objects.pop((gv, plural, ns, name), None)
        if o is None:
            return self.reply(404, status(404, "NotFound", '%s "%s" not found' % (plural, name)))
        return self.reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--fixtures")
    ap.add_argument("--schemas")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--kubelet", help="run Indexed Jobs' pods as processes, their files under this directory")
    a = ap.parse_args()
    Handler.store = Store(a.fixtures, a.schemas)
    if a.kubelet:
        Handler.kubelet = Kubelet(Handler.store, a.kubelet)
        sys.path.insert(0, HERE)
        from kube_test_operators import Operators
        Handler.operators = Operators(Handler.store, Handler.kubelet)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    port = srv.server_address[1]
    if a.kubeconfig:
        with open(a.kubeconfig, "w") as f:
            f.write("apiVersion: v1\nkind: Config\n"
                    "clusters: [{name: test, cluster: {server: 'http://127.0.0.1:%d'}}]\n"
                    "users: [{name: test, user: {}}]\n"
                    "contexts: [{name: test, context: {cluster: test, user: test}}]\n"
                    "current-context: test\n" % port)
    def stop(signum, frame):
        if Handler.kubelet:
            Handler.kubelet.stop()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready %d" % port, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
