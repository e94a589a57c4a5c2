#!/usr/bin/env python3
"""train_tokenizer.py: the tandem-tiny tokenizer (byte-level BPE, vocabulary 8192).

    python3 tools/train_tokenizer.py --data .corpus --out models/tandem-tiny

Trains HF `tokenizers` BPE on the training split of tools/corpus.sh's output (train.jsonl,
or .xz/.gz) and writes tokenizer.json + tokenizer_config.json.

Layout, DeepSeek-V3/V4 style:
  * ids 0..7 are the special tokens of tools/tandem_tiny.py: BOS <｜begin▁of▁sentence｜>,
    EOS <｜end▁of▁sentence｜>, pad <｜▁pad▁｜>, <｜User｜>, <｜Assistant｜>, and three
    reserved <｜place▁holder▁no▁N｜> (N = 0 is DSpark's noise token);
  * ids 8..263 the 256 byte symbols, then the merges;
  * no normalizer; pre-tokenizer Sequence[Split(\\p{N}{1,3}), Split(CJK runs), Split(the V3
    main pattern), ByteLevel(use_regex=False)] with Isolated splits; ByteLevel decoder;
  * a TemplateProcessing post-processor that prepends BOS (add_special_tokens=True);
  * tokenizer_config.json: bos/eos/pad tokens and a DeepSeek-V3-style chat template.
Deterministic for a given corpus (the trainer breaks count ties by the pair's bytes).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402


def build_untrained():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tt.PRETOK_DIGITS), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(tt.PRETOK_CJK), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(tt.PRETOK_MAIN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train(docs, vocab=tt.VOCAB):
    from tokenizers import AddedToken, pre_tokenizers, processors, trainers
    tok = build_untrained()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, show_progress=False,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in tt.SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((t for _, t in docs), trainer=trainer, length=len(docs))
    for i, s in enumerate(tt.SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{tt.BOS} $A", pair=f"{tt.BOS} $A $B:1", special_tokens=[(tt.BOS, tt.BOS_ID)])
    return tok


def save(tok, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {
        "add_bos_token": True, "add_eos_token": False,
        "bos_token": tt.BOS, "eos_token": tt.EOS, "pad_token": tt.PAD, "unk_token": None,
        "additional_special_tokens": [tt.USER, tt.ASSISTANT] + tt.PLACE_HOLDERS,
        "clean_up_tokenization_spaces": False, "legacy": True,
        "model_max_length": tt.CONTEXT, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": tt.CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh, indent=1, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(tt.REPO, ".corpus"))
    ap.add_argument("--out", default=tt.MODEL_DIR)
    ap.add_argument("--vocab", type=int, default=tt.VOCAB)
    ap.add_argument("--limit-bytes", type=int, default=None, help="train on a prefix (smoke runs)")
    a = ap.parse_args()
    t0 = time.time()
    docs = tt.read_docs(a.data, "train", a.limit_bytes)
    tok = train(docs, a.vocab)
    save(tok, a.out)
    s = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    enc = tok.encode(s)
    tt.log(f"tokenizer: {tok.get_vocab_size()} tokens from {len(docs)} docs in {time.time() - t0:.1f} s; "
           f"{len(s)} chars -> {len(enc.ids)} ids {enc.ids[:12]}...; round trip "
           f"{tok.decode(enc.ids, skip_special_tokens=True) == s}")


if __name__ == "__main__":
    main()
