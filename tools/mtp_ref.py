#!/usr/bin/env python3
"""mtp_ref.py: PyTorch reference of the DeepSeek-V4 MTP drafter (mtp.0.*), drafters.md 4.2/4.3.

One MTP step, for rows at positions q with previous HC residual H_q (hc copies of D) and
input token t_{q+1}:

    e   = enorm(Emb(t_{q+1}))                  zeroed where q == 0
    Z   = h_proj(hnorm(H_q)) + e_proj(e)       hnorm/h_proj per copy, e broadcast over copies
    H'  = V4 block(Z)                          one HF DeepseekV4DecoderLayer: mHC, sliding-window
                                               attention only (window W, sinks, grouped output),
                                               score-routed MoE (+ shared expert)
    logits = head(norm(hc_head(H')))           the target's head; MTP's own hc_head and norm

H_q at step 1 is the target's final-layer HC residual stream before its hc_head. For k > 1 the
output stream H' of step j is recycled as step j+1's H (at position q+1, input token = draft j).

Attention: every row is one MTP KV entry at its own position; a row at position p sees the
entries at positions p-W+1 .. p (a sliding window over the rows given, which must be in
increasing position order with no gaps, as in the engine: catch-up rows, then one row per
chain step). The module is stateless: callers pass all rows of the window each time.

Weights: embed/head are the target's (not stored here). Stored tensors, upstream names:
mtp.0.{enorm,hnorm,norm}.weight (fp32), mtp.0.{e_proj,h_proj}.weight (bf16),
mtp.0.hc_head_{fn,base,scale} (fp32), and the block as mtp.0.{attn_norm, ffn_norm, attn.*,
ffn.*, hc_attn_*, hc_ffn_*} in the layout of tools/make_fixtures.py's upstream_names().
"""
import copy
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402


def block_config(cfg):
    """The config of the MTP block: one sliding-attention, score-routed MoE layer."""
    c = dict(cfg, num_hidden_layers=1, layer_types=[tt.SLIDING], mlp_layer_types=["moe"])
    return c


def sliding_mask(pos_q, pos_k, window):
    """Additive mask [B, 1, Sq, Sk]: key visible iff pos_q - window < pos_k <= pos_q."""
    d = pos_q[:, :, None] - pos_k[:, None, :]
    ok = (d >= 0) & (d < window)
    m = torch.zeros(ok.shape, dtype=torch.float32, device=pos_q.device)
    return m.masked_fill(~ok, float("-inf"))[:, None]


class V4MTP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
            DeepseekV4DecoderLayer, DeepseekV4HyperHead, DeepseekV4RMSNorm, DeepseekV4RotaryEmbedding)
        self.cfg = dict(cfg)
        self.bcfg = block_config(cfg)
        hc = tt.hf_config(self.bcfg)
        D, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.hc_mult, self.window = cfg["hc_mult"], cfg["sliding_window"]
        self.enorm = DeepseekV4RMSNorm(D, eps=eps)
        self.hnorm = DeepseekV4RMSNorm(D, eps=eps)
        self.e_proj = nn.Linear(D, D, bias=False)
        self.h_proj = nn.Linear(D, D, bias=False)
        self.block = DeepseekV4DecoderLayer(hc, 0)
        self.hc_head = DeepseekV4HyperHead(hc)
        self.norm = DeepseekV4RMSNorm(D, eps=eps)
        self.rotary = DeepseekV4RotaryEmbedding(hc)

    # ---------------------------------------------------------------- init
    @torch.no_grad()
    def init_from_target(self, target, seed=0):
        """Block <- the target's last layer (same names minus its compressor), hc_head <- the
        target's hc_head, norms 1, e_proj/h_proj N(0, initializer_range)."""
        src = dict(target.model.layers[-1].named_parameters())
        src.update(dict(target.model.layers[-1].named_buffers()))
        for name, p in list(self.block.named_parameters()) + list(self.block.named_buffers()):
            if "inv_freq" in name:
                continue
            if name not in src or src[name].shape != p.shape:
                raise KeyError(f"MTP block tensor {name} has no match in the target's last layer")
            p.copy_(src[name].to(p.dtype))
        for a, b in ((self.hc_head.hc_fn, target.model.hc_head.hc_fn),
                     (self.hc_head.hc_base, target.model.hc_head.hc_base),
                     (self.hc_head.hc_scale, target.model.hc_head.hc_scale),
                     (self.norm.weight, target.model.norm.weight)):
            a.copy_(b.to(a.dtype))
        g = torch.Generator().manual_seed(seed)
        std = self.cfg.get("initializer_range", 0.02)
        for lin in (self.e_proj, self.h_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * std)
        self.enorm.weight.fill_(1.0)
        self.hnorm.weight.fill_(1.0)

    # ---------------------------------------------------------------- forward
    def forward(self, h_prev, next_ids, positions, embed, head, return_hidden=False):
        """h_prev [B, S, hc, D]; next_ids [B, S] (the token after each row's position);
        positions [B, S] (increasing, contiguous). Returns logits [B, S, V] and H' [B, S, hc, D]."""
        e = self.enorm(embed(next_ids))
        e = e * (positions != 0).unsqueeze(-1).to(e.dtype)
        z = self.h_proj(self.hnorm(h_prev)) + self.e_proj(e).unsqueeze(2)
        z = z.float() if z.dtype != torch.float32 else z
        pe = {"main": self.rotary(z[:, :, 0], position_ids=positions, layer_type="main")}
        pe["compress"] = pe["main"]
        mask = sliding_mask(positions, positions, self.window)
        h_out = self.block(z, position_embeddings=pe, position_ids=positions, attention_mask=mask,
                           input_ids=next_ids, past_key_values=None)
        y = self.norm(self.hc_head(h_out))
        logits = head(y)
        return (logits, h_out, y) if return_hidden else (logits, h_out)

    # ---------------------------------------------------------------- weights
    def upstream_state(self):
        """{mtp.0.* upstream name: tensor in its stored dtype}."""
        fx = tt._fixtures()
        out = {}
        for name, t in self.state_dict().items():
            if "inv_freq" in name or name.startswith("rotary."):
                continue
            t = t.detach().cpu()
            if name.startswith("block."):
                hf = "model.layers.0." + name[len("block."):]
                if t.dtype.is_floating_point:
                    t = t.to(tt.storage_dtype(hf))
                for n2, t2 in fx.upstream_names(hf, t, self.bcfg):
                    assert n2.startswith("layers.0."), n2
                    out["mtp.0." + n2[len("layers.0."):]] = t2.contiguous()
            elif name.startswith("hc_head."):
                out["mtp.0.hc_head_" + name[len("hc_head.hc_"):]] = t.float().contiguous()
            elif name in ("enorm.weight", "hnorm.weight", "norm.weight"):
                out["mtp.0." + name] = t.float().contiguous()
            elif name in ("e_proj.weight", "h_proj.weight"):
                out["mtp.0." + name] = t.to(torch.bfloat16).contiguous()
            else:
                raise KeyError(f"no upstream name for MTP tensor {name}")
        return out

    @torch.no_grad()
    def load_upstream(self, up):
        """Load mtp.0.* tensors (upstream names) into this module."""
        tt.hf_from_upstream(self.block, up, self.bcfg, prefix_hf="model.layers.0.",
                            prefix_up=("layers.0.", "mtp.0."))
        self.hc_head.hc_fn.copy_(up["mtp.0.hc_head_fn"].float())
        self.hc_head.hc_base.copy_(up["mtp.0.hc_head_base"].float())
        self.hc_head.hc_scale.copy_(up["mtp.0.hc_head_scale"].float())
        for n in ("enorm", "hnorm", "norm", "e_proj", "h_proj"):
            getattr(self, n).weight.copy_(up[f"mtp.0.{n}.weight"].float())

    @torch.no_grad()
    def round_to_storage(self):
        for name, p in self.named_parameters():
            if name.startswith("block."):
                dt = tt.storage_dtype("model.layers.0." + name[len("block."):])
            elif name.startswith(("hc_head.", "enorm.", "hnorm.", "norm.")):
                dt = torch.float32
            else:
                dt = torch.bfloat16
            p.copy_(p.to(dt).to(p.dtype))


def load_mtp(model_dir=tt.MODEL_DIR, cfg=None, up=None):
    if up is None:
        up = tt.read_model_dir(model_dir)
    m = V4MTP(cfg or tt.TARGET).float()
    m.load_upstream(up)
    return m.eval()


class TargetTap:
    """Forward hooks on an HF DeepseekV4ForCausalLM: the final HC residual stream before
    hc_head ([B, S, hc, D], for MTP) and the HC streams of chosen layers (for DSpark)."""

    def __init__(self, model, layers=()):
        self.h_final = None
        self.layer_out = {}
        self.handles = [model.model.hc_head.register_forward_pre_hook(self._pre)]
        for i in layers:
            self.handles.append(model.model.layers[i].register_forward_hook(self._post(i)))

    def _pre(self, mod, args):
        self.h_final = args[0]

    def _post(self, i):
        def hook(mod, inp, out):
            self.layer_out[i] = out
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def mtp_chain(mtp, target, h_rows, ids_rows, pos0, k, temperature=0.0, gen=None):
    """Draft k tokens for one sequence (batch 1), as the engine does (drafters.md 4.3).

    h_rows [n, hc, D]: the target HC residual of the committed rows at positions pos0..pos0+n-1
    (the last of them is the row whose target output produced the bonus token);
    ids_rows [n]: the token after each of those rows (the last is the bonus token).
    Step 1 runs all n rows and drafts from the last; steps 2..k append one row each, with the
    previous step's output stream and draft. Returns (drafts [k], q [k, V] fp32 draft
    distributions (one-hot at T = 0), step logits [k, V])."""
    embed, head = target.model.embed_tokens, target.lm_head
    h = h_rows.unsqueeze(0)
    ids = ids_rows.unsqueeze(0)
    pos = torch.arange(pos0, pos0 + h.shape[1], device=h.device).unsqueeze(0)
    drafts, qs, logits_all = [], [], []
    for j in range(k):
        logits, h_out = mtp(h, ids, pos, embed, head)
        lg = logits[0, -1].float()
        d, q = tt.draw(lg, temperature, gen)
        drafts.append(d)
        qs.append(q)
        logits_all.append(lg)
        # next step: one more row at position +1 carrying the recycled stream and the draft
        h = torch.cat([h, h_out[:, -1:]], 1)
        ids = torch.cat([ids, torch.tensor([[d]], device=ids.device)], 1)
        pos = torch.cat([pos, pos[:, -1:] + 1], 1)
    return drafts, torch.stack(qs), torch.stack(logits_all)


__all__ = ["V4MTP", "TargetTap", "mtp_chain", "load_mtp", "block_config", "sliding_mask"]
