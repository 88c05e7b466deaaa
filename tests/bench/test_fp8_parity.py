"""bench/fp8_parity.py: the plain check against one bf16 run, the band of the bf16 runs
(--floor), and the exit status each gives. Standard library only."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "fp8_parity.py")


def curve(step):
    return 8.0 / (1 + 0.02 * step)


class Fp8Parity(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def run_dir(self, name, factor=lambda s: 1.0, steps=120):
        d = os.path.join(self.tmp.name, name)
        os.makedirs(d)
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"event": "start"}) + "\n")  # lines without a step are skipped
            for s in range(1, steps + 1):
                f.write(json.dumps({"step": s, "loss": curve(s) * factor(s), "tokens": s}) + "\n")
        return d

    def check(self, *args):
        p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
        return p.returncode, p.stdout

    def test_equal_curves_pass(self):
        a, b = self.run_dir("a"), self.run_dir("b")
        rc, out = self.check(a, b)
        self.assertEqual(rc, 0, out)
        self.assertIn("within 1.0% at every step after 50: yes", out)
        self.assertIn("mean |b-a|/a 0.000%", out)

    def test_a_step_over_the_tolerance_fails_and_is_named(self):
        a = self.run_dir("a")
        b = self.run_dir("b", lambda s: 1.02 if s == 77 else 1.0)
        rc, out = self.check(a, b)
        self.assertEqual(rc, 1, out)
        self.assertIn("NO (1 of 70 steps over: 77)", out)
        self.assertIn("worst 2.000% at step 77", out)

    def test_steps_up_to_skip_are_left_out(self):
        a = self.run_dir("a")
        b = self.run_dir("b", lambda s: 1.05 if s <= 50 else 1.0)
        self.assertEqual(self.check(a, b)[0], 0)
        self.assertEqual(self.check(a, b, "--skip", "40")[0], 1)

    def test_the_band_of_the_bf16_runs_passes_what_one_run_fails(self):
        # The second bf16 run sits 1.5% below the first over steps 60-90; b 2% below:
        # 2% from a, but 0.51% below the band's lower edge.
        a = self.run_dir("a")
        floor = self.run_dir("floor", lambda s: 0.985 if 60 <= s <= 90 else 1.0)
        b = self.run_dir("b", lambda s: 0.98 if 60 <= s <= 90 else 1.0)
        rc, out = self.check(a, b, "--floor", floor)
        self.assertEqual(rc, 0, out)
        self.assertIn("within 1.0% at every step after 50: NO (31 of 70 steps over", out)
        self.assertIn("floor " + floor + " against a: worst 1.500% at step", out)
        self.assertIn("31 of 70 steps over 1.0%", out)
        self.assertIn("b inside it at 39 of 70 steps, furthest outside 0.508%", out)
        self.assertIn("within 1.0% of the band at every step after 50: yes", out)

    def test_outside_the_band_fails(self):
        a = self.run_dir("a")
        floor = self.run_dir("floor", lambda s: 0.99)
        b = self.run_dir("b", lambda s: 1.03 if s in (100, 101) else 1.0)
        rc, out = self.check(a, b, "--floor", floor)
        self.assertEqual(rc, 1, out)
        self.assertIn("within 1.0% of the band at every step after 50: NO (2 of 70 steps over: 100, 101)", out)

    def test_interval_means_average_out_step_noise_but_not_drift(self):
        # b alternates 1.5% above and below a: every step fails, the mean of each pair
        # (and of each 10 steps) is within 0.01% of a's. A lasting 1.5% offset fails both.
        a = self.run_dir("a")
        noisy = self.run_dir("noisy", lambda s: 1.015 if s % 2 else 0.985)
        rc, out = self.check(a, noisy)
        self.assertEqual(rc, 1, out)
        self.assertIn("NO (70 of 70 steps over", out)
        for k in ("2", "10"):
            rc, out = self.check(a, noisy, "--mean-over", k)
            self.assertEqual(rc, 0, out)
            self.assertIn("losses: each the mean of " + k + " steps", out)
            self.assertIn("within 1.0% at every step after 50: yes", out)
        rc, out = self.check(a, noisy, "--mean-over", "10")
        self.assertIn("7 steps after 50", out)  # 60, 70, ..., 120
        drift = self.run_dir("drift", lambda s: 1.015)
        rc, out = self.check(a, drift, "--mean-over", "10")
        self.assertEqual(rc, 1, out)
        self.assertIn("NO (7 of 7 steps over: 60, 70, 80, 90, 100, 110, 120)", out)

    def test_interval_means_need_every_step_of_the_interval(self):
        a = self.run_dir("a")
        d = self.run_dir("gap", steps=120)
        lines = [l for l in open(os.path.join(d, "metrics.jsonl")) if '"step": 65,' not in l]
        open(os.path.join(d, "metrics.jsonl"), "w").writelines(lines)
        rc, out = self.check(a, d, "--mean-over", "10")
        self.assertEqual(rc, 0, out)
        self.assertIn("6 steps after 50", out)  # step 70's interval lacks step 65
        rc, out = self.check(a, a, "--mean-over", "0")
        self.assertEqual(rc, 2, out)

    def test_unreadable_input_exits_2(self):
        a = self.run_dir("a")
        rc, out = self.check(a, os.path.join(self.tmp.name, "missing"))
        self.assertEqual(rc, 2, out)
        rc, out = self.check(a, a, "--floor", os.path.join(self.tmp.name, "missing"))
        self.assertEqual(rc, 2, out)
        short = self.run_dir("short", steps=40)
        rc, out = self.check(a, short)
        self.assertEqual(rc, 2, out)
        self.assertIn("no common steps after 50", out)


if __name__ == "__main__":
    unittest.main()
