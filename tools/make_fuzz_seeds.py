#!/usr/bin/env python3
"""make_fuzz_seeds.py: the fuzzers' seed corpora and dictionaries, tests/fuzz/ (see tests/fuzz.sh).

    python3 tools/make_fuzz_seeds.py          (from the repo root; Python 3 alone)

Seeds are small valid inputs of every kind the parsers take, so that libFuzzer mutates from
inside the grammar instead of guessing JSON byte by byte:
  fuzz_config, fuzz_engine  the fixtures' config.json files, compacted (keys the parser does not
                            read dropped), and one flat yarn rope_parameters variant
  fuzz_safetensors          a few tiny files of every dtype, a zero-size and a 0-d tensor,
                            __metadata__, and the b_plain_hc2 fixture's hf_extra.safetensors
  fuzz_tokenizer            short texts for tandem-tiny's tokenizer (digits, CJK, specials)
  fuzz_tokjson              the fixture tokenizers shrunk to their first ids (renumbered densely),
                            and hand-made ones for the components no fixture uses; some carry a
                            tokenizer_config.json after a NUL byte, as fuzz_tokjson.c reads them
Dictionaries hold the names the parsers look up (keys, component types, dtypes) and boundary
numbers.
"""
import json
import os
import re
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fuzz")
TOKFIX = os.path.join(ROOT, "tests", "fixtures", "tokenizers")


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data)


def source_strings(path):
    """the double-quoted string literals of a C source"""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return set(re.findall(r'"((?:[^"\\\n]|\\.)*)"', f.read()))


def write_dict(target, words):
    words = sorted(w for w in set(words) if w and "%" not in w and len(w) <= 64)
    with open(os.path.join(OUT, target + ".dict"), "w", encoding="utf-8") as f:
        f.write("# %s: names its parser looks up (tools/make_fuzz_seeds.py)\n" % target)
        for w in words:
            esc = "".join(
                c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else
                "".join("\\x%02X" % b for b in c.encode()) for c in w)
            f.write('"%s"\n' % esc)


# ---------------------------------------------------------------- config.json

def configs():
    keys = {s for s in source_strings("model/config.c") if re.fullmatch(r"[a-z_0-9]+", s)}
    out = {}
    for name, path in [("a_tiny_yarn", "tests/fixtures/a_tiny_yarn/config.json"),
                       ("b_plain_hc2", "tests/fixtures/b_plain_hc2/config.json"),
                       ("c_upstream", "tests/fixtures/c_upstream_sharded/config.json"),
                       ("tandem_tiny", "models/tandem-tiny/config.json")]:
        with open(os.path.join(ROOT, path)) as f:
            cfg = json.load(f)
        out[name] = {k: v for k, v in cfg.items() if k in keys}
    flat = dict(out["b_plain_hc2"])
    flat["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": 256, "beta_fast": 32,
                               "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                               "truncate": False, "partial_rotary_factor": 0.5}
    flat["scoring_func"] = "softmax"
    flat["tie_word_embeddings"] = True
    flat["eos_token_id"] = [1, 2]
    out["flat_yarn"] = flat
    return out


# ---------------------------------------------------------------- safetensors

def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] -> file bytes (header padded to 8 like HF's)"""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data),
                                                                         len(data) + len(raw)]}
        data += raw
    h = compact(header)
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


# ---------------------------------------------------------------- tokenizer.json

def shrink(tok, keep=300, max_merges=250):
    """the first `keep` vocab ids, renumbered densely; merges among them; added tokens after"""
    model = dict(tok["model"])
    old = sorted(model["vocab"].items(), key=lambda kv: kv[1])[:keep]
    vocab = {s: i for i, (s, _) in enumerate(old)}
    merges = []
    for m in model["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        pre = model.get("continuing_subword_prefix") or ""
        joined = a + (b[len(pre):] if pre and b.startswith(pre) else b)
        if a in vocab and b in vocab and joined in vocab:
            merges.append(m)
        if len(merges) == max_merges:
            break
    model["vocab"], model["merges"] = vocab, merges
    if model.get("unk_token") and model["unk_token"] not in vocab:
        vocab[model["unk_token"]] = len(vocab)
    idmap, added = {}, []
    for a in tok.get("added_tokens") or []:
        a = dict(a)
        new = vocab.get(a["content"], len(vocab) + len(added))
        idmap[a["id"]] = new
        a["id"] = new
        added.append(a)
    out = dict(tok, model=model, added_tokens=added)

    def fix_post(p):
        if not p:
            return p
        p = json.loads(json.dumps(p))
        if p["type"] == "Sequence":
            p["processors"] = [fix_post(x) for x in p["processors"]]
        for s in (p.get("special_tokens") or {}).values():
            s["ids"] = [idmap.get(i, i % len(vocab)) for i in s["ids"]]
        for k in ("cls", "sep"):
            if k in p:
                p[k][1] = idmap.get(p[k][1], vocab.get(p[k][0], 0))
        return p

    out["post_processor"] = fix_post(tok.get("post_processor"))
    return out


def tokenizers():
    out = {}
    for name in ["charbpe", "charbpe_unk", "deepseek_v3", "edge", "gpt2", "tandem8k"]:
        d = os.path.join(TOKFIX, name)
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            tok = json.load(f)
        data = compact(shrink(tok))
        cfg = os.path.join(d, "tokenizer_config.json")
        if name in ("deepseek_v3", "charbpe") and os.path.exists(cfg):
            with open(cfg, encoding="utf-8") as f:
                data += b"\0" + compact(json.load(f))
        out[name] = data
    letters = "abcdefghijklmnopqrstuvwxyz"
    # WordPiece-like BPE: a word suffix, NFKC + Lowercase + Strip + Append, Whitespace, Bert
    v = {c: i for i, c in enumerate(["[UNK]", "[CLS]", "[SEP]"] + list(letters))}
    for w in ["th</w>", "he</w>", "the</w>", "a</w>", "in", "ing</w>", "e</w>", "t</w>",
              "h</w>", "n</w>", "g</w>", "in</w>", "i</w>"]:
        v.setdefault(w, len(v))
    out["suffix_bert"] = compact({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": "[UNK]", "special": True},
                         {"id": 1, "content": "[CLS]", "special": True},
                         {"id": 2, "content": "[SEP]", "special": True, "lstrip": True,
                          "rstrip": True}],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"}, {"type": "Lowercase"},
            {"type": "Strip", "strip_left": True, "strip_right": False},
            {"type": "Append", "append": " "}, {"type": "NFD"}, {"type": "NFKD"}]},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"Regex": "</w>"}, "content": " "},
            {"type": "Strip", "content": " ", "start": 0, "stop": 1}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "[UNK]",
                  "end_of_word_suffix": "</w>", "fuse_unk": False, "vocab": v,
                  "merges": ["t h</w>", "h e</w>", "t he</w>", "i n", "in g</w>", "i n</w>"]}})
    # a subword prefix, merges as pairs, ignore_merges, WhitespaceSplit, Split behaviours,
    # Roberta, added tokens with every flag
    v = {c: i for i, c in enumerate(["<s>", "</s>", "<mask>"] + list(letters) +
                                    ["##" + c for c in letters])}
    for w in ["ab", "##ab", "abc", "hello"]:
        v.setdefault(w, len(v))
    out["prefix_roberta"] = compact({
        "added_tokens": [
            {"id": 0, "content": "<s>", "special": True},
            {"id": 1, "content": "</s>", "special": True},
            {"id": 2, "content": "<mask>", "special": True, "lstrip": True, "single_word": True},
            {"id": len(v), "content": "hello world", "special": False, "normalized": True,
             "rstrip": True}],
        "normalizer": {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"},
            {"type": "Split", "pattern": {"String": "-"}, "behavior": "Removed", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[.,]"}, "behavior": "MergedWithPrevious",
             "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Contiguous",
             "invert": False},
            {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "MergedWithNext",
             "invert": True},
            {"type": "Digits", "individual_digits": False}]},
        "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 1], "cls": ["<s>", 0],
                           "trim_offsets": True, "add_prefix_space": False},
        "decoder": None,
        "model": {"type": "BPE", "continuing_subword_prefix": "##", "ignore_merges": True,
                  "vocab": v, "merges": [["a", "##b"], ["ab", "##c"]]}})
    # SentencePiece-like: byte fallback, Strip decoders after Fuse, unk not fused
    v = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        v["<0x%02X>" % b] = len(v)
    for w in ["\u2581", "\u2581a", "a", "b", "\u2581b", "ab", "\u2581ab"]:
        v.setdefault(w, len(v))
    out["bytefallback_strip"] = compact({
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True},
                         {"id": 1, "content": "<s>", "special": True},
                         {"id": 2, "content": "</s>", "special": True}],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1]},
                                              "</s>": {"id": "</s>", "ids": [2]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            {"type": "Strip", "content": " ", "start": 2, "stop": 1}]},
        "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": False,
                  "byte_fallback": True, "vocab": v,
                  "merges": ["\u2581 a", "a b", "\u2581 b", "\u2581 ab"]}}) + b"\0" + compact(
        {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "pad_token": "<unk>"})
    return out


# boundary numbers: libFuzzer does not see through float compares or jansson's integer parsing
NUMBERS = ["0", "-1", "1", "2", "3", "255", "256", "65536", "1048576", "2147483647", "2147483648",
           "-2147483649", "4294967296", "9007199254740993", "9223372036854775807",
           "-9223372036854775808", "1e308", "1e309", "-1e308", "1e-320", "0.5", "-0.0", "1.5",
           "true", "false", "null", "[]", "{}"]

TEXTS = {
    "english": "Once upon a time, there was a little girl who lived in a village.",
    "digits": "In 2024 they paid $1,234.56 for 7 items (3 + 4 = 7).",
    "code": "def f(x):\n    return x**2  # square\n\n\tprint(f(12))\r\n",
    "unicode": "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 "
               "\U0001F642 e\u0301 \u00c5ngstr\u00f6m \u2019quoted\u2019",
    "specials": "<\uff5cbegin\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>Hi"
                "<\uff5cAssistant\uff5c>Hello<\uff5cend\u2581of\u2581sentence\uff5c>",
    "spaces": "  two  spaces   and\n\n\nnew lines \t tabs   ",
}


def main():
    for name, cfg in configs().items():
        write("fuzz_config", name + ".json", compact(cfg))
        if name != "tandem_tiny":  # 11.6 M parameters: over fuzz_engine's budget
            write("fuzz_engine", name + ".json", compact(cfg))
    cfg_words = [s for s in source_strings("model/config.c") if re.fullmatch(r"[a-z_0-9]+", s)]
    write_dict("fuzz_config", ['"%s"' % w for w in cfg_words] + cfg_words + NUMBERS)
    write_dict("fuzz_engine", ['"%s"' % w for w in cfg_words] + cfg_words + NUMBERS)

    write("fuzz_safetensors", "f32_i32.safetensors", safetensors(
        [("model.norm.weight", "F32", [4], f32(1, 1, 1, 1)),
         ("layers.0.ffn.gate.tid2eid", "I32", [2, 2], struct.pack("<4i", 0, 1, 1, 0))],
        {"format": "pt"}))
    write("fuzz_safetensors", "half_i64.safetensors", safetensors(
        [("a.bf16", "BF16", [2, 2], struct.pack("<4H", 0x3F80, 0, 0xBF80, 0x7F80)),
         ("b.f16", "F16", [3], struct.pack("<3H", 0x3C00, 0x8000, 0x7C00)),
         ("c.i64", "I64", [1], struct.pack("<q", -1)),
         ("d.empty", "F32", [0, 4], b""),
         ("e.scalar", "F32", [], f32(0.5))]))
    write("fuzz_safetensors", "empty.safetensors", safetensors([], {}))
    with open(os.path.join(ROOT, "tests/fixtures/b_plain_hc2/hf_extra.safetensors"), "rb") as f:
        write("fuzz_safetensors", "hf_extra.safetensors", f.read())
    write_dict("fuzz_safetensors",
               ['"%s"' % w for w in ["dtype", "shape", "data_offsets", "__metadata__", "format",
                                     "F32", "BF16", "F16", "I32", "I64", "pt"]] +
               ["F32", "BF16", "F16", "I32", "I64", "__metadata__"] + NUMBERS)

    for name, text in TEXTS.items():
        write("fuzz_tokenizer", name + ".txt", text.encode())
    with open(os.path.join(ROOT, "models/tandem-tiny/tokenizer.json"), encoding="utf-8") as f:
        specials = [a["content"] for a in json.load(f)["added_tokens"]]
    write_dict("fuzz_tokenizer", specials + ["\u2581", "\r\n", "\U0001F642", "\u00e9", "e\u0301"])

    for name, data in tokenizers().items():
        write("fuzz_tokjson", name + ".json", data)
    tok_words = [s for s in source_strings("tokenizer/tok_load.c") if re.fullmatch(r"[A-Za-z_]+", s)]
    chat_words = [s for s in source_strings("tokenizer/chat.c") if s.startswith("<")]
    write_dict("fuzz_tokjson", ['"%s"' % w for w in tok_words] + tok_words + chat_words +
               ["\\p{L}", "\\p{N}", "\\s+", "(?!\\S)", "\u2581", "<0x41>", "##", "</w>"] + NUMBERS)


if __name__ == "__main__":
    main()
