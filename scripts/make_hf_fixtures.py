#!/usr/bin/env python3
"""Regenerates tests/data/hf: small random Qwen2 models created and saved by
transformers, token ids, and the fp32 logits and loss transformers computes for
them. CI then checks shardtrain's CPU forward against these files without torch.

Needs torch, transformers and numpy. With --shardtrain BIN it also checks the other
direction: models exported by shardtrain load in transformers and give the logits
shardtrain computes (a re-export of each fixture, a preset's init in bf16, and a
model trained for a few steps), and writes a JSON report.

    python3 scripts/make_hf_fixtures.py --out tests/data/hf
    python3 scripts/make_hf_fixtures.py --out /tmp/fx --shardtrain build/shardtrain --report report.json
"""
import argparse, json, os, shutil, subprocess, sys, tempfile

import numpy as np
import torch
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM

CASES = {
    # name: (tied, kv_heads, save dtype, max shard size, token dtype, (B, T), rope_theta, eps)
    "tied_kv2_f32": (True, 2, torch.float32, None, np.int64, (2, 16), 10000.0, 1e-6),
    "untied_kv1_f32": (False, 1, torch.float32, None, np.int32, (3, 12), 1e6, 1e-5),
    "tied_kv1_bf16": (True, 1, torch.bfloat16, None, np.int64, (2, 16), 10000.0, 1e-6),
    "untied_kv2_sharded": (False, 2, torch.float32, "40KB", np.int64, (2, 20), 1e6, 1e-6),
}


def load(path, dtype=torch.float32):
    try:
        m = Qwen2ForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    except TypeError:
        m = Qwen2ForCausalLM.from_pretrained(path, torch_dtype=dtype, attn_implementation="eager")
    return m.float().eval()


@torch.no_grad()
def logits_and_loss(model, ids):
    t = torch.tensor(np.asarray(ids, dtype=np.int64))
    out = model(input_ids=t, labels=t)
    return out.logits.float().numpy(), float(out.loss)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return {"rel_l2": float(np.linalg.norm(a - b) / np.linalg.norm(b)),
            "max_abs_rel": float(np.abs(a - b).max() / np.abs(b).max())}


def make_case(out, name, spec, seed):
    tied, kv, save_dtype, shard, tok_dtype, (B, T), theta, eps = spec
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=64,
                      rms_norm_eps=eps, rope_theta=theta, tie_word_embeddings=tied,
                      attn_implementation="eager")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    # Random values everywhere (biases and norms too), large enough that logits differ.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    if tied:
        model.tie_weights()
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.to(save_dtype).save_pretrained(d, safe_serialization=True, **kwargs)
    ref = load(d)  # as saved (bf16 rounding included), computed in fp32
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, size=(B, T)).astype(tok_dtype)
    np.save(os.path.join(d, "tokens.npy"), ids)
    logits, loss = logits_and_loss(ref, ids)
    np.save(os.path.join(d, "logits.npy"), logits.astype(np.float32))
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"loss": loss, "transformers": transformers.__version__, "torch": torch.__version__,
                   "tied": tied, "kv_heads": kv, "saved_dtype": str(save_dtype)}, f, indent=1)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    return d, ids, logits, loss


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def score(binary, model_dir, tokens_path, tmp):
    lo = os.path.join(tmp, "ours.npy")
    out = run([binary, "score", "--init-from", model_dir, "--tokens", tokens_path, "--logits-out", lo])
    loss = float(out.split("loss ")[1].split()[0])
    return np.load(lo), loss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/hf")
    ap.add_argument("--shardtrain", help="binary to check export/score parity with")
    ap.add_argument("--report", help="write the parity report here (JSON)")
    a = ap.parse_args()
    torch.set_num_threads(4)
    os.makedirs(a.out, exist_ok=True)
    report = {"transformers": transformers.__version__, "torch": torch.__version__, "cases": {}}
    fixtures = {}
    for i, (name, spec) in enumerate(CASES.items()):
        fixtures[name] = make_case(a.out, name, spec, seed=100 + i)
        print(f"fixture {name}: loss {fixtures[name][3]:.6f}", flush=True)

    if a.shardtrain:
        tmp = tempfile.mkdtemp()
        for name, (d, ids, logits, loss) in fixtures.items():
            r = {}
            ours, our_loss = score(a.shardtrain, d, os.path.join(d, "tokens.npy"), tmp)
            r["score_vs_transformers"] = rel(ours, logits) | {"loss_ours": our_loss, "loss_transformers": loss}
            exp = os.path.join(tmp, name + "_export")
            run([a.shardtrain, "export", "--init-from", d, "--out", exp, "--dtype", "f32"])
            back, back_loss = logits_and_loss(load(exp), ids)
            r["reexport_f32_in_transformers"] = rel(back, logits) | {"loss": back_loss}
            report["cases"][name] = r
            print(name, json.dumps(r), flush=True)
        # A preset's initialisation exported in bf16, and a model trained a few steps.
        tokens_txt = os.path.join(tmp, "text_tokens.txt")
        with open(tokens_txt, "w") as f:
            f.write(" ".join(str(b) for b in b"The licence grants you the freedom to share.") + "\n")
            f.write(" ".join(str(b) for b in b"Redistribution and use in source and binary forms") + "\n")
        for label, make in {
            "tiny_init_bf16": [a.shardtrain, "export", "--preset", "tiny", "--seed", "7", "--dtype", "bf16"],
            "tiny_trained_f32": [a.shardtrain, "train", "--train.steps=30", "--train.seq_len=64",
                                 "--train.micro_batch=8", "--run.progress=off",
                                 "--run.out_dir=" + os.path.join(tmp, "run"), "--run.export_dtype=f32",
                                 "--data.paths=" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")],
        }.items():
            exp = os.path.join(tmp, label)
            run(make + (["--out", exp] if make[1] == "export" else ["--run.export_dir=" + exp]))
            ours, our_loss = score(a.shardtrain, exp, tokens_txt, tmp)
            rows = [np.array([int(x) for x in line.split()]) for line in open(tokens_txt)]
            theirs = np.concatenate([logits_and_loss(load(exp, torch.float32), r[None])[0][0] for r in rows])
            losses = [logits_and_loss(load(exp), r[None])[1] for r in rows]
            counts = [len(r) - 1 for r in rows]
            their_loss = sum(l * c for l, c in zip(losses, counts)) / sum(counts)
            report["cases"][label] = rel(ours, theirs) | {"loss_ours": our_loss, "loss_transformers": their_loss}
            print(label, json.dumps(report["cases"][label]), flush=True)
        shutil.rmtree(tmp)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
