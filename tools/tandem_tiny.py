#!/usr/bin/env python3
"""tandem_tiny.py: the tandem-tiny model family, shared by the tokenizer, target, MTP and
DSpark scripts.

What lives here:
  * the special tokens and their ids (BOS 0, EOS 1, pad 2, User 3, Assistant 4, three
    reserved place holders; place holder 0 is the DSpark noise token);
  * TARGET: the DeepseekV4Config kwargs of tandem-tiny, and SMOKE, a miniature of it that
    runs every code path in seconds;
  * corpus reading (jsonl, .xz/.gz) and tokenisation into one uint16 stream per split
    (every document is BOS + text + EOS);
  * weight export: HF names -> the upstream DeepSeek layout of dsv4.md section 2.3 (via
    tools/make_fixtures.py's upstream_names()), stored dtypes as HF keeps them (bf16
    matrices; fp32 norms, HC, sinks, position biases, router biases; int32 tid2eid),
    sharded safetensors + model.safetensors.index.json, an upstream-style config.json with
    the legacy keys (compress_ratios, num_hash_layers, qk_rope_head_dim, ...), and
    generation_config.json;
  * the reverse: load a shipped model directory back into an HF DeepseekV4ForCausalLM (and
    the mtp.0.* tensors into tools/mtp_ref.py's module).

torch and transformers are imported lazily, so the constants can be read anywhere.
"""
import gzip
import json
import lzma
import os
import re
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODEL_DIR = os.path.join(REPO, "models", "tandem-tiny")

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
PLACE_HOLDERS = [f"<｜place▁holder▁no▁{i}｜>" for i in range(3)]
SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT] + PLACE_HOLDERS
BOS_ID, EOS_ID, PAD_ID, USER_ID, ASSISTANT_ID = 0, 1, 2, 3, 4
NOISE_ID = 5  # <｜place▁holder▁no▁0｜>: never seen in training; the DSpark noise (mask) token

VOCAB = 8192
CONTEXT = 1024
HASH_SEED = 20261129

# DeepSeek-V3/V4 pre-tokenisation: digits in groups of up to 3, CJK runs, then the main
# pattern; byte-level BPE without its own regex after that.
PRETOK_DIGITS = r"\p{N}{1,3}"
PRETOK_CJK = "[一-龥\u3040-ゟ゠-ヿ]+"
PRETOK_MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
               r"[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
               r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")

TARGET = dict(
    vocab_size=VOCAB, hidden_size=256, moe_intermediate_size=128, num_hidden_layers=6,
    num_attention_heads=8, num_key_value_heads=1, head_dim=64, q_lora_rank=128,
    partial_rotary_factor=0.5,                                   # rope on the last 32 dims
    layer_types=[SLIDING, CSA, HCA, CSA, HCA, CSA],
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
    compress_rates={CSA: 4, HCA: 128}, sliding_window=128,
    o_groups=4, o_lora_rank=64,
    index_n_heads=8, index_head_dim=32, index_topk=64,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
    scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=10.0,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    rope_theta=10000.0, compress_rope_theta=160000.0,
    max_position_embeddings=CONTEXT, tie_word_embeddings=False, initializer_range=0.02,
    bos_token_id=BOS_ID, eos_token_id=EOS_ID,
)

# Same code paths, seconds to run: used by the --smoke runs before any long job.
SMOKE = dict(TARGET, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
             num_attention_heads=2, head_dim=32, q_lora_rank=32, layer_types=[SLIDING, CSA, HCA, CSA],
             mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"], o_groups=2, o_lora_rank=16,
             index_head_dim=16, n_routed_experts=4)

# MTP (mtp.0.*): one V4 block, sliding-window attention only, score-routed MoE.
MTP_COMPRESS_RATIO = 0


def log(*a):
    print(*a, flush=True)


class StepBudget:
    """How many steps a training run takes: `steps` when given, else as many as fit before
    `until` (seconds since the epoch), the time of a step measured from step `first` to step
    `last` (after `sync()`, a device sync). after(step), called after each step, returns the
    seconds per step once, at `last` (total is then set), else None; over(grace) is true once
    `until` (when given) is more than grace seconds past."""

    def __init__(self, steps, until, first, last, sync=None, what="--steps or --train-seconds"):
        if steps is None and until is None:
            raise SystemExit(f"give {what}")
        self.total = steps or 10 ** 9
        self.calibrate = steps is None
        self.until, self.first, self.last = until, first, last
        self.sync = sync or (lambda: None)
        self.t = time.time()

    def after(self, step):
        if not self.calibrate or step not in (self.first, self.last):
            return None
        self.sync()
        if step == self.first:
            self.t = time.time()
            return None
        dt = (time.time() - self.t) / (self.last - self.first)
        self.total = max(step + 1, step + int((self.until - time.time()) / dt))
        return dt

    def over(self, grace):
        return self.until is not None and time.time() > self.until + grace


# ------------------------------------------------------------------------------- corpus

def open_text(path):
    if path.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def find_split(data_dir, split):
    for ext in ("", ".xz", ".gz"):
        p = os.path.join(data_dir, f"{split}.jsonl{ext}")
        if os.path.exists(p):
            return p
    raise SystemExit(f"no {split}.jsonl[.xz|.gz] in {data_dir} (run tools/corpus.sh)")


def read_docs(data_dir, split, limit_bytes=None):
    """The documents of one split, in order: [(source, text)]."""
    out, n = [], 0
    with open_text(find_split(data_dir, split)) as fh:
        for line in fh:
            if not line.strip():
                continue
            d = json.loads(line)
            out.append((d["source"], d["text"]))
            n += len(d["text"])
            if limit_bytes and n >= limit_bytes:
                break
    return out


def encode_stream(tok, docs):
    """One uint16 stream: BOS + ids(text) + EOS per document."""
    import numpy as np
    texts = [t for _, t in docs]
    parts = []
    for i in range(0, len(texts), 256):
        for enc in tok.encode_batch(texts[i:i + 256], add_special_tokens=False):
            parts.append(np.array([BOS_ID] + enc.ids + [EOS_ID], dtype=np.uint16))
    return np.concatenate(parts)


def load_tokenizer(d):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


# ------------------------------------------------------------------------------- safetensors
# (the format is a little-endian u64 header size, a JSON header, raw bytes; read and written
# here so that the tools need torch alone, not the safetensors package)

def _dt():
    import torch
    return {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32,
            "I64": torch.int64}


def st_load(path):
    import torch
    dt = _dt()
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        head = json.loads(fh.read(n))
        data = fh.read()
    out = {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=dt[e["dtype"]]) if b > a else \
            torch.empty(0, dtype=dt[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


def st_save(tensors, path):
    import torch
    rev = {v: k for k, v in _dt().items()}
    head, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        head[name] = {"dtype": rev[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)))
        fh.write(h)
        for b in blobs:
            fh.write(b)


def draw(z, T, gen=None):
    """(token, q): argmax and its one-hot at T <= 0, else a sample of q = softmax(z / T)."""
    import torch
    if T <= 0:
        t = int(torch.argmax(z))
        q = torch.zeros_like(z)
        q[t] = 1.0
        return t, q
    q = torch.softmax(z / T, -1)
    return int(torch.multinomial(q, 1, generator=gen)), q


# ------------------------------------------------------------------------------- model

def hf_config(cfg):
    from transformers import DeepseekV4Config
    c = DeepseekV4Config(**cfg)
    c._attn_implementation = "eager"
    c.use_cache = False
    return c


def set_hash_tables(model, cfg, seed=HASH_SEED):
    """HF initialises tid2eid to zeros (every token to expert 0, k times). Give each hash layer
    a real hash: k distinct experts per token id, from a seeded permutation per id."""
    import torch
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    g = torch.Generator().manual_seed(seed)
    for i, layer in enumerate(model.model.layers):
        if getattr(layer.mlp, "is_hash", False):
            rows = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(cfg["vocab_size"])])
            with torch.no_grad():
                layer.mlp.gate.tid2eid.copy_(rows.to(layer.mlp.gate.tid2eid.dtype))


def _fixtures():
    sys.path.insert(0, HERE)
    import make_fixtures  # noqa: E402  (tools/make_fixtures.py: upstream_names, storage_dtype)
    return make_fixtures


def storage_dtype(hf_name):
    return _fixtures().storage_dtype(hf_name, {})


def round_to_storage(module, prefix=""):
    """Round every float tensor to the dtype it is stored in (HF names, with prefix)."""
    import torch
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if "inv_freq" in name or not p.dtype.is_floating_point:
                continue
            p.copy_(p.to(storage_dtype(prefix + name)).to(p.dtype))


def count_params(module):
    return sum(p.numel() for p in module.parameters())


def target_upstream(model, cfg):
    """HF DeepseekV4ForCausalLM -> {upstream name: tensor in its stored dtype}."""
    fx = _fixtures()
    out = {}
    for name, t in model.state_dict().items():
        if "inv_freq" in name:
            continue
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        t = t.detach().to("cpu")
        if t.dtype.is_floating_point:
            t = t.to(storage_dtype(name))
        for n2, t2 in fx.upstream_names(name, t, cfg):
            out[n2] = t2.contiguous()
    return out


def hf_from_upstream(module, up, cfg, prefix_hf="", prefix_up=None):
    """Load upstream-named tensors `up` into an HF-named module. prefix_hf is prepended to the
    module's own names to form the HF name (e.g. "model.layers.0." for an MTP block);
    prefix_up maps the resulting "layers.0." to e.g. "mtp.0.". Returns the names used."""
    import torch
    fx = _fixtures()
    used = set()
    sd = module.state_dict()
    new = {}
    for name, t in sd.items():
        if "inv_freq" in name:
            continue
        hf = prefix_hf + name
        names = [n for n, _ in fx.upstream_names(hf, t.detach().cpu(), cfg)]
        if prefix_up:
            names = [prefix_up[1] + n[len(prefix_up[0]):] if n.startswith(prefix_up[0]) else n
                     for n in names]
        missing = [n for n in names if n not in up]
        if missing:
            raise KeyError(f"{hf}: missing {missing[:3]}")
        if hf.endswith("experts.gate_up_proj"):
            w1 = [up[n] for n in names if n.endswith("w1.weight")]
            w3 = [up[n] for n in names if n.endswith("w3.weight")]
            v = torch.stack([torch.cat([a, b], 0) for a, b in zip(w1, w3)])
        elif hf.endswith("experts.down_proj"):
            v = torch.stack([up[n] for n in names])
        else:
            assert len(names) == 1, (hf, names)
            v = up[names[0]]
        new[name] = v.to(t.dtype)
        used.update(names)
    module.load_state_dict(new, strict=False)
    return used


def legacy_config(cfg):
    """The upstream-style config.json a V4 release ships (legacy keys; + the MTP layer)."""
    rate = {SLIDING: 0, CSA: cfg["compress_rates"][CSA], HCA: cfg["compress_rates"][HCA]}
    drop = ("layer_types", "mlp_layer_types", "compress_rates", "partial_rotary_factor",
            "rope_parameters", "initializer_range")
    out = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
    out.update({k: v for k, v in cfg.items() if k not in drop})
    out["compress_ratios"] = [rate[t] for t in cfg["layer_types"]] + [MTP_COMPRESS_RATIO]
    out["compress_rate_csa"] = cfg["compress_rates"][CSA]
    out["compress_rate_hca"] = cfg["compress_rates"][HCA]
    out["num_hash_layers"] = cfg["mlp_layer_types"].count("hash_moe")
    out["qk_rope_head_dim"] = int(cfg["head_dim"] * cfg["partial_rotary_factor"])
    out["num_nextn_predict_layers"] = 1
    out["torch_dtype"] = "bfloat16"
    return out


def check_legacy_config(cfg):
    """HF must read the legacy config into the same layer types and ropes."""
    leg = {k: v for k, v in legacy_config(cfg).items() if k not in ("architectures", "torch_dtype")}
    try:
        a, b = hf_config(leg), hf_config(cfg)
    except Exception as ex:  # noqa: BLE001
        log("HF could not read the legacy config:", repr(ex))
        return False
    same = (a.layer_types == b.layer_types and a.mlp_layer_types == b.mlp_layer_types
            and a.rope_parameters == b.rope_parameters and a.compress_rates == b.compress_rates)
    if not same:
        log("legacy config differs: ", a.layer_types, a.mlp_layer_types, a.rope_parameters,
            "vs", b.layer_types, b.mlp_layer_types, b.rope_parameters)
    return same


def write_model_dir(out_dir, cfg, tensors, shard_bytes=12 << 20):
    """Sharded safetensors (each < shard_bytes), index, config.json, generation_config.json."""
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if re.match(r"model.*\.safetensors(\.index\.json)?$", f):
            os.remove(os.path.join(out_dir, f))

    def key(n):  # embed, layers in order, head, mtp last
        m = re.match(r"(layers|mtp)\.(\d+)\.", n)
        grp = 0 if n.startswith("embed") else 3 if n.startswith("mtp.") else 1 if m else 2
        return (grp, int(m.group(2)) if m else 0, n)

    names = sorted(tensors, key=key)
    shards, cur, size = [], [], 0
    for n in names:
        b = tensors[n].numel() * tensors[n].element_size()
        if cur and size + b > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += b
    shards.append(cur)
    weight_map = {}
    for i, group in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        st_save({n: tensors[n] for n in group}, os.path.join(out_dir, fn))
        for n in group:
            weight_map[n] = fn
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(legacy_config(cfg), fh, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
                   "do_sample": False, "max_length": CONTEXT}, fh, indent=1)
    return len(shards), total


def read_model_dir(d):
    """{upstream name: tensor} of a model directory (sharded or single file)."""
    load_file = st_load
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) \
        else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(load_file(os.path.join(d, f)))
    return out


def load_target(d=MODEL_DIR, cfg=None, device="cpu"):
    """The shipped target as an HF DeepseekV4ForCausalLM in fp32 (+ the raw upstream dict)."""
    import torch
    from transformers import DeepseekV4ForCausalLM
    if cfg is None:
        leg = json.load(open(os.path.join(d, "config.json")))
        cfg = TARGET if leg.get("hidden_size") == TARGET["hidden_size"] else SMOKE
    model = DeepseekV4ForCausalLM(hf_config(cfg)).float()
    up = read_model_dir(d)
    used = hf_from_upstream(model, up, cfg)
    rest = [n for n in up if n not in used and not n.startswith("mtp.")]
    if rest:
        raise KeyError(f"unused tensors in {d}: {rest[:5]}")
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                assert int(b.max()) < cfg["n_routed_experts"]
    return model.to(device).eval(), up, cfg
