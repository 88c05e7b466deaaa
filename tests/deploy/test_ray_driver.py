#!/usr/bin/env python3
"""Tests of src/deploy/ray_driver.py's logic; Ray is not needed. From the repository root:
    python3 -m unittest discover -s tests/deploy -p 'test_ray_driver.py'
or  python3 tests/deploy/test_ray_driver.py"""
import contextlib
import importlib
import io
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "src", "deploy")))

import ray_driver as rd  # noqa: E402


def parse_error(argv):
    """parse_args(argv)'s exit code and stderr; fails the test when it does not exit."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rd.parse_args(argv)
        except SystemExit as e:
            return e.code, err.getvalue()
    raise AssertionError(f"parse_args({argv}) did not exit")


def node(addr, gpus=None, alive=True):
    resources = {"CPU": 16.0, "memory": 1e11}
    if gpus is not None:
        resources["GPU"] = float(gpus)
    return {"Alive": alive, "NodeManagerAddress": addr, "Resources": resources}


class ParseArgs(unittest.TestCase):
    def test_defaults(self):
        o = rd.parse_args(["--nnodes", "2", "--nproc-per-node", "4", "--",
                           "train", "--config", "/etc/shardtrain/config.toml", "--expect-transport", "efa"])
        self.assertEqual((o.nnodes, o.nproc_per_node), (2, 4))
        self.assertEqual(o.master_port, 29500)
        self.assertEqual(o.binary, "shardtrain")
        self.assertEqual(o.wait_s, 600)
        self.assertIsNone(o.cpus_per_node)
        self.assertEqual(o.workdir, "/workspace")
        self.assertEqual(o.args, ["train", "--config", "/etc/shardtrain/config.toml", "--expect-transport", "efa"])

    def test_every_option(self):
        o = rd.parse_args(["--nnodes", "3", "--nproc-per-node", "8", "--master-port", "1234",
                           "--binary", "/opt/shardtrain/bin/shardtrain", "--wait-s", "30",
                           "--cpus-per-node", "12", "--", "nccl-check"])
        self.assertEqual((o.nnodes, o.nproc_per_node, o.master_port), (3, 8, 1234))
        self.assertEqual(o.binary, "/opt/shardtrain/bin/shardtrain")
        self.assertEqual((o.wait_s, o.cpus_per_node), (30, 12))
        self.assertEqual(o.args, ["nccl-check"])

    def test_only_the_first_separator_splits(self):
        o = rd.parse_args(["--nnodes", "1", "--nproc-per-node", "1", "--", "x", "--", "--nnodes", "5"])
        self.assertEqual(o.nnodes, 1)
        self.assertEqual(o.args, ["x", "--", "--nnodes", "5"])

    def test_port_bounds_accepted(self):
        for port in ("1", "65535"):
            o = rd.parse_args(["--nnodes", "1", "--nproc-per-node", "1", "--master-port", port, "--", "train"])
            self.assertEqual(o.master_port, int(port))

    def test_errors_exit_2_and_name_the_option(self):
        base = ["--nnodes", "2", "--nproc-per-node", "4"]
        cases = [
            (["--nnodes", "0", "--nproc-per-node", "4", "--", "train"], "--nnodes"),
            (["--nnodes", "-1", "--nproc-per-node", "4", "--", "train"], "--nnodes"),
            (["--nnodes", "two", "--nproc-per-node", "4", "--", "train"], "--nnodes"),
            (["--nproc-per-node", "4", "--", "train"], "--nnodes"),
            (["--nnodes", "2", "--nproc-per-node", "0", "--", "train"], "--nproc-per-node"),
            (["--nnodes", "2", "--", "train"], "--nproc-per-node"),
            (base + ["--master-port", "0", "--", "train"], "--master-port"),
            (base + ["--master-port", "65536", "--", "train"], "--master-port"),
            (base + ["--master-port", "x", "--", "train"], "--master-port"),
            (base + ["--wait-s", "-1", "--", "train"], "--wait-s"),
            (base + ["--wait-s", "nan", "--", "train"], "--wait-s"),
            (base + ["--cpus-per-node", "-2", "--", "train"], "--cpus-per-node"),
            (base + ["--binary", "", "--", "train"], "--binary"),
            (base + ["--workdir", "runs", "--", "train"], "--workdir"),
            (base + ["--bogus", "1", "--", "train"], "--bogus"),
            (base, "--"),
            (base + ["--"], "--"),
            (base + ["train", "--config", "x.toml"], "train"),
        ]
        for argv, option in cases:
            with self.subTest(argv=argv):
                code, err = parse_error(argv)
                self.assertEqual(code, 2)
                self.assertIn(option, err)
                self.assertIn("error", err)

    def test_missing_arguments_message(self):
        _, err = parse_error(["--nnodes", "2", "--nproc-per-node", "4", "--"])
        self.assertIn("after `--`", err)


class NodeCommand(unittest.TestCase):
    ARGS = ["train", "--config", "/etc/shardtrain/config.toml", "--expect-transport", "efa"]

    def test_node_0_of_2(self):
        self.assertEqual(
            rd.node_command("shardtrain", 2, 4, 0, "10.0.0.5", 29500, self.ARGS),
            ["shardtrain", "launch", "--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "0",
             "--master-addr", "10.0.0.5", "--master-port", "29500", "--",
             "train", "--config", "/etc/shardtrain/config.toml", "--expect-transport", "efa"])

    def test_node_1_of_2(self):
        self.assertEqual(
            rd.node_command("/opt/bin/shardtrain", 2, 8, 1, "10.0.0.5", 1234, self.ARGS),
            ["/opt/bin/shardtrain", "launch", "--nproc-per-node", "8", "--nnodes", "2", "--node-rank", "1",
             "--master-addr", "10.0.0.5", "--master-port", "1234", "--",
             "train", "--config", "/etc/shardtrain/config.toml", "--expect-transport", "efa"])

    def test_all_strings_and_args_not_shared(self):
        args = list(self.ARGS)
        cmd = rd.node_command("shardtrain", 2, 4, 1, "10.0.0.5", 29500, args)
        self.assertTrue(all(isinstance(a, str) for a in cmd))
        cmd.append("--extra")
        self.assertEqual(args, self.ARGS)


class ReadyNodes(unittest.TestCase):
    def test_picks_alive_gpu_nodes_sorted(self):
        nodes = [
            node("10.0.0.20", gpus=4),
            node("10.0.0.3", gpus=None),            # the head: CPU only, no GPU key
            node("10.0.0.9", gpus=4, alive=False),  # dead
            node("10.0.0.7", gpus=2),               # too few GPUs
            node("10.0.0.4", gpus=8),               # more than enough
            node("10.0.0.11", gpus=0),              # GPU key at 0
        ]
        got = [n["NodeManagerAddress"] for n in rd.ready_nodes(nodes, 4)]
        self.assertEqual(got, ["10.0.0.4", "10.0.0.20"])  # numeric order, not "10.0.0.20" < "10.0.0.4"

    def test_order_does_not_depend_on_input_order(self):
        nodes = [node(f"192.168.1.{i}", gpus=1) for i in (30, 4, 100, 12)]
        want = ["192.168.1.4", "192.168.1.12", "192.168.1.30", "192.168.1.100"]
        self.assertEqual([n["NodeManagerAddress"] for n in rd.ready_nodes(nodes, 1)], want)
        self.assertEqual([n["NodeManagerAddress"] for n in rd.ready_nodes(list(reversed(nodes)), 1)], want)

    def test_hostnames_sort_after_ips(self):
        nodes = [node("worker-b", gpus=1), node("10.0.0.2", gpus=1), node("worker-a", gpus=1)]
        self.assertEqual([n["NodeManagerAddress"] for n in rd.ready_nodes(nodes, 1)],
                         ["10.0.0.2", "worker-a", "worker-b"])

    def test_returns_the_node_dicts(self):
        n = node("10.0.0.1", gpus=4)
        self.assertIs(rd.ready_nodes([n], 4)[0], n)

    def test_none_ready(self):
        self.assertEqual(rd.ready_nodes([], 1), [])
        self.assertEqual(rd.ready_nodes([node("10.0.0.1", gpus=None), node("10.0.0.2", gpus=8, alive=False),
                                         {"Alive": True, "NodeManagerAddress": "10.0.0.3"}], 1), [])


class Bundles(unittest.TestCase):
    def test_gpu_only(self):
        self.assertEqual(rd.bundles(2, 4, None), [{"GPU": 4}, {"GPU": 4}])
        self.assertEqual(rd.bundles(3, 8, 0), [{"GPU": 8}] * 3)
        self.assertEqual(rd.bundles(1, 1), [{"GPU": 1}])

    def test_with_cpu(self):
        self.assertEqual(rd.bundles(2, 4, 16), [{"GPU": 4, "CPU": 16}, {"GPU": 4, "CPU": 16}])

    def test_bundles_are_separate_dicts(self):
        b = rd.bundles(2, 4, 16)
        b[0]["GPU"] = 99
        self.assertEqual(b[1]["GPU"], 4)


class Summarize(unittest.TestCase):
    def test_all_success(self):
        code, msg = rd.summarize([(0, "10.0.0.1", 0), (1, "10.0.0.2", 0)])
        self.assertEqual(code, 0)
        self.assertIn("2", msg)
        self.assertNotIn("\n", msg)

    def test_one_failure(self):
        code, msg = rd.summarize([(0, "10.0.0.1", 0), (1, "10.0.0.2", 3)])
        self.assertEqual(code, 3)
        self.assertIn("node 1", msg)
        self.assertIn("10.0.0.2", msg)
        self.assertIn("3", msg)
        self.assertNotIn("node 0", msg)
        self.assertNotIn("\n", msg)

    def test_several_failures_name_each_first_code_wins(self):
        results = [(2, "10.0.0.3", 7), (0, "10.0.0.1", 0), (1, "10.0.0.2", 143), (3, "10.0.0.4", "cancelled")]
        code, msg = rd.summarize(results)
        self.assertEqual(code, 7)
        for part in ("node 2 (10.0.0.3)", "exit code 7", "node 1 (10.0.0.2)", "exit code 143",
                     "node 3 (10.0.0.4)", "cancelled"):
            self.assertIn(part, msg)
        self.assertNotIn("node 0", msg)
        self.assertLess(msg.index("node 2"), msg.index("node 1"))
        self.assertNotIn("\n", msg)

    def test_codes_outside_1_to_255_give_1(self):
        for bad in (-9, 256, 1000, None, "task error: boom", 2.0, True):
            with self.subTest(code=bad):
                code, msg = rd.summarize([(0, "10.0.0.1", bad), (1, "10.0.0.2", 4)])
                self.assertEqual(code, 1)
                self.assertIn("node 0 (10.0.0.1)", msg)
                self.assertIn("node 1 (10.0.0.2)", msg)

    def test_negative_code_names_the_signal(self):
        code, msg = rd.summarize([(1, "10.0.0.2", -9)])
        self.assertEqual(code, 1)
        self.assertIn("-9", msg)
        self.assertIn("signal 9", msg)

    def test_255_kept(self):
        self.assertEqual(rd.summarize([(0, "a", 255)])[0], 255)
        self.assertEqual(rd.summarize([(0, "a", 1)])[0], 1)

    def test_no_results_fail(self):
        self.assertEqual(rd.summarize([])[0], 1)


class Prefix(unittest.TestCase):
    def test_prefix(self):
        self.assertEqual(rd.prefix_line(0, "step 1 loss 2.5"), "[node 0] step 1 loss 2.5")
        self.assertEqual(rd.prefix_line(3, "[rank 24] ready\n"), "[node 3] [rank 24] ready")
        self.assertEqual(rd.prefix_line(1, "crlf\r\n"), "[node 1] crlf")
        self.assertEqual(rd.prefix_line(1, "\n"), "[node 1] ")
        self.assertEqual(rd.prefix_line(2, b"bytes \xff\n"), "[node 2] bytes \ufffd")

    def test_inner_whitespace_kept(self):
        self.assertEqual(rd.prefix_line(0, "  indented  \n"), "[node 0]   indented  ")


class RunCommand(unittest.TestCase):
    def test_streams_both_streams_prefixed_and_returns_code(self):
        out = io.StringIO()
        code = rd.run_command(1, [sys.executable, "-c",
                                  "import sys; print('a'); sys.stdout.flush(); "
                                  "print('b', file=sys.stderr); sys.exit(3)"], out)
        self.assertEqual(code, 3)
        self.assertEqual(out.getvalue().splitlines(), ["[node 1] a", "[node 1] b"])

    def test_runs_in_the_given_directory(self):
        out = io.StringIO()
        with tempfile.TemporaryDirectory() as d:
            code = rd.run_command(0, [sys.executable, "-c", "import os; print(os.getcwd())"], out, cwd=d)
            self.assertEqual(code, 0)
            self.assertEqual(out.getvalue().splitlines(), ["[node 0] " + os.path.realpath(d)])

    def test_missing_binary_is_127(self):
        out = io.StringIO()
        self.assertEqual(rd.run_command(0, ["/nonexistent/shardtrain", "launch"], out), 127)
        self.assertTrue(out.getvalue().startswith("[node 0] cannot start /nonexistent/shardtrain"))


class Imports(unittest.TestCase):
    def test_import_does_not_import_ray(self):
        # Set aside the driver and any Ray modules, import the driver afresh, then put them back.
        saved = {k: sys.modules.pop(k) for k in list(sys.modules)
                 if k == "ray_driver" or k == "ray" or k.startswith("ray.")}
        try:
            self.assertNotIn("ray", sys.modules)
            importlib.import_module("ray_driver")
            self.assertNotIn("ray", sys.modules)
        finally:
            for k in [k for k in sys.modules if k == "ray_driver" or k == "ray" or k.startswith("ray.")]:
                del sys.modules[k]
            sys.modules.update(saved)

    def test_fresh_interpreter_import_does_not_import_ray(self):
        probe = ("import sys; sys.path.insert(0, sys.argv[1]); had = 'ray' in sys.modules; "
                 "import ray_driver; print(had, 'ray' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", probe, os.path.dirname(rd.__file__)],
                             capture_output=True, text=True, check=True).stdout
        self.assertEqual(out.split(), ["False", "False"])


if __name__ == "__main__":
    unittest.main()
