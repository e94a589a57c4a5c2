#!/usr/bin/env python3
"""make_fixtures.py: oracle fixtures for Tandem's reference forward, from HF transformers.

Runs on the GPU box (torch 2.11, transformers 5.17), on its CPU in fp32:

    python3 tools/make_fixtures.py --out /tmp/fixtures [--debug /tmp/debug] [--released]

Builds three tiny random DeepseekV4ForCausalLM models that together cover every
layer type (sliding, CSA, HCA), hash_moe and moe layers, YaRN on the compress
rope, hc_mult 2..4, three router score functions, tied embeddings, shared-expert
biases and a firing SwiGLU clamp. Every parameter and buffer gets random
non-trivial values (HF initialises sinks, position biases, HC base/scale,
correction bias and tid2eid to constants, which hide bugs). Weights are rounded
to the dtype they are stored in (BF16 for matrices, F16 for some, F32 for the
modules HF keeps in fp32) and HF runs in fp32 on exactly those values.

Each fixture directory holds:
    config.json                       HF config (fixtures a, b) or a legacy
                                      upstream-style config (fixture c)
    model.safetensors | shards+index  HF layout (a, b) / upstream layout, sharded (c)
    ids.txt                           the token ids, whitespace separated
    logits.npy                        HF one-shot logits, float32 [n_ids, vocab]
    hf_extra.safetensors              rope inv_freq tables, the indexer's top-k picks per
                                      CSA layer (sorted ascending) and, for fixture a, the
                                      mean of the HC streams after every layer

A seed is accepted only when no indexer query and no router row has a near tie
at its top-k cut (relative gap > 2e-5), so that selection is well defined for
an engine whose rounding differs from torch's.

With --released, the upstream-layout fixtures are also written in DeepSeek's
released precision as d_released (released_formats.md 1.3, 1.8): before HF runs,
every weight the release quantizes (the attention's wq_a, wq_b, wkv, wo_a, wo_b,
the indexer's wq_b, the shared experts: FP8 with 128x128 e8m0 scales; the routed
experts: FP4 with per-32 scales) is replaced by its quantize-dequantize round
trip, so HF's fp32 logits are the oracle of the dequantized model; the checkpoint
is then written sharded with those weights as F8_E4M3 / I8 + F8_E8M0 `.scale`
(tools/make_quant_fixtures.py's quantizers; re-quantizing the dequantized values
gives them back exactly, which is checked), the rest BF16/F32 as the release
keeps them, the synthetic MTP layer quantized as well, and the config's
quantization_config and expert_dtype as released.
"""
import argparse
import json
import os
import re
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.activations import ACT2FN

FP32_KEEP = ("attn_hc", "ffn_hc", "hc_head", "sinks", "position_bias", "e_score_correction_bias",
             "q_a_norm", "kv_norm", "input_layernorm", "post_attention_layernorm", "model.norm")
SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"


def fixture_specs():
    score_c = "softmax" if "softmax" in ACT2FN else "sigmoid"
    return [
        dict(name="a_tiny_yarn", layout="hf", n_ids=300, cfg=dict(
            vocab_size=512, hidden_size=128, moe_intermediate_size=64, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=1, head_dim=64, q_lora_rank=64,
            partial_rotary_factor=0.25, layer_types=[SLIDING, CSA, HCA, CSA],
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            compress_rates={CSA: 4, HCA: 8}, sliding_window=8, o_groups=2, o_lora_rank=32,
            index_n_heads=8, index_head_dim=32, index_topk=8, n_routed_experts=8,
            num_experts_per_tok=2, n_shared_experts=1, scoring_func="sqrtsoftplus",
            routed_scaling_factor=1.5, swiglu_limit=10.0, hc_mult=4, hc_sinkhorn_iters=20,
            hc_eps=1e-6, rms_norm_eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_parameters={"rope_type": "yarn", "factor": 16.0,
                             "original_max_position_embeddings": 32, "beta_fast": 32.0,
                             "beta_slow": 1.0},
            max_position_embeddings=512, tie_word_embeddings=False)),
        dict(name="b_plain_hc2", layout="hf", n_ids=320, f16=("shared_experts",), cfg=dict(
            vocab_size=300, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32,
            partial_rotary_factor=0.25, layer_types=[CSA, SLIDING, HCA],
            mlp_layer_types=["hash_moe", "moe", "moe"], compress_rates={CSA: 4, HCA: 16},
            sliding_window=16, o_groups=2, o_lora_rank=16, index_n_heads=8, index_head_dim=16,
            index_topk=5, n_routed_experts=6, num_experts_per_tok=3, n_shared_experts=1,
            scoring_func="sigmoid", routed_scaling_factor=1.0, swiglu_limit=0.3, hc_mult=2,
            hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6, rope_theta=10000.0,
            compress_rope_theta=160000.0, max_position_embeddings=1024,
            tie_word_embeddings=True, mlp_bias=True)),
        dict(name="c_upstream_sharded", layout="upstream", n_ids=320, cfg=dict(
            vocab_size=384, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32,
            partial_rotary_factor=0.25, layer_types=[SLIDING, CSA, HCA, CSA],
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            compress_rates={CSA: 4, HCA: 128}, sliding_window=16, o_groups=2, o_lora_rank=16,
            index_n_heads=8, index_head_dim=16, index_topk=6, n_routed_experts=6,
            num_experts_per_tok=2, n_shared_experts=1, scoring_func=score_c,
            routed_scaling_factor=2.0, swiglu_limit=10.0, hc_mult=3, hc_sinkhorn_iters=20,
            hc_eps=1e-6, rms_norm_eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_parameters={"rope_type": "yarn", "factor": 16.0,
                             "original_max_position_embeddings": 64, "beta_fast": 32.0,
                             "beta_slow": 1.0},
            max_position_embeddings=1024, tie_word_embeddings=False)),
    ]


def legacy_config(cfg):
    """The upstream-style config.json a released checkpoint ships (legacy keys)."""
    rate = {SLIDING: 0, CSA: cfg["compress_rates"][CSA], HCA: cfg["compress_rates"][HCA]}
    out = {k: v for k, v in cfg.items() if k not in (
        "layer_types", "mlp_layer_types", "compress_rates", "partial_rotary_factor",
        "rope_parameters")}
    out["model_type"] = "deepseek_v4"
    out["architectures"] = ["DeepseekV4ForCausalLM"]
    out["compress_ratios"] = [rate[t] for t in cfg["layer_types"]] + [0]  # + the MTP layer
    out["compress_rate_csa"] = cfg["compress_rates"][CSA]
    out["compress_rate_hca"] = cfg["compress_rates"][HCA]
    out["num_hash_layers"] = cfg["mlp_layer_types"].count("hash_moe")
    out["qk_rope_head_dim"] = int(cfg["head_dim"] * cfg["partial_rotary_factor"])
    rp = dict(cfg["rope_parameters"])
    rp["type"] = rp.pop("rope_type")
    out["rope_scaling"] = rp
    out["num_nextn_predict_layers"] = 1
    return out


def randomize(model, cfg, gen):
    def normal(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=gen) * std + mean)

    k, E = cfg["num_experts_per_tok"], cfg["n_routed_experts"]
    seen = set()
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if "inv_freq" in name:
            continue
        seen.add(name)
        with torch.no_grad():
            if name.endswith("tid2eid"):
                rows = [torch.randperm(E, generator=gen)[:k] for _ in range(p.shape[0])]
                p.copy_(torch.stack(rows).to(p.dtype))
            elif name.endswith("e_score_correction_bias"):
                normal(p, 0.1)
            elif name.endswith("sinks"):
                normal(p, 1.0)
            elif name.endswith("position_bias"):
                normal(p, 0.5)
            elif name.endswith("_hc.fn") or name.endswith("hc_head.hc_fn"):
                normal(p, 0.05)
            elif name.endswith("_hc.base") or name.endswith("hc_base"):
                normal(p, 0.5)
            elif name.endswith("_hc.scale") or name.endswith("hc_scale"):
                normal(p, 0.3, 1.0)
            elif re.search(r"norm\.weight$", name):
                normal(p, 0.1, 1.0)
            elif name.endswith("embed_tokens.weight"):
                normal(p, 1.0)
            elif p.dtype.is_floating_point:
                normal(p, 0.05)
            else:
                raise SystemExit(f"unhandled tensor {name} {p.dtype}")
    return seen


def storage_dtype(name, spec):
    if any(s in name for s in FP32_KEEP):
        return torch.float32
    if name.endswith("tid2eid"):
        return torch.int64
    if any(s in name for s in spec.get("f16", ())):
        return torch.float16
    return torch.bfloat16


def round_to_storage(model, spec):
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in name or not p.dtype.is_floating_point:
                continue
            dt = storage_dtype(name, spec)
            p.copy_(p.to(dt).to(torch.float32))


def upstream_names(name, t, cfg):
    """HF name -> [(upstream name, tensor)], the mapping of dsv4.md section 2.3."""
    fixed = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
             "model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
             "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}
    if name in fixed:
        return [(fixed[name], t)]
    m = re.match(r"model\.layers\.(\d+)\.(.*)$", name)
    assert m, name
    i, rest = m.group(1), m.group(2)
    pre = f"layers.{i}."
    if rest == "mlp.experts.gate_up_proj":
        inter = cfg["moe_intermediate_size"]
        out = []
        for e in range(t.shape[0]):
            out.append((f"{pre}ffn.experts.{e}.w1.weight", t[e, :inter].contiguous()))
            out.append((f"{pre}ffn.experts.{e}.w3.weight", t[e, inter:].contiguous()))
        return out
    if rest == "mlp.experts.down_proj":
        return [(f"{pre}ffn.experts.{e}.w2.weight", t[e].contiguous()) for e in range(t.shape[0])]
    table = [
        ("input_layernorm.weight", "attn_norm.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("attn_hc.fn", "hc_attn_fn"), ("attn_hc.base", "hc_attn_base"),
        ("attn_hc.scale", "hc_attn_scale"), ("ffn_hc.fn", "hc_ffn_fn"),
        ("ffn_hc.base", "hc_ffn_base"), ("ffn_hc.scale", "hc_ffn_scale"),
        ("self_attn.q_a_proj.weight", "attn.wq_a.weight"),
        ("self_attn.q_a_norm.weight", "attn.q_norm.weight"),
        ("self_attn.q_b_proj.weight", "attn.wq_b.weight"),
        ("self_attn.kv_proj.weight", "attn.wkv.weight"),
        ("self_attn.kv_norm.weight", "attn.kv_norm.weight"),
        ("self_attn.o_a_proj.weight", "attn.wo_a.weight"),
        ("self_attn.o_b_proj.weight", "attn.wo_b.weight"),
        ("self_attn.sinks", "attn.attn_sink"),
        ("self_attn.compressor.indexer.q_b_proj.weight", "attn.indexer.wq_b.weight"),
        ("self_attn.compressor.indexer.scorer.weights_proj.weight",
         "attn.indexer.weights_proj.weight"),
        ("self_attn.compressor.indexer.kv_proj.weight", "attn.indexer.compressor.wkv.weight"),
        ("self_attn.compressor.indexer.gate_proj.weight", "attn.indexer.compressor.wgate.weight"),
        ("self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape"),
        ("self_attn.compressor.indexer.kv_norm.weight", "attn.indexer.compressor.norm.weight"),
        ("self_attn.compressor.kv_proj.weight", "attn.compressor.wkv.weight"),
        ("self_attn.compressor.gate_proj.weight", "attn.compressor.wgate.weight"),
        ("self_attn.compressor.position_bias", "attn.compressor.ape"),
        ("self_attn.compressor.kv_norm.weight", "attn.compressor.norm.weight"),
        ("mlp.gate.weight", "ffn.gate.weight"),
        ("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
        ("mlp.shared_experts.gate_proj.weight", "ffn.shared_experts.w1.weight"),
        ("mlp.shared_experts.up_proj.weight", "ffn.shared_experts.w3.weight"),
        ("mlp.shared_experts.down_proj.weight", "ffn.shared_experts.w2.weight"),
    ]
    for hf, up in table:
        if rest == hf:
            return [(pre + up, t)]
    if rest == "mlp.gate.tid2eid":
        return [(pre + "ffn.gate.tid2eid", t.to(torch.int32))]
    raise SystemExit(f"no upstream name for {name}")


def router_cut_gap(gate, logits):
    """The smallest gap, relative to the row's largest score, at a score router's top-k cut
    over the rows of its logits (selection scores: scores + correction bias)."""
    sc = gate.score_fn(logits) + gate.e_score_correction_bias
    row = torch.sort(sc, dim=-1, descending=True).values
    k = gate.top_k
    return ((row[:, k - 1] - row[:, k]) / (row.abs().max(dim=-1).values + 1e-6)).min().item()


class Recorder:
    """Forward hooks: indexer scores/top-k, router gaps, per-layer debug tensors."""

    def __init__(self, model, cfg):
        self.cfg = cfg
        self.min_gap_idx = float("inf")
        self.min_gap_router = float("inf")
        self.topk = {}
        self.debug = {}
        self.handles = []
        m = model.model
        for i, layer in enumerate(m.layers):
            self.handles.append(layer.register_forward_hook(self._save(f"layer{i}.out")))
            attn = layer.self_attn
            self.handles.append(attn.register_forward_hook(self._save(f"layer{i}.attn", 0)))
            self.handles.append(layer.mlp.register_forward_hook(self._save(f"layer{i}.mlp")))
            if attn.compressor is not None:
                self.handles.append(attn.compressor.register_forward_hook(
                    self._save(f"layer{i}.compressed", 0)))
                if hasattr(attn.compressor, "indexer"):
                    ix = attn.compressor.indexer
                    self.handles.append(ix.scorer.register_forward_hook(self._scores(i)))
                    self.handles.append(ix.register_forward_hook(self._picks(i)))
            if not layer.mlp.is_hash:
                self.handles.append(layer.mlp.gate.register_forward_hook(self._router(layer.mlp.gate)))

    def _save(self, key, idx=None):
        def hook(mod, inp, out):
            o = out[idx] if idx is not None else out
            self.debug[key] = o.detach().float().contiguous().clone()
        return hook

    def _scores(self, i):
        m, k = self.cfg["compress_rates"][CSA], self.cfg["index_topk"]

        def hook(mod, inp, out):
            s = out[0]  # [S, T]
            S, T = s.shape
            for t in range(S):
                valid = min((t + 1) // m, T)
                if valid <= k:
                    continue
                row = torch.sort(s[t, :valid], descending=True).values
                gap = (row[k - 1] - row[k]).item() / (row.abs().max().item() + 1e-6)
                self.min_gap_idx = min(self.min_gap_idx, gap)
        return hook

    def _picks(self, i):
        def hook(mod, inp, out):
            self.topk[f"layer{i}.topk"] = torch.sort(out[0], dim=-1).values.to(torch.int32)
        return hook

    def _router(self, gate):
        def hook(mod, inp, out):
            self.min_gap_router = min(self.min_gap_router, router_cut_gap(gate, out[0]))
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def build(spec, seed):
    cfg = spec["cfg"]
    hf_cfg = DeepseekV4Config(**cfg)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(hf_cfg).float().eval()
    gen = torch.Generator().manual_seed(seed)
    seen = randomize(model, cfg, gen)
    round_to_storage(model, spec)
    ids = torch.randint(0, cfg["vocab_size"], (1, spec["n_ids"]), generator=gen)
    return hf_cfg, model, ids, seen


def write_fixture(spec, hf_cfg, model, ids, logits, rec, out_dir):
    d = os.path.join(out_dir, spec["name"])
    os.makedirs(d, exist_ok=True)
    cfg = spec["cfg"]
    sd = {}
    for name, t in model.state_dict().items():
        if "inv_freq" in name:
            continue
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        sd[name] = t.to(storage_dtype(name, spec)).contiguous()
    if spec["layout"] == "hf":
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        hf_cfg.to_json_file(os.path.join(d, "config.json"), use_diff=False)
    else:
        up = {}
        for name, t in sd.items():
            for n2, t2 in upstream_names(name, t, cfg):
                up[n2] = t2.contiguous()
        gen = torch.Generator().manual_seed(7)
        D = cfg["hidden_size"]
        # an MTP block's head tensors, so the loader is seen keeping mtp.* for the drafters
        up["mtp.0.e_proj.weight"] = (torch.randn(D, D, generator=gen) * 0.05).to(torch.bfloat16)
        up["mtp.0.h_proj.weight"] = (torch.randn(D, D, generator=gen) * 0.05).to(torch.bfloat16)
        for n in ("enorm", "hnorm", "norm"):
            up[f"mtp.0.{n}.weight"] = 1 + 0.1 * torch.randn(D, generator=gen)
        names = sorted(up)
        shards = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
        keys = list(shards)
        weight_map = {}
        for j, n in enumerate(names):
            f = keys[j % 2]
            shards[f][n] = up[n]
            weight_map[n] = f
        for f, tensors in shards.items():
            save_file(tensors, os.path.join(d, f), metadata={"format": "pt"})
        total = sum(t.numel() * t.element_size() for t in up.values())
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=1)
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(legacy_config(cfg), fh, indent=1)
        try:  # HF's own reading of the legacy keys must agree with the modern ones
            legacy = {k: v for k, v in legacy_config(cfg).items() if k != "architectures"}
            lc = DeepseekV4Config(**legacy)
            same = (lc.layer_types == hf_cfg.layer_types and lc.mlp_layer_types == hf_cfg.mlp_layer_types
                    and lc.rope_parameters == hf_cfg.rope_parameters)
            print("legacy config read by HF equals the modern one:", same)
            if not same:
                print(" legacy:", lc.layer_types, lc.mlp_layer_types, lc.rope_parameters)
                print(" modern:", hf_cfg.layer_types, hf_cfg.mlp_layer_types, hf_cfg.rope_parameters)
        except Exception as ex:  # noqa: BLE001
            print("HF could not read the legacy config:", repr(ex))
    with open(os.path.join(d, "ids.txt"), "w") as fh:
        fh.write(" ".join(str(int(x)) for x in ids[0]) + "\n")
    np.save(os.path.join(d, "logits.npy"), logits.astype("<f4"))
    rot = model.model.rotary_emb
    extra = {"main_inv_freq": rot.main_inv_freq.float().contiguous(),
             "compress_inv_freq": rot.compress_inv_freq.float().contiguous()}
    extra.update({k: v.contiguous() for k, v in rec.topk.items()})
    if spec["name"].startswith("a_"):  # the mean of the HC streams after each layer (DSpark capture)
        for k, v in rec.debug.items():
            if k.endswith(".out"):
                extra[k[:-4] + ".stream_mean"] = v[0].mean(dim=1).contiguous()
    save_file(extra, os.path.join(d, "hf_extra.safetensors"))
    return d


# the HF parameters the release quantizes (released_formats.md 1.3): FP8 dense, FP4 experts
RELEASED_FP8 = ("self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight", "self_attn.kv_proj.weight",
                "self_attn.o_a_proj.weight", "self_attn.o_b_proj.weight",
                "self_attn.compressor.indexer.q_b_proj.weight", "mlp.shared_experts.gate_proj.weight",
                "mlp.shared_experts.up_proj.weight", "mlp.shared_experts.down_proj.weight")


def released_round_trip(model):
    """every weight the release quantizes, replaced by its quantize-dequantize round trip"""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_quant_fixtures import quant_fp4, quant_fp8
    n8 = n4 = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(RELEASED_FP8):
                p.copy_(quant_fp8(p.float())[2])
                n8 += 1
            elif name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                for e in range(p.shape[0]):  # per expert, along the input (last) dimension
                    p[e].copy_(quant_fp4(p[e].float())[2])
                    n4 += 1
    return n8, n4


def write_released(d, out_dir):
    """the fixture at d (upstream layout, its quantizable weights already round-tripped) in the
    released precision at out_dir/d_released, sharded as d is"""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_quant_fixtures import quant_fp4, quant_fp8, KEEP
    from safetensors.torch import load_file
    r = os.path.join(out_dir, "d_released")
    os.makedirs(r, exist_ok=True)
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    shards, n8, n4 = {}, 0, 0
    for f in sorted(set(index["weight_map"].values())):
        out = {}
        for name, t in load_file(os.path.join(d, f)).items():
            quantize = name.endswith(".weight") and t.dim() == 2 and not any(k in name for k in KEEP)
            if not quantize:
                out[name] = t
                continue
            w = t.float()
            if ".experts." in name and ".shared_experts." not in name:
                q, sc, deq = quant_fp4(w)
                n4 += 1
            else:
                q, sc, deq = quant_fp8(w)
                q = q.view(torch.float8_e4m3fn)
                n8 += 1
            if not name.startswith("mtp.") and not torch.equal(deq, w):
                raise SystemExit(f"{name}: re-quantizing its round trip changed it")
            out[name], out[name[:-len(".weight")] + ".scale"] = q, sc.view(torch.float8_e8m0fnu)
        shards[f] = out
        save_file(out, os.path.join(r, f), metadata={"format": "pt"})
    weight_map = {n: f for f, ts in shards.items() for n in ts}
    total = sum(t.numel() * t.element_size() for ts in shards.values() for t in ts.values())
    with open(os.path.join(r, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=1)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "scale_fmt": "ue8m0",
                                  "weight_block_size": [128, 128]}
    cfg["expert_dtype"] = "fp4"
    with open(os.path.join(r, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    for f in ("ids.txt", "logits.npy", "hf_extra.safetensors"):
        with open(os.path.join(d, f), "rb") as a, open(os.path.join(r, f), "wb") as b:
            b.write(a.read())
    print(f"d_released: {n8} FP8 and {n4} FP4 weights with their scales, written {r}")
    return r


def chunked_check(model, ids, chunks):
    """HF's own cached path over `chunks` must equal its one-shot forward."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    outs, pos = [], 0
    with torch.no_grad():
        for c in chunks:
            o = model(input_ids=ids[:, pos:pos + c], past_key_values=cache, use_cache=True)
            outs.append(o.logits[0])
            pos += c
    return torch.cat(outs, 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--debug", default=None, help="folder for per-layer debug tensors")
    ap.add_argument("--released", action="store_true",
                    help="also d_released: the upstream fixture in the released FP8/FP4 precision, "
                         "HF's logits of its dequantized weights as the oracle")
    args = ap.parse_args()
    torch.set_num_threads(8)
    os.makedirs(args.out, exist_ok=True)
    print("scoring funcs in ACT2FN:", [s for s in ("sqrtsoftplus", "sigmoid", "softmax") if s in ACT2FN])
    specs = fixture_specs()
    if args.released:  # the upstream fixture once more, its quantized weights round-tripped
        specs = [dict(s, name="d_tmp_released", released=True) for s in specs if s["layout"] == "upstream"]
    for spec in specs:
        for seed in range(40):
            hf_cfg, model, ids, seen = build(spec, seed)
            if spec.get("released"):
                n8, n4 = released_round_trip(model)
                print(f"{spec['name']}: {n8} FP8 and {n4} FP4 weights round-tripped")
            rec = Recorder(model, spec["cfg"])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].float()
            rec.remove()
            ok = rec.min_gap_idx > 2e-5 and rec.min_gap_router > 2e-5
            print(f"{spec['name']} seed {seed}: min indexer gap {rec.min_gap_idx:.3g}, "
                  f"min router gap {rec.min_gap_router:.3g} -> {'ok' if ok else 'retry'}")
            if ok:
                break
        else:
            raise SystemExit(f"{spec['name']}: no seed without near ties")
        d = write_fixture(spec, hf_cfg, model, ids, logits.numpy(), rec, args.out)
        if spec.get("released"):
            write_released(d, args.out)
            import shutil
            shutil.rmtree(d)  # (the bf16 copy it was made from)
        n = ids.shape[1]
        chunks = [37] + [1] * 12 + [5] + [1] * 10
        chunks.append(n - sum(chunks))
        inc = chunked_check(model, ids, chunks)
        print(f"{spec['name']}: tensors randomised {len(seen)}; max|logit| {logits.abs().max():.3f}; "
              f"HF chunked vs one-shot max|d| {(inc - logits).abs().max().item():.3g}; written {d}")
        if args.debug and spec["name"].startswith("a_"):
            os.makedirs(args.debug, exist_ok=True)
            save_file({k: v[0].contiguous() for k, v in rec.debug.items()},
                      os.path.join(args.debug, f"debug_{spec['name']}.safetensors"))
    if "softmax" not in ACT2FN:
        print("note: ACT2FN has no 'softmax'; fixture c uses sigmoid")


if __name__ == "__main__":
    sys.exit(main())
