"""A stand-in for the Ray API that src/deploy/ray_driver.py calls, for the kube test
server's RayClusters (tests/support/README.md): the cluster is the worker pods the
server's RayCluster controller described in $KUBE_TEST_RAY_CLUSTER. A remote task
runs in a process forked from the driver, with the environment and working
directory of the worker pod its placement-group bundle is on (a Ray worker inherits
the raylet's environment, which is its container's), plus the job's runtime_env
env_vars; ray.cancel interrupts it (KeyboardInterrupt), as Ray cancels a running
task. Only what the driver uses is here.
"""
import json
import os
import pickle
import signal
import time

from . import exceptions  # noqa: F401
from . import util  # noqa: F401

_cluster = None


def init(address=None, **_):
    global _cluster
    with open(os.environ["KUBE_TEST_RAY_CLUSTER"]) as f:
        _cluster = json.load(f)


def _nodes():
    if _cluster is None:
        raise exceptions.RayError("ray.init() was not called")
    return _cluster["nodes"]


def nodes():
    return [{"NodeID": n["pod"], "Alive": True, "NodeManagerAddress": n["ip"],
             "Resources": {"GPU": float(n["gpus"]), "CPU": 1.0}} for n in _nodes()]


class ObjectRef:
    def __init__(self, pid=None, fd=None, value=None):
        self.pid, self.fd, self.done, self.value, self.error = pid, fd, pid is None, value, None

    def _poll(self, block=False):
        if self.done:
            return True
        pid, _ = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        data = b""
        while True:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                break
            data += chunk
        os.close(self.fd)
        self.done = True
        kind, value = pickle.loads(data) if data else ("error", exceptions.RayError("the task's process died"))
        if kind == "ok":
            self.value = value
        else:
            self.error = value
        return True

    def __hash__(self):
        return id(self)


class _Never(ObjectRef):
    """A reference that never becomes ready (a placement group that cannot be placed)."""
    def __init__(self):
        super().__init__(value=None)
        self.done = False

    def _poll(self, block=False):
        if block:
            raise exceptions.RayError("this object never becomes ready")
        return False


def _run(fn, args, node):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task
        os.close(r)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if node is not None:
            env = dict(node["env"])
            runtime = json.loads(os.environ.get("KUBE_TEST_RAY_RUNTIME_ENV", "{}"))
            env.update({k: str(v) for k, v in (runtime.get("env_vars") or {}).items()})
            env["KUBE_TEST_RAY_NODE_IP"] = node["ip"]
            os.environ.clear()
            os.environ.update(env)
            os.chdir(node["cwd"])
            args = _paths(args, node.get("mounts") or {})
        try:
            out = ("ok", fn(*args))
        except KeyboardInterrupt:
            out = ("error", exceptions.TaskCancelledError("the task was cancelled"))
        except BaseException as e:  # noqa: BLE001
            out = ("error", exceptions.RayTaskError("%s: %s" % (type(e).__name__, e)))
        os.write(w, pickle.dumps(out))
        os._exit(0)
    os.close(w)
    return ObjectRef(pid, r)


def _paths(v, mounts):
    """The task's arguments with paths inside the worker pod's volumes pointed at
    their directories here (as the server's kubelet does for a container's args)."""
    if isinstance(v, (list, tuple)):
        return type(v)(_paths(x, mounts) for x in v)
    if isinstance(v, str):
        for mp, loc in mounts.items():
            if v == mp or v.startswith(mp + "/"):
                return loc + v[len(mp):]
    return v


class _RemoteFunction:
    def __init__(self, fn, strategy=None):
        self.fn, self.strategy = fn, strategy

    def options(self, scheduling_strategy=None, **_):
        return _RemoteFunction(self.fn, scheduling_strategy)

    def remote(self, *args):
        node = None
        if self.strategy is not None:
            node = _nodes()[self.strategy.placement_group.nodes[self.strategy.placement_group_bundle_index]]
        return _run(self.fn, args, node)


def remote(*args, **_):
    if len(args) == 1 and callable(args[0]):
        return _RemoteFunction(args[0])
    return lambda fn: _RemoteFunction(fn)


def get(refs):
    one = isinstance(refs, ObjectRef)
    out = []
    for ref in [refs] if one else refs:
        ref._poll(block=True)
        if ref.error is not None:
            raise ref.error
        out.append(ref.value)
    return out[0] if one else out


def wait(refs, num_returns=1, timeout=None):
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        ready = [r for r in refs if r._poll()]
        if len(ready) >= num_returns or (deadline is not None and time.monotonic() >= deadline):
            ready = ready[:num_returns]
            return ready, [r for r in refs if r not in ready]
        time.sleep(0.05)


def cancel(ref, **_):
    if not ref.done:
        try:
            os.kill(ref.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
