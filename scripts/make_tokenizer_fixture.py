#!/usr/bin/env python3
"""Parity fixture for shardtrain's Qwen2 tokenizer (src/data/tokenizer.cpp), from the
reference: Hugging Face `tokenizers` (Rust), `Tokenizer.from_file(<dir>/tokenizer.json)`,
`encode(text, add_special_tokens=False)`.

    scripts/make_tokenizer_fixture.py --tokenizer DIR [--out tests/data/tokenizer/qwen2.5_parity.jsonl]
    scripts/make_tokenizer_fixture.py --tokenizer DIR --bench FILE      # reference speed, one thread

The reference is the Python package `tokenizers` (pip install tokenizers==0.23.*). Where
it is not installed, `--node-modules DIR` uses the same Rust library through its Node
binding instead (npm install tokenizers@0.23.2 in DIR; `node` on the PATH).

Output: one JSON object per line. The first line is {"meta": {...}} (reference, version,
tokenizer sha256). Each following line is {"name": ..., "text": str, "ids": [...]} or, for
byte strings that are not valid UTF-8, {"name": ..., "text_b64": base64 of the bytes,
"ids": [...]}.

Invalid UTF-8: the reference takes str, never bytes, and cannot be given invalid UTF-8 at
all: Python's surrogateescape strings (lone surrogates) are refused by the Rust side
("surrogates not allowed"), and Node turns lone surrogates into U+FFFD. So the fixture
encodes `raw.decode("utf-8", errors="replace")` (each maximal ill-formed subsequence ->
U+FFFD), which is what shardtrain's Tokenizer::encode does to the bytes it is given.

The corpus is deterministic: fixed strings by category, then held-out strings drawn from a
seeded generator (--seed, --random).
"""
import argparse
import base64
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time

# ---------------------------------------------------------------- the corpus

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|box_end|>",
            "<|vision_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
            "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]

FIXED = {
    "readme": ["Hello world", " Hello world", "333", "   ", "\n\n", "<|im_start|>user\nHello!<|im_end|>"],
    "prose": [
        "The quick brown fox jumps over the lazy dog.",
        "It's a truth universally acknowledged, that a single man in possession of a good fortune, "
        "must be in want of a wife.",
        "Permission is hereby granted, free of charge, to any person obtaining a copy of this software "
        "and associated documentation files (the \"Software\"), to deal in the Software without restriction.",
        "  Leading spaces, trailing spaces   ",
        "Mr. O'Neil said: \"I'll go; you'd better stay.\" -- and he left...",
        "ALL CAPS SHOUTING!!! and lower, MiXeD cAsE",
    ],
    "contractions": [
        "don't", "DON'T", "I'm", "I'M", "we'll", "WE'LL", "We'Ll", "they've", "they'VE", "you're",
        "he'd", "it's", "IT'S", "'s", "'S", "'t", "'ll", "'LLama", "''s", "'sS", "x's'", " 's", "\n's",
        "'ſ", "'ſx", "'K", "rock'n'roll", "‘quoted’ ’s", "l'été", "'\u0301s",
    ],
    "digits": [
        "0", "12", "1234567890", "12345678901234567890123456789", "3.14159265358979", "1,000,000",
        "-42", "+1e-10", "0x7fffffff", "2024-01-01T12:34:56Z", "v1.2.3", "a1b2c3", "1st 2nd 3rd 4th",
        "١٢٣ ٤٥٦", "०१२३", "Ⅻ ½ ¾ ²³", "①②③", "𝟘𝟙𝟚",
    ],
    "whitespace": [
        " ", "  ", "\t", "\t\t", "\n", "\r\n", "\r", "\r\n\r\n", " \n", "\n ", "  \n  ", "a  b", "a   b",
        "a\tb", "a \tb", "a\t b", "a\r\nb", "a\r\n\r\nb", "a\n\n\nb", "a \n b", "x   ", "   x",
        "\n\n\n\n\n\n\n\n", " " * 17 + "x", "\t\n \t\n", "a\u00a0b", "a\u00a0\u00a0b", "\u3000x",
        "a\u2028b", "a\u2029b", "x\u0085y", "\u0085", "a\u180eb", "\u180e\u180e", "x \u180e y", " \u180e",
        "\u200bzero\u200bwidth", "\u2003em\u2009thin", "a\x0bb\x0cc", "\x1c\x1d\x1e\x1f", "end\n",
        "tab\tsep\tvalues\n1\t2\t3\n",
    ],
    "code": [
        "def f(x):\n    return x ** 2  # square\n",
        "int main(int argc, char** argv) {\n\tstd::printf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
        "for (auto& [k, v] : m) { sum += v; }",
        "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
        "<html><body class=\"main\">&amp; &lt;tag&gt;</body></html>",
        "SELECT * FROM t WHERE id >= 10 AND name LIKE '%x%';",
        "    if (a != b && c || !d) {\r\n        x += 1;\r\n    }\r\n",
        "#!/usr/bin/env bash\nset -euo pipefail\necho \"$HOME\" | grep -q root && exit 1\n",
        "λx.λy.x y  →  (\\x -> \\y -> x y)",
        "a==b!=c<=d>=e->f::g...h",
        "https://example.com/path?q=1&r=two#frag",
    ],
    "emoji": [
        "🙂", "🙂🙂🙂", "I ❤️ NY", "👨‍👩‍👧‍👦 family", "👍🏽", "🇺🇸🇫🇷", "1️⃣", "🏳️‍🌈", "🧑🏿‍🚀 in space",
        "✨sparkles✨", "☕", "😀😃😄😁😆😅😂🤣",
    ],
    "cjk": [
        "你好，世界！", "我爱自然语言处理。", "こんにちは世界", "カタカナとひらがな", "が", "か\u3099",
        "ｶﾞ ﾊﾟ", "안녕하세요 세계", "\u1100\u1161\u11a8", "\u1100\u1161", "한국어 텍스트",
        "漢字かな交じり文。", "中文English混合123",
    ],
    "scripts": [
        "مرحبا بالعالم", "اللُّغَةُ الْعَرَبِيَّةُ", "שָׁלוֹם עוֹלָם", "नमस्ते दुनिया", "क़ ख़ ग़", "हिन्दी भाषा",
        "সোনার বাংলা", "\u09c7\u09be", "வணக்கம்", "สวัสดีชาวโลก", "Привет, мир!", "Γειά σου Κόσμε",
        "Tiếng Việt", "Tie\u0302\u0301ng Vie\u0323\u0302t", "Ελληνικά ἀρχαῖα", "ქართული", "Հայերեն",
        "አማርኛ", "ᚠᛇᚻ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𐌰𐌱𐌲",
    ],
    "nfc": [
        "e\u0301", "cafe\u0301", "\u212b", "A\u030a", "\u2126", "\u00c5", "a\u0301\u0327", "a\u0327\u0301",
        "\u0344", "\u0958", "\u0340\u0341", "ﬁ ﬂ ① Ａｂｃ ㎏", "o\u0308\u0304", "\u1e9b\u0323",
        "\u0301start", "x\u0301\u0301\u0301", "\u0041\u0300\u0300", "\u05d0\u05b7\u05bc", "\u0915\u093c",
        "\u0b47\u0b3e", "\u0cc6\u0cd5", "\u1025\u102e", "\u3046\u3099", "\u00e9\u0301",
    ],
    "specials": [
        "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "<|im_start|><|im_end|>",
        "<|endoftext", "|endoftext|>", "<<|endoftext|>>", "< |endoftext|>", "<|ENDOFTEXT|>",
        " <|endoftext|> ", "\n<|im_start|>assistant\n", "<|im_start|>\u0301", "e<|im_end|>\u0301",
        "<tool_call>{\"name\": \"f\"}</tool_call>", "<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>",
        "<|repo_name|>shardtrain<|file_sep|>README.md", "text<|endoftext|>\n\nnext document",
        "<|box_start|>(1,2)<|box_end|>", "<|im_end|><|im_end|>x", "<|<|endoftext|>|>",
    ],
    # Where Unicode versions differ: the reference's regex knows Unicode 16.0 letters and
    # digits (PCRE2 10.42: 14.0); its NFC predates marks that libutf8proc 2.8 knows.
    "unicode_versions": [
        "\U00031350'e x\U000323af's", "\U0002ebf0\U0002ee5d1", "\U00013460'r", "\u1c89\u1c8a'S", "\ua7cb\ua7cdx",
        "\U00016100\U0001611d'll", "a\U0001e5f1\U0001e5fa", "\U00016130'9", "\U0001ccf0\U0001ccf9x",
        "\u1acd\u031f", "\u035f\u1ace", "\u089e\u1939", "\u094d\u1ac1", "\u1df8\u032c", "\u0329\u1715",
        "\u08cf\u035b", "a\u0301\u1ac1\u0323", "\U00011935\U00011930", "\U00011938", "e\u0d3b\u0301",
        "\U000323b0'e", "\U0001e6c0x",
    ],
    "controls": ["a\x00b", "\x00", "\x01\x02\x03", "\x7f", "\x1b[31mred\x1b[0m", "\u0080\u0099\u009f", "\ufeffBOM",
                 "\ufffd", "\ufffe\uffff", "\U0010fffd", "\ue000private"],
    "long": [
        "a" * 3000, " " * 3000 + "x", "\n" * 500, "🙂" * 300, "ab" * 1500, "1" * 2000,
        "The licence text. " * 200, "-" * 1000, "\t" * 300 + "y", "Ā" * 500,
    ],
}

INVALID = {
    "lone_ff": b"\xff",
    "truncated_3": b"abc\xe2\x82",
    "truncated_3_then_ascii": b"\xe2\x82A",
    "overlong_slash": b"\xc0\xaf",
    "surrogate_d800": b"\xed\xa0\x80",
    "above_10ffff": b"\xf4\x90\x80\x80",
    "lone_continuations": b"\x80\x80\xbf",
    "truncated_emoji": b"\xf0\x9f\x98",
    "latin1_cafe": b"caf\xe9 cr\xe8me",
    "special_then_ff": b"<|endoftext|>\xff",
    "ff_in_special": b"<|endof\xfftext|>",
    "f5": b"\xf5\x80\x80\x80 x",
    "e0_80": b"\xe0\x80\x80",
    "mixed": b"ok \xc3\xa9 \xc3 \xa9 \xe2\x82\xac \xe2\x82 end",
    "space_ff_word": b" \xffword",
    "cr_ff_lf": b"\r\xff\n",
}

POOLS = {
    "ascii_letters": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "digits": "0123456789",
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "space": [" ", " ", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\x0b"],
    "latin": "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿĀāĂăĄąĆćŒœŠšŸŽžßẞ",
    "combining": "".join(chr(c) for c in range(0x300, 0x370)) + "\u0591\u05b7\u064e\u0650\u093c\u094d\u3099\u309a",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学",
    "kana": "あいうえおかきくけこさしすせそがぎぐげごアイウエオカキクケコガギグゲゴ",
    "hangul": "한국어안녕하세요세계" + "\u1100\u1161\u11a8\u1112\u1175",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "devanagari": "कखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसह" + "ािीुूेैोौं्",
    "emoji": ["🙂", "👍", "🏽", "\u200d", "\ufe0f", "❤", "🇺", "🇸", "👩", "🚀", "✨"],
    "contractions": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re"],
    "specials": SPECIALS,
}


def random_codepoint(rng):
    while True:
        if rng.random() < 0.7:
            cp = rng.randrange(0x20, 0x3000)
        elif rng.random() < 0.8:
            cp = rng.randrange(0x3000, 0x10000)
        else:
            cp = rng.randrange(0x10000, 0x110000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def random_text(rng):
    n = rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 80])
    parts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.06:
            parts.append(random_codepoint(rng))
            continue
        pool = POOLS[rng.choice(list(POOLS))]
        k = rng.choice([1, 1, 2, 3, 5, 9])
        parts.append("".join(rng.choice(pool) for _ in range(k)))
    return "".join(parts)


def random_bytes(rng):
    n = rng.randrange(1, 40)
    out = bytearray()
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            out += rng.choice([b"a", b"Z", b" ", b"\n", b"9", b"'", b"<|endoftext|>", "é".encode(), "中".encode(),
                               "🙂".encode()])
        elif r < 0.6:
            out.append(rng.randrange(0x80, 0xC0))  # continuation
        elif r < 0.8:
            out.append(rng.randrange(0xC0, 0x100))  # lead or never-valid
        else:
            out.append(rng.randrange(0, 0x100))
    return bytes(out)


def build_corpus(seed, n_random):
    """[(name, raw bytes, text given to the reference)]"""
    cases = []
    for cat, items in FIXED.items():
        for i, s in enumerate(items):
            cases.append((f"{cat}/{i}", s.encode("utf-8"), s))
    for name, raw in INVALID.items():
        cases.append((f"invalid/{name}", raw, raw.decode("utf-8", errors="replace")))
    rng = random.Random(seed)
    for i in range(n_random):
        s = random_text(rng)
        cases.append((f"random/{i}", s.encode("utf-8"), s))
    for i in range(max(1, n_random // 10)):
        raw = random_bytes(rng)
        cases.append((f"random_bytes/{i}", raw, raw.decode("utf-8", errors="replace")))
    return cases

# ---------------------------------------------------------------- the reference

NODE_RUNNER = r"""
const { Tokenizer } = require("tokenizers");
const fs = require("fs");
(async () => {
  const [file, mode] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(file);
  const input = JSON.parse(fs.readFileSync(0, "utf8"));
  if (mode === "bench") {
    const bytes = input.reduce((a, s) => a + Buffer.byteLength(s, "utf8"), 0);
    const t0 = process.hrtime.bigint();
    const encs = await tok.encodeBatch(input, { addSpecialTokens: false });
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    const n = encs.reduce((a, e) => a + e.getIds().length, 0);
    process.stdout.write(JSON.stringify({ seconds: s, tokens: n, bytes }) + "\n");
    return;
  }
  const out = [];
  for (const s of input) out.push(Array.from((await tok.encode(s, null, { addSpecialTokens: false })).getIds()));
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


class Reference:
    def __init__(self, tokenizer_json, node_modules):
        self.file = tokenizer_json
        self.node_modules = node_modules
        self.py = None
        if not node_modules:
            try:
                import tokenizers  # noqa: F401
            except ImportError:
                sys.exit("make_tokenizer_fixture: the Python package `tokenizers` is not installed "
                         "(pip install tokenizers==0.23.*), or give --node-modules DIR with npm's tokenizers")
            self.py = tokenizers.Tokenizer.from_file(tokenizer_json)
            self.name, self.version = "tokenizers (Python)", tokenizers.__version__
        else:
            pkg = json.load(open(os.path.join(node_modules, "node_modules", "tokenizers", "package.json")))
            self.name, self.version = "tokenizers (Node binding)", pkg["version"]

    def _node(self, texts, mode, env_extra=None):
        with tempfile.NamedTemporaryFile("w", suffix=".js", dir=self.node_modules, delete=False) as f:
            f.write(NODE_RUNNER)
            runner = f.name
        try:
            env = dict(os.environ, **(env_extra or {}))
            r = subprocess.run(["node", runner, self.file, mode], input=json.dumps(texts).encode(),
                               capture_output=True, env=env, cwd=self.node_modules)
            if r.returncode != 0:
                sys.exit("make_tokenizer_fixture: node failed: " + r.stderr.decode(errors="replace"))
            return json.loads(r.stdout)
        finally:
            os.unlink(runner)

    def encode_all(self, texts):
        if self.py:
            return [self.py.encode(t, add_special_tokens=False).ids for t in texts]
        return self._node(texts, "encode")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def lines_of(path):
    """The file's text split into lines, '\n' kept: the unit `shardtrain tokenize --bench` uses."""
    text = open(path, "rb").read().decode("utf-8", errors="replace")
    lines = text.split("\n")
    out = [l + "\n" for l in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def bench(args, tokenizer_json):
    lines = lines_of(args.bench)
    nbytes = sum(len(l.encode("utf-8")) for l in lines)
    print(f"input      {args.bench}: {nbytes} bytes, {len(lines)} lines (encode_batch, one thread)")
    if args.node_modules:
        ref = Reference(tokenizer_json, args.node_modules)
        for p in ("cold", "warm"):  # each run is a fresh process: both cold for the cache
            r = ref._node(lines, "bench", {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
            print(f"{p:10s} {r['tokens']} tokens in {r['seconds']:.3f} s: {nbytes / 1e6 / r['seconds']:.2f} MB/s "
                  f"({ref.name} {ref.version})")
        return
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(tokenizer_json)
    print(f"reference  tokenizers {tokenizers.__version__}, RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS')}")
    for p in ("cold", "warm"):
        t0 = time.perf_counter()
        encs = tok.encode_batch(lines, add_special_tokens=False)
        s = time.perf_counter() - t0
        n = sum(len(e.ids) for e in encs)
        print(f"{p:10s} {n} tokens in {s:.3f} s: {nbytes / 1e6 / s:.2f} MB/s (encode_batch)")
    if hasattr(tok, "encode_batch_fast"):
        t0 = time.perf_counter()
        encs = tok.encode_batch_fast(lines, add_special_tokens=False)
        s = time.perf_counter() - t0
        print(f"{'fast':10s} {sum(len(e.ids) for e in encs)} tokens in {s:.3f} s: {nbytes / 1e6 / s:.2f} MB/s "
              f"(encode_batch_fast, no offsets)")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="directory holding tokenizer.json")
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "tokenizer", "qwen2.5_parity.jsonl"))
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--random", type=int, default=1500, help="held-out random strings (plus a tenth as many byte strings)")
    ap.add_argument("--node-modules", help="use the Node binding installed under DIR/node_modules/tokenizers")
    ap.add_argument("--bench", metavar="FILE", help="time the reference on FILE (one thread) instead")
    args = ap.parse_args()
    tokenizer_json = os.path.join(args.tokenizer, "tokenizer.json")

    if args.bench:
        # One thread: set before tokenizers (Rayon) starts its pool.
        os.environ["RAYON_NUM_THREADS"] = "1"
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        return bench(args, tokenizer_json)

    ref = Reference(tokenizer_json, args.node_modules)
    cases = build_corpus(args.seed, args.random)
    ids = ref.encode_all([c[2] for c in cases])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        meta = {"reference": ref.name, "version": ref.version, "tokenizer_json_sha256": sha256(tokenizer_json),
                "seed": args.seed, "cases": len(cases),
                "invalid_utf8": "text_b64 cases were encoded as bytes.decode('utf-8', errors='replace')"}
        f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
        for (name, raw, text), t_ids in zip(cases, ids):
            rec = {"name": name}
            try:
                rec["text"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                rec["text_b64"] = base64.b64encode(raw).decode("ascii")
            rec["ids"] = t_ids
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {args.out} ({ref.name} {ref.version})")


if __name__ == "__main__":
    main()
