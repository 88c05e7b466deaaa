"""ray.util as the driver uses it: the node's IP inside a task."""
import os


def get_node_ip_address():
    return os.environ.get("KUBE_TEST_RAY_NODE_IP", "127.0.0.1")
