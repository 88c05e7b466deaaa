"""The operators the deploy engines need, as the kube test server runs them (with
--kubelet): KubeRay's RayCluster and RayJob controllers and the Kubeflow training
operator's PyTorchJob controller. Each drives the same objects and status fields as
the real one, in the same order; tests/support/README.md says where each behaviour
comes from upstream. Pods run through the server's Kubelet (scheduled onto the
fixture nodes, their container a local process).
"""
import json
import os
import random
import string
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))

POLL_S = 0.2


def suffix(n=5):
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Operators:
    def __init__(self, store, kubelet):
        self.store, self.kubelet = store, kubelet

    def created(self, o):
        """An object was created: start its controller, if it has one here."""
        kind = o.get("kind")
        target = {"RayCluster": self.ray_cluster, "RayJob": self.ray_job, "PyTorchJob": self.pytorch_job}.get(kind)
        if kind == "Job" and o.get("spec", {}).get("completionMode") == "Indexed":
            target = self.kubelet.run_job
        if target:
            threading.Thread(target=target, args=(o,), daemon=True).start()

    def update_status(self, o, **fields):
        """Updates the status of the stored object of o's UID (a re-apply stores a new
        copy), as the controller's status subresource write."""
        cur = self.current(o)
        if cur is None:
            return None
        with self.store.lock:
            cur.setdefault("status", {}).update(fields)
            self.store.put(cur, cur)
        return cur

    def current(self, o):
        """The stored object of o's name and UID, or None once it is gone or replaced."""
        md = o["metadata"]
        with self.store.lock:
            for x in self.store.objects.values():
                if x.get("kind") == o["kind"] and x["metadata"]["name"] == md["name"] \
                        and x["metadata"].get("namespace") == md.get("namespace") and x["metadata"]["uid"] == md["uid"]:
                    return x
        return None

    # ---- KubeRay: RayCluster ----------------------------------------------------------

    def ray_cluster(self, rc):
        """The head pod and each worker group's pods; once all run, state "ready" and
        the RayClusterProvisioned and HeadPodReady conditions. The pods run no process
        (`ray start --block` never ends); the cluster's description, for the Ray
        stand-in the RayJob's driver imports, goes to <kubelet>/<ns>.<name>.raycluster.json."""
        md, spec = rc["metadata"], rc["spec"]
        ns, name = md.get("namespace", "default"), md["name"]
        owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name, "uid": md["uid"]}
        self.update_status(rc, state="", desiredWorkerReplicas=sum(int(g.get("replicas", 0))
                                                                   for g in spec.get("workerGroupSpecs", [])),
                           readyWorkerReplicas=0, conditions=[
                               {"type": "RayClusterProvisioned", "status": "False", "reason": "RayClusterPodsProvisioning",
                                "message": "RayCluster Pods are being provisioned for first time"}])
        pods = []
        head = spec["headGroupSpec"]["template"]
        labels = dict(head.get("metadata", {}).get("labels", {}))
        labels.update({"ray.io/cluster": name, "ray.io/node-type": "head", "ray.io/group": "headgroup",
                       "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "kuberay-operator"})
        pods.append(("head", self.kubelet.new_pod(ns, "%s-head-%s" % (name, suffix()), labels, head["spec"], owner)))
        for g in spec.get("workerGroupSpecs", []):
            for _ in range(int(g.get("replicas", 0))):
                t = g["template"]
                labels = dict(t.get("metadata", {}).get("labels", {}))
                labels.update({"ray.io/cluster": name, "ray.io/node-type": "worker", "ray.io/group": g["groupName"],
                               "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "kuberay-operator"})
                pod = self.kubelet.new_pod(ns, "%s-%s-worker-%s" % (name, g["groupName"], suffix()), labels, t["spec"],
                                           owner)
                pod["gpus"] = float(g.get("rayStartParams", {}).get("num-gpus", "0"))
                pods.append(("worker", pod))
        placed = [self.kubelet.place(p) for _, p in pods]
        if not all(placed):
            return  # Pending pods: the cluster stays provisioning, as KubeRay's would
        nodes = []
        for role, pod in pods:
            gpus = pod.pop("gpus", 0)
            if role != "worker":
                continue
            while True:  # the container starts once the Secrets its env names exist
                env, missing = self.kubelet.pod_env(pod)
                if not missing:
                    break
                time.sleep(0.3)
            mounts = self.kubelet.mount_volumes(pod)
            c = pod["spec"]["containers"][0]
            workdir = mounts.get(c.get("workingDir", ""), os.path.join(self.kubelet.root, pod["metadata"]["name"]))
            nodes.append({"pod": pod["metadata"]["name"], "ip": "127.0.0.1", "gpus": gpus, "env": env, "cwd": workdir,
                          "mounts": mounts})
        with open(os.path.join(self.kubelet.root, "%s.%s.raycluster.json" % (ns, name)), "w") as f:
            json.dump({"nodes": nodes}, f)
        self.update_status(rc, state="ready", readyWorkerReplicas=len(nodes), availableWorkerReplicas=len(nodes),
                           head={"serviceName": name + "-head-svc"}, conditions=[
                               {"type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady"},
                               {"type": "RayClusterProvisioned", "status": "True",
                                "reason": "AllPodRunningAndReadyFirstTime",
                                "message": "All Ray Pods are ready for the first time"}])

    # ---- KubeRay: RayJob (submissionMode K8sJobMode, a clusterSelector) ---------------------

    def ray_job(self, rj):
        """Initializing (jobId and rayClusterName set) until the selected RayCluster is
        ready; then the submitter Job (the RayJob's name) whose pod runs `ray job
        submit ... -- <entrypoint>`, and Running; jobStatus as the Ray job reports it
        (PENDING, RUNNING, SUCCEEDED, FAILED, with its message); Complete, or Failed
        with reason AppFailed, once the Ray job is terminal and the submitter Job has
        finished; Failed with reason SubmissionFailed when the submitter Job fails
        without a terminal Ray job."""
        md, spec = rj["metadata"], rj["spec"]
        ns, name = md.get("namespace", "default"), md["name"]
        cluster = (spec.get("clusterSelector") or {}).get("ray.io/cluster", name + "-raycluster")
        job_id = spec.get("jobId") or "%s-%s" % (name, suffix(5))
        self.update_status(rj, jobDeploymentStatus="Initializing", jobId=job_id, rayClusterName=cluster,
                           startTime=now())
        while True:  # the RayCluster ready
            if self.current(rj) is None:
                return
            with self.store.lock:
                rc = self.store.objects.get(("ray.io/v1", "rayclusters", ns, cluster))
            if rc and rc.get("status", {}).get("state") == "ready":
                break
            time.sleep(POLL_S)
        description = os.path.join(self.kubelet.root, "%s.%s.raycluster.json" % (ns, cluster))
        dashboard = "http://%s-head-svc.%s.svc.cluster.local:8265" % (cluster, ns)
        jobs_dir = os.path.join(self.kubelet.root, "ray-jobs")
        os.makedirs(jobs_dir, exist_ok=True)
        status_file = os.path.join(jobs_dir, job_id + ".json")
        head = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        command = ["ray", "job", "submit", "--address", dashboard, "--submission-id", job_id]
        if spec.get("runtimeEnvYAML"):
            command += ["--runtime-env-json", json.dumps(_runtime_env(spec["runtimeEnvYAML"]))]
        command += ["--", spec["entrypoint"]]
        submitter = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "uid": "",
                         "labels": {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": name,
                                    "app.kubernetes.io/created-by": "kuberay-operator"},
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": name,
                                              "uid": md["uid"], "controller": True}]},
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "ray-job-submitter", "image": head.get("image", ""), "command": command,
                                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"},
                                        # Where the stand-ins find the cluster and report the job.
                                        {"name": "KUBE_TEST_RAY_CLUSTER", "value": description},
                                        {"name": "KUBE_TEST_RAY_JOBS", "value": jobs_dir},
                                        {"name": "PATH", "value": os.path.join(HERE, "ray_stub", "bin") + ":" +
                                         os.environ.get("PATH", "")},
                                        {"name": "PYTHONPATH", "value": os.path.join(HERE, "ray_stub")}],
                                "resources": {"requests": {"cpu": "500m", "memory": "200Mi"},
                                              "limits": {"cpu": "1", "memory": "1Gi"}}}]}}}}
        submitter["metadata"]["uid"] = str(uuid.uuid4())
        with self.store.lock:
            self.store.put(submitter)
        self.update_status(rj, jobDeploymentStatus="Running", dashboardURL=dashboard.split("//", 1)[1])
        done = threading.Event()

        def submit():
            self.kubelet.run_job(submitter)
            done.set()
        threading.Thread(target=submit, daemon=True).start()
        while True:
            time.sleep(POLL_S)
            if self.current(rj) is None:
                return
            info = {}
            if os.path.exists(status_file):
                try:
                    info = json.load(open(status_file))
                except ValueError:
                    info = {}
            status = info.get("status", "")
            finished = done.is_set()
            fields = {"jobStatus": status, "message": info.get("message", "")}
            if status in ("SUCCEEDED", "FAILED", "STOPPED") and finished:
                fields.update(jobDeploymentStatus="Failed" if status == "FAILED" else "Complete", endTime=now())
                if status == "FAILED":
                    fields["reason"] = "AppFailed"
                    fields["failed"] = 1
                else:
                    fields["succeeded"] = 1
                self.update_status(rj, **fields)
                return
            if finished and submitter.get("status", {}).get("failed"):
                fields.update(jobDeploymentStatus="Failed", reason="SubmissionFailed", endTime=now(), failed=1,
                              message="Job submission has failed. Reason: the submitter Job %s failed" % name)
                self.update_status(rj, **fields)
                return
            cur = self.current(rj) or {}
            if cur.get("status", {}).get("jobStatus") != status or cur["status"].get("message") != fields["message"]:
                self.update_status(rj, **fields)

    # ---- Kubeflow training operator: PyTorchJob -------------------------------------------

    def pytorch_job(self, pj):
        """Condition Created; one pod per replica, <name>-master-0 and <name>-worker-<i>,
        labelled with the job name, replica type and index, with the operator's env
        (MASTER_ADDR the Master's name, MASTER_PORT from the container port named
        pytorchjob-port, else 23456, WORLD_SIZE, RANK, PET_NNODES, PET_NODE_RANK,
        PET_NPROC_PER_NODE, PYTHONUNBUFFERED); condition Running once they run;
        Succeeded when the Master succeeds, Failed when a replica fails (restartPolicy
        Never), with replicaStatuses counting active, succeeded and failed pods."""
        md, spec = pj["metadata"], pj["spec"]
        ns, name = md.get("namespace", "default"), md["name"]
        replicas = spec["pytorchReplicaSpecs"]
        conditions = [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                       "message": "PyTorchJob %s is created." % name, "lastTransitionTime": now()}]
        self.update_status(pj, conditions=list(conditions), startTime=now())
        total = sum(int(r.get("replicas", 1)) for r in replicas.values())
        port = 23456
        for c in replicas.get("Master", {}).get("template", {}).get("spec", {}).get("containers", []):
            if c.get("name") == "pytorch":
                for p in c.get("ports", []):
                    if p.get("name") == "pytorchjob-port":
                        port = p["containerPort"]
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": md["uid"]}
        started = []
        for rtype in ("Master", "Worker"):
            r = replicas.get(rtype)
            if not r:
                continue
            for i in range(int(r.get("replicas", 1))):
                rank = i if rtype == "Master" else i + 1
                t = r["template"]
                labels = dict(t.get("metadata", {}).get("labels", {}))
                labels.update({"training.kubeflow.org/job-name": name, "training.kubeflow.org/operator-name":
                               "pytorchjob-controller", "training.kubeflow.org/replica-type": rtype.lower(),
                               "training.kubeflow.org/replica-index": str(i)})
                if rtype == "Master":
                    labels["training.kubeflow.org/job-role"] = "master"
                pod = self.kubelet.new_pod(ns, "%s-%s-%d" % (name, rtype.lower(), i), labels, t["spec"], owner)
                env = {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": name + "-master-0", "MASTER_PORT": str(port),
                       "WORLD_SIZE": str(total), "RANK": str(rank), "PET_NNODES": str(total),
                       "PET_NODE_RANK": str(rank)}
                if spec.get("nprocPerNode"):
                    env["PET_NPROC_PER_NODE"] = str(spec["nprocPerNode"])
                # The operator adds its variables to the container's env, where $(VAR)
                # in the command finds them.
                c = pod["spec"]["containers"][0]
                c["env"] = [{"name": k, "value": v} for k, v in env.items()] + c.get("env", [])
                started.append((rtype, pod, self.kubelet.run_pod(pod)))
        if any(proc is None for _, _, proc in started):
            return  # a Pending pod: the job stays Created, as the operator's would
        conditions.append({"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                           "message": "PyTorchJob %s/%s is running." % (ns, name), "lastTransitionTime": now()})
        counts = {t: {"active": 0, "succeeded": 0, "failed": 0} for t, _, _ in started}
        for t, _, _ in started:
            counts[t]["active"] += 1
        self.update_status(pj, conditions=list(conditions), replicaStatuses=counts)
        pending = list(started)
        ended = False
        while pending:
            time.sleep(POLL_S)
            for item in list(pending):
                t, pod, proc = item
                code = proc.poll()
                if code is None:
                    continue
                pending.remove(item)
                self.kubelet.finish_pod(pod, code)
                counts[t]["active"] -= 1
                counts[t]["succeeded" if code == 0 else "failed"] += 1
                end = None
                if ended:  # the job's condition is set; its other pods end as they do
                    self.update_status(pj, replicaStatuses=counts)
                    continue
                if code != 0:
                    end = ("Failed", "PyTorchJobFailed", "PyTorchJob %s/%s has failed because %d %s replica(s) failed."
                           % (ns, name, counts[t]["failed"], t))
                elif t == "Master":
                    end = ("Succeeded", "PyTorchJobSucceeded", "PyTorchJob %s/%s successfully completed." % (ns, name))
                if end:
                    conditions[-1]["status"] = "False"
                    conditions.append({"type": end[0], "status": "True", "reason": end[1], "message": end[2],
                                       "lastTransitionTime": now()})
                    self.update_status(pj, conditions=list(conditions), replicaStatuses=counts, completionTime=now())
                    ended = True
                    continue
                self.update_status(pj, replicaStatuses=counts)


def _runtime_env(text):
    try:
        import yaml
        return yaml.safe_load(text) or {}
    except ImportError:  # pragma: no cover
        return {}
