#!/usr/bin/env python3
"""dspark_ref.py: PyTorch reference of the DeepSeek-V4 DSpark drafter (mtp.{0..S-1}.*),
drafters.md sections 1.5, 1.6 and 2. Plain torch (1.13 or later), no transformers: it runs
where only Debian's python3-torch is installed; the target's side (capture rows, logits) comes
from Tandem's own forward (tools/dspark_data.py, `tandem logits --capture`).

One round, for a sequence whose committed tokens occupy positions 0 .. P-1 and whose anchor
x_0 (the last token the target produced, not yet run through it) sits at position P:

  context   every committed row p carries c_p = concat over the capture layers of the mean of
            the target's HC streams after that layer (3 layers -> 3D values);
            main_x_p = main_norm(main_proj(c_p))                      (stage 0 owns these)
  stage s   keys (= values) of context row p: rope_p(kv_norm_s(wkv_s main_x_p)), no attn_norm;
            the last W (sliding_window) of them form the stage's ring
  block     ids [x_0, noise x (gamma-1)] at positions P .. P+gamma-1, embedded with the
            target's embedding and copied into the hc streams; each stage is one V4 block
            (mHC with Sinkhorn, attn_norm, low-rank q with the per-head unweighted norm, shared
            K = V, sinks, inverse rope, grouped output; mHC, ffn_norm, score-routed MoE +
            shared expert) whose attention is NON-CAUSAL: every block row sees the W context
            keys before P and all gamma block keys (the block's own keys come from its normed
            input, as in the target)
  head      y = hc_head(X) (the last stage owns hc_head and norm); U = head(norm(y)) with the
            target's head; slot k (0-based) predicts the token at P + k + 1
  Markov    e(x) = W1[x] (rank r); Z_k = U_k + W2 e(p_k) where p_k, slot k's predecessor, is
            the token drawn for slot k-1 (slot 0: the anchor); q_k = softmax(Z_k / T)
            (one-hot argmax at T = 0); slot k's draft is drawn from q_k
  confidence c_k = sigmoid(w . [y_k ; e(p_k)]): known before slot k's draft is drawn

Every op follows ../shared/design/dsv4.md as HF transformers' DeepseekV4 implements it (the C
reference forward matches HF to ~1e-6; tests/test_dspark.c checks this module's fixtures
against the C drafter, which reuses the C forward).

Stored tensors (upstream names; S stages, the last one L = S-1), dtypes as V4 stores them:
  mtp.0.main_proj.weight [D, m*D] bf16, mtp.0.main_norm.weight [D] fp32
  mtp.s.{attn_norm, ffn_norm}.weight fp32, mtp.s.hc_{attn,ffn}_{fn,base,scale} fp32,
  mtp.s.attn.{wq_a, wq_b, wkv, wo_a, wo_b}.weight bf16, mtp.s.attn.{q_norm, kv_norm}.weight
  fp32, mtp.s.attn.attn_sink fp32, mtp.s.ffn.gate.weight bf16, mtp.s.ffn.gate.bias fp32,
  mtp.s.ffn.experts.E.{w1,w2,w3}.weight bf16, mtp.s.ffn.shared_experts.{w1,w2,w3}.weight bf16
  mtp.L.hc_head_{fn,base,scale} fp32, mtp.L.norm.weight fp32
  mtp.L.markov_head.markov_w1.weight [V, r] bf16, mtp.L.markov_head.markov_w2.weight [V, r] bf16
  mtp.L.confidence_head.proj.weight [1, D + r] fp32 (no bias, as V4 stores it)
The embedding and head are the target's. dspark/config.json holds DSPARK's keys.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402
from tandem_tiny import read_model_dir, st_load, st_save  # noqa: E402

DSPARK = dict(dspark_block_size=5, dspark_noise_token_id=tt.NOISE_ID, dspark_markov_rank=64,
              dspark_target_layer_ids=[3, 4, 5], dspark_num_stages=3)

# ------------------------------------------------------------------------------- V4 pieces

def rms(x, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * rms(x, self.eps)


def rope_tables(pos, rot, theta):
    """cos, sin [.., rot/2] at integer positions pos [..]."""
    inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float32, device=pos.device) / rot))
    f = pos.float()[..., None] * inv
    return f.cos(), f.sin()


def rope(x, cos, sin, inverse=False):
    """V4 interleaved rope on the trailing 2 * cos.shape[-1] dims of x [B, S, d] or
    [B, S, H, d]; cos/sin [B, S, rot/2] (broadcast over the head axis)."""
    rot = 2 * cos.shape[-1]
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    if inverse:
        sin = -sin
    nope, r = x[..., :-rot], x[..., -rot:].float()
    a, b = r[..., 0::2], r[..., 1::2]
    out = torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2)
    return torch.cat([nope, out.to(x.dtype)], -1)


class HyperConnection(nn.Module):
    """mHC: pre/post/comb from the flattened streams; comb by Sinkhorn (dsv4.md 3.2)."""

    def __init__(self, c):
        super().__init__()
        nc, D = c["hc_mult"], c["hidden_size"]
        self.nc, self.iters, self.eps, self.rms_eps = nc, c["hc_sinkhorn_iters"], c["hc_eps"], c["rms_norm_eps"]
        self.fn = nn.Parameter(torch.zeros((2 + nc) * nc, nc * D))
        self.base = nn.Parameter(torch.zeros((2 + nc) * nc))
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, X):
        nc = self.nc
        mix = rms(X.flatten(-2), self.rms_eps) @ self.fn.float().t()
        pw, qw, cw = mix.split([nc, nc, nc * nc], -1)
        pb, qb, cb = self.base.split([nc, nc, nc * nc])
        pre = torch.sigmoid(pw * self.scale[0] + pb) + self.eps
        post = 2 * torch.sigmoid(qw * self.scale[1] + qb)
        comb = torch.softmax(cw.view(*cw.shape[:-1], nc, nc) * self.scale[2] + cb.view(nc, nc), -1) + self.eps
        comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        return post, comb, (pre.unsqueeze(-1) * X).sum(-2)


def hc_post(X, out, post, comb):
    return post.unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), X)


class HyperHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        nc, D = c["hc_mult"], c["hidden_size"]
        self.eps, self.rms_eps = c["hc_eps"], c["rms_norm_eps"]
        self.fn = nn.Parameter(torch.zeros(nc, nc * D))
        self.base = nn.Parameter(torch.zeros(nc))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, X):
        mix = rms(X.flatten(-2), self.rms_eps) @ self.fn.float().t()
        pre = torch.sigmoid(mix * self.scale + self.base) + self.eps
        return (pre.unsqueeze(-1) * X).sum(-2)


class Attention(nn.Module):
    """V4 sliding attention of a DSpark stage: keys = [context keys given ; the block's own]."""

    def __init__(self, c):
        super().__init__()
        D, H, hd, rq = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
        g, ro = c["o_groups"], c["o_lora_rank"]
        self.H, self.hd, self.g, self.eps = H, hd, g, c["rms_norm_eps"]
        self.rot = int(hd * c["partial_rotary_factor"])
        self.theta = c["rope_theta"]
        self.wq_a = nn.Linear(D, rq, bias=False)
        self.q_norm = RMSNorm(rq, self.eps)
        self.wq_b = nn.Linear(rq, H * hd, bias=False)
        self.wkv = nn.Linear(D, hd, bias=False)
        self.kv_norm = RMSNorm(hd, self.eps)
        self.wo_a = nn.Parameter(torch.zeros(g * ro, H * hd // g))
        self.wo_b = nn.Linear(g * ro, D, bias=False)
        self.attn_sink = nn.Parameter(torch.zeros(H))

    def keys(self, x, cos, sin):
        """x [B, S, D] -> keys [B, S, hd] (kv_norm, rope)."""
        return rope(self.kv_norm(self.wkv(x)), cos, sin)

    def forward(self, x, cos, sin, ctx_keys, ctx_mask):
        """x [B, G, g, D]: G blocks of g normed rows; cos/sin [B, G, g, rot/2] at the block
        positions; ctx_keys [B, G, Kc, hd] the context keys each block sees, ctx_mask
        [B, G, Kc] additive (-inf: absent) or None. Every row of a block sees its block's
        context keys and all g rows of the block. Returns [B, G, g, D]."""
        B, G, S, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, G, S, self.H, self.hd)
        q = rope(rms(q, self.eps), cos, sin)                                 # [B, G, g, H, hd]
        k = torch.cat([ctx_keys, self.keys(x, cos, sin)], 2)                 # [B, G, Kc+g, hd]
        s = torch.einsum("bgshd,bgkd->bghsk", q, k) * self.hd ** -0.5
        if ctx_mask is not None:
            s = s + F.pad(ctx_mask, (0, S))[:, :, None, None, :]
        sink = self.attn_sink.float().view(1, 1, -1, 1, 1).expand(B, G, -1, S, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
        o = torch.einsum("bghsk,bgkd->bgshd", p, k)
        o = rope(o, cos, sin, inverse=True)                                  # V carried rope
        og = o.reshape(B, G, S, self.g, -1)
        w = self.wo_a.view(self.g, -1, og.shape[-1])                         # [g, ro, in_g]
        return self.wo_b(torch.einsum("bnsgi,goi->bnsgo", og, w).flatten(-2))


SCORES = {"sqrtsoftplus": lambda z: torch.sqrt(F.softplus(z)), "sigmoid": torch.sigmoid,
          "softmax": lambda z: torch.softmax(z, -1)}


class MoE(nn.Module):
    """Score-routed MoE (the config's scoring function, correction bias for selection only,
    normalised weights times routed scaling, SwiGLU with clamps) plus the shared expert (with
    biases when the config has mlp_bias)."""

    def __init__(self, c):
        super().__init__()
        D, I, E = c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]
        self.k, self.E, self.limit, self.scaling = c["num_experts_per_tok"], E, c["swiglu_limit"], c["routed_scaling_factor"]
        self.score = SCORES[c.get("scoring_func", "sqrtsoftplus")]
        bias = bool(c.get("mlp_bias", False))
        self.gate = nn.Linear(D, E, bias=False)
        self.register_buffer("bias", torch.zeros(E))
        self.w1 = nn.Parameter(torch.zeros(E, I, D))
        self.w3 = nn.Parameter(torch.zeros(E, I, D))
        self.w2 = nn.Parameter(torch.zeros(E, D, I))
        self.sh_w1 = nn.Linear(D, I, bias=bias)
        self.sh_w3 = nn.Linear(D, I, bias=bias)
        self.sh_w2 = nn.Linear(I, D, bias=bias)
        self.last_picks = None

    def swiglu(self, g, u):
        return F.silu(g.clamp(max=self.limit)) * u.clamp(-self.limit, self.limit)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = self.score(self.gate(x).float())
        picks = torch.topk(scores + self.bias, self.k, -1).indices
        w = scores.gather(1, picks)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * self.scaling
        self.last_picks = picks.detach()
        out = torch.zeros_like(x)
        for e in range(self.E):
            rows, slot = torch.where(picks == e)
            if rows.numel() == 0:
                continue
            xe = x[rows]
            h = self.swiglu(xe @ self.w1[e].t(), xe @ self.w3[e].t())
            out = out.index_add(0, rows, (h @ self.w2[e].t()) * w[rows, slot, None])
        sh = self.sh_w2(self.swiglu(self.sh_w1(x), self.sh_w3(x)))
        return (out + sh).view(shape)


class Stage(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, eps = c["hidden_size"], c["rms_norm_eps"]
        self.hc_attn, self.hc_ffn = HyperConnection(c), HyperConnection(c)
        self.attn_norm, self.ffn_norm = RMSNorm(D, eps), RMSNorm(D, eps)
        self.attn = Attention(c)
        self.ffn = MoE(c)

    def forward(self, X, cos, sin, ctx_keys, ctx_mask):
        post, comb, x = self.hc_attn(X)
        X = hc_post(X, self.attn(self.attn_norm(x), cos, sin, ctx_keys, ctx_mask), post, comb)
        post, comb, x = self.hc_ffn(X)
        return hc_post(X, self.ffn(self.ffn_norm(x)), post, comb)


# stage parameter -> upstream suffix (experts are split per expert on export)
STAGE_NAMES = {
    "hc_attn.fn": "hc_attn_fn", "hc_attn.base": "hc_attn_base", "hc_attn.scale": "hc_attn_scale",
    "hc_ffn.fn": "hc_ffn_fn", "hc_ffn.base": "hc_ffn_base", "hc_ffn.scale": "hc_ffn_scale",
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "attn.wq_a.weight": "attn.wq_a.weight", "attn.q_norm.weight": "attn.q_norm.weight",
    "attn.wq_b.weight": "attn.wq_b.weight", "attn.wkv.weight": "attn.wkv.weight",
    "attn.kv_norm.weight": "attn.kv_norm.weight", "attn.wo_a": "attn.wo_a.weight",
    "attn.wo_b.weight": "attn.wo_b.weight", "attn.attn_sink": "attn.attn_sink",
    "ffn.gate.weight": "ffn.gate.weight", "ffn.bias": "ffn.gate.bias",
    "ffn.sh_w1.weight": "ffn.shared_experts.w1.weight", "ffn.sh_w3.weight": "ffn.shared_experts.w3.weight",
    "ffn.sh_w2.weight": "ffn.shared_experts.w2.weight",
    "ffn.sh_w1.bias": "ffn.shared_experts.w1.bias", "ffn.sh_w3.bias": "ffn.shared_experts.w3.bias",
    "ffn.sh_w2.bias": "ffn.shared_experts.w2.bias",
}
FP32_SUFFIX = ("hc_", "norm.weight", "attn_sink", "gate.bias", "confidence_head")


def stored_dtype(up_name):
    return torch.float32 if any(s in up_name for s in FP32_SUFFIX) else torch.bfloat16


def window_index(anchors, window):
    """[B, A, W]: the context positions a-W .. a-1 the block of anchor a sees (-1: before 0)."""
    idx = anchors[:, :, None] - window + torch.arange(window, device=anchors.device)
    return torch.where(idx >= 0, idx, torch.full_like(idx, -1))


class V4DSpark(nn.Module):
    def __init__(self, cfg, dcfg=DSPARK):
        super().__init__()
        c = dict(cfg)
        if "partial_rotary_factor" not in c:  # an upstream config.json
            c["partial_rotary_factor"] = c["qk_rope_head_dim"] / c["head_dim"]
        self.cfg, self.dcfg = c, dict(dcfg)
        D, eps, V = c["hidden_size"], c["rms_norm_eps"], c["vocab_size"]
        m, r = len(dcfg["dspark_target_layer_ids"]), dcfg["dspark_markov_rank"]
        self.gamma, self.window, self.hc_mult = dcfg["dspark_block_size"], c["sliding_window"], c["hc_mult"]
        self.noise = dcfg["dspark_noise_token_id"]
        self.main_proj = nn.Linear(m * D, D, bias=False)
        self.main_norm = RMSNorm(D, eps)
        self.stages = nn.ModuleList([Stage(c) for _ in range(dcfg["dspark_num_stages"])])
        self.hc_head = HyperHead(c)
        self.norm = RMSNorm(D, eps)
        self.markov_w1 = nn.Parameter(torch.zeros(V, r))
        self.markov_w2 = nn.Parameter(torch.zeros(V, r))
        self.confidence = nn.Parameter(torch.zeros(1, D + r))

    # ---------------------------------------------------------------- init
    @torch.no_grad()
    def init_from_target(self, up, seed=0):
        """Stage s <- target layer N-S+s (upstream tensors up; its compressor and indexer are
        not used), hc_head/norm <- the target's, main_proj <- the average of the captured
        layers, Markov W1 ~ N(0, 0.02), W2 = 0 (no bias at first), confidence 0 (c = 0.5)."""
        n_t = 1 + max(int(k.split(".")[1]) for k in up if k.startswith("layers."))
        S = len(self.stages)
        for s in range(S):
            self.load_stage(s, up, f"layers.{n_t - S + s}.")
        self.hc_head.fn.copy_(up["hc_head_fn"].float())
        self.hc_head.base.copy_(up["hc_head_base"].float())
        self.hc_head.scale.copy_(up["hc_head_scale"].float())
        self.norm.weight.copy_(up["norm.weight"].float())
        D = self.cfg["hidden_size"]
        m = self.main_proj.weight.shape[1] // D
        self.main_proj.weight.copy_(torch.eye(D).repeat(1, m) / m)
        g = torch.Generator().manual_seed(seed)
        self.markov_w1.copy_(torch.randn(self.markov_w1.shape, generator=g) * 0.02)
        self.markov_w2.zero_()
        self.confidence.zero_()

    @torch.no_grad()
    def init_random(self, seed=0, std=0.05):
        """Random weights for fixture configurations (every tensor nonzero)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith(("norm.weight", "scale")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
        for st in self.stages:
            st.ffn.bias.copy_(torch.randn(st.ffn.bias.shape, generator=g) * 0.1)

    @torch.no_grad()
    def load_stage(self, s, up, pre):
        st = self.stages[s]
        for name, p in list(st.named_parameters()) + list(st.named_buffers()):
            if name in ("ffn.w1", "ffn.w2", "ffn.w3"):
                w = name.split(".")[1]
                p.copy_(torch.stack([up[f"{pre}ffn.experts.{e}.{w}.weight"].float()
                                     for e in range(p.shape[0])]))
            else:
                p.copy_(up[pre + STAGE_NAMES[name]].float().view(p.shape))

    # ---------------------------------------------------------------- forward
    def context(self, cap):
        """cap [B, S, m*D] captured target rows -> main_x [B, S, D]."""
        return self.main_norm(self.main_proj(cap))

    def block(self, main_x, ctx_pos, block_ids, block_pos, embed, ctx_index=None):
        """main_x [B, Sc, D] context rows at positions ctx_pos [B, Sc]; G blocks per sequence:
        block_ids, block_pos [B, G, g]; ctx_index [B, G, Kc] the context rows (indices into
        Sc, -1: none) each block sees, or None: all Sc rows; embed [V, D].
        Returns y = hc_head(streams) [B, G, g, D] (before the norm)."""
        c = self.cfg
        rot = int(c["head_dim"] * c["partial_rotary_factor"])
        B, G = block_ids.shape[:2]
        X = embed[block_ids].float().unsqueeze(-2).expand(-1, -1, -1, self.hc_mult, -1)
        cc, sc = rope_tables(ctx_pos, rot, c["rope_theta"])
        cb, sb = rope_tables(block_pos, rot, c["rope_theta"])
        mask = None
        if ctx_index is not None:
            gidx = ctx_index.clamp(min=0)
            mask = torch.zeros(ctx_index.shape, device=ctx_index.device).masked_fill(ctx_index < 0,
                                                                             float("-inf"))
        for st in self.stages:
            keys = st.attn.keys(main_x, cc, sc)                               # [B, Sc, hd]
            if ctx_index is None:
                ck = keys[:, None].expand(-1, G, -1, -1)
            else:  # rows of the flattened [B * Sc, hd] keys
                Sc = keys.shape[1]
                flat = gidx + Sc * torch.arange(B, device=gidx.device).view(B, 1, 1)
                ck = keys.reshape(B * Sc, -1)[flat]
            X = st(X, cb, sb, ck, mask)
        return self.hc_head(X)

    def base_logits(self, y, head):
        return self.norm(y) @ head.float().t()

    def markov(self, U, y, prev):
        """U [.., V], y [.., D], prev [..] predecessor ids -> (Z, confidence logits)."""
        e = self.markov_w1[prev]
        Z = U + e @ self.markov_w2.t()
        return Z, (torch.cat([y.float(), e.float()], -1) @ self.confidence.t()).squeeze(-1)

    # ---------------------------------------------------------------- one round (inference)
    @torch.no_grad()
    def round(self, cap_rows, anchor, embed, head, temperature=0.0, gen=None, chain=None):
        """One draft round for one sequence, statelessly. cap_rows [P, m*D]: the captured rows
        of positions 0 .. P-1 (only the last W are read); anchor: the token at P.
        Returns dict: drafts [g], q [g, V] (what each draft was drawn from), U [g, V] base
        logits, Z [g, V] Markov-corrected logits, conf [g] sigmoid confidences. With chain
        (g ids) the drafts are not drawn but taken from it (fixtures: q for a given chain)."""
        P = cap_rows.shape[0]
        lo = max(0, P - self.window)
        main_x = self.context(cap_rows[lo:P][None])
        ids = torch.tensor([[[anchor] + [self.noise] * (self.gamma - 1)]])
        y = self.block(main_x, torch.arange(lo, P)[None], ids,
                       torch.arange(P, P + self.gamma)[None, None], embed)
        U = self.base_logits(y, head)[0, 0]
        y = y[0, 0]
        prev, drafts, qs, Zs, cs = anchor, [], [], [], []
        for k in range(self.gamma):
            z, cl = self.markov(U[k], y[k], torch.tensor(prev))
            t, q = tt.draw(z, temperature, gen)
            if chain is not None:
                t = int(chain[k])
            drafts.append(t)
            qs.append(q)
            Zs.append(z)
            cs.append(float(torch.sigmoid(cl)))
            prev = t
        return {"drafts": drafts, "q": torch.stack(qs), "U": U, "Z": torch.stack(Zs), "conf": cs}

    # ---------------------------------------------------------------- weights
    def upstream_state(self):
        """{mtp.* upstream name: tensor in its stored dtype}."""
        L = f"mtp.{len(self.stages) - 1}."
        out = {"mtp.0.main_proj.weight": self.main_proj.weight,
               "mtp.0.main_norm.weight": self.main_norm.weight,
               L + "hc_head_fn": self.hc_head.fn, L + "hc_head_base": self.hc_head.base,
               L + "hc_head_scale": self.hc_head.scale, L + "norm.weight": self.norm.weight,
               L + "markov_head.markov_w1.weight": self.markov_w1,
               L + "markov_head.markov_w2.weight": self.markov_w2,
               L + "confidence_head.proj.weight": self.confidence}
        for s, st in enumerate(self.stages):
            pre = f"mtp.{s}."
            for name, p in list(st.named_parameters()) + list(st.named_buffers()):
                if name in ("ffn.w1", "ffn.w2", "ffn.w3"):
                    w = name.split(".")[1]
                    for e in range(p.shape[0]):
                        out[f"{pre}ffn.experts.{e}.{w}.weight"] = p[e]
                else:
                    out[pre + STAGE_NAMES[name]] = p
        return {k: v.detach().cpu().to(stored_dtype(k)).contiguous() for k, v in out.items()}

    @torch.no_grad()
    def load_upstream(self, up):
        L = f"mtp.{len(self.stages) - 1}."
        for s in range(len(self.stages)):
            self.load_stage(s, up, f"mtp.{s}.")
        self.hc_head.fn.copy_(up[L + "hc_head_fn"].float())
        self.hc_head.base.copy_(up[L + "hc_head_base"].float())
        self.hc_head.scale.copy_(up[L + "hc_head_scale"].float())
        self.norm.weight.copy_(up[L + "norm.weight"].float())
        self.main_norm.weight.copy_(up["mtp.0.main_norm.weight"].float())
        self.main_proj.weight.copy_(up["mtp.0.main_proj.weight"].float())
        self.markov_w1.copy_(up[L + "markov_head.markov_w1.weight"].float())
        self.markov_w2.copy_(up[L + "markov_head.markov_w2.weight"].float())
        self.confidence.copy_(up[L + "confidence_head.proj.weight"].float())

    @torch.no_grad()
    def round_to_storage(self):
        """Every tensor to its stored dtype and back (what the checkpoint will hold)."""
        self.load_upstream(self.upstream_state())


def dspark_dir(model_dir):
    return os.path.join(model_dir, "dspark")


def write_dspark(d, ds):
    """d/: model.safetensors (mtp.*) + config.json."""
    os.makedirs(d, exist_ok=True)
    t = ds.upstream_state()
    st_save(t, os.path.join(d, "model.safetensors"))
    conf = {"architectures": ["DeepseekV4DSpark"], "model_type": "deepseek_v4_dspark"}
    conf.update(ds.dcfg)
    conf["compress_ratios"] = [0] * ds.dcfg["dspark_num_stages"]
    conf["sliding_window"] = ds.window
    conf["confidence_head"] = True
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(conf, fh, indent=1)
    return len(t), sum(v.numel() * v.element_size() for v in t.values())


def target_config(model_dir):
    return json.load(open(os.path.join(model_dir, "config.json")))


def embed_head(model_dir):
    """The target's embedding and head [V, D] (fp32), from either weight layout."""
    up = read_model_dir(model_dir)
    e = up.get("embed.weight", up.get("model.embed_tokens.weight"))
    h = up.get("head.weight", up.get("lm_head.weight", e))
    return e.float(), h.float()


def load_dspark(d, cfg):
    conf = json.load(open(os.path.join(d, "config.json")))
    ds = V4DSpark(cfg, {k: conf[k] for k in DSPARK})
    ds.load_upstream(st_load(os.path.join(d, "model.safetensors")))
    return ds.eval()


__all__ = ["V4DSpark", "DSPARK", "window_index", "load_dspark", "write_dspark", "dspark_dir",
           "st_load", "st_save", "read_model_dir", "target_config", "embed_head"]
