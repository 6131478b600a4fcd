"""Draft heads in plain torch, computing exactly what vLLM 0.26's draft classes compute.

Alignment (as vLLM's EAGLE proposer feeds drafters): drafter position p receives the target's
hidden state at p and the embedding of token x[p+1], and its logits predict x[p+2].

- Eagle1Head  == llama_eagle.EagleLlamaForCausalLM: fc(cat(emb, h)) -> decoder layer without
  input norm -> (h + residual); logits = target lm_head(out) (no norm); out is fed back.
- Eagle3Head  == llama_eagle3.Eagle3LlamaForCausalLM: h0 = fc(cat(aux3)); layer 0 attends over
  cat(input_layernorm(emb), hidden_norm(h)); residual = h; any further layers are plain pre-norm
  Llama layers over the residual stream (``layers.N.*`` in the file, as vLLM's multi-layer head
  reads them); final norm -> own lm_head over a reduced draft vocab; the pre-norm output is fed
  back.
- MtpHead     == mimo_mtp.MiMoMultiTokenPredictorLayer: input_proj(cat(hidden_norm(h),
  token_norm(emb))) -> Qwen2 decoder layer -> final_layernorm -> target lm_head; the normed
  output is fed back; embeddings at position 0 are zeroed.

Chaining ("training-time test"): step j at position q continues the chain that started at
q-j+1. Its attention sees step-1 keys (teacher-forced) at positions <= q-j+1 and, for each
earlier step i of the same chain, the step-i key at position q-j+i. Tokens stay teacher-forced
(a chain only counts while every drafted token was right, and then they equal the text).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from training.data import AUX_LAYERS


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(length: int, head_dim: int, theta: float, device):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(length, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def chain_mask(length: int, step: int, device) -> torch.Tensor:
    """Bool [L, step*L]: which keys a step-`step` query may see (see module docstring)."""
    q = torch.arange(length, device=device)[:, None]
    k = torch.arange(length, device=device)[None, :]
    blocks = [k <= q - step + 1]
    for i in range(2, step + 1):
        blocks.append(k == q - step + i)
    return torch.cat(blocks, dim=1)


class Attention(nn.Module):
    def __init__(self, in_dim, hidden, n_heads, n_kv, head_dim, theta):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim, self.theta = n_heads, n_kv, head_dim, theta
        self.q_proj = nn.Linear(in_dim, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, n_kv * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, n_kv * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=False)

    def forward(self, x, cache: list):
        """x [B, L, in]; cache (this layer's own) holds (k, v) of earlier chain steps and gets
        this step's."""
        b, length, _ = x.shape
        q = self.q_proj(x).view(b, length, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, length, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, length, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = rope_tables(length, self.head_dim, self.theta, x.device)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.append((k, v))
        step = len(cache)
        keys = torch.cat([c[0] for c in cache], dim=2)
        values = torch.cat([c[1] for c in cache], dim=2)
        rep = self.n_heads // self.n_kv
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        if step == 1:
            out = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        else:
            mask = chain_mask(length, step, x.device)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, length, -1))


class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    @torch.no_grad()
    def widen(self, inter: int, seed: int = 0) -> None:
        """Grow to ``inter`` hidden units without changing the output: the new units' gate and
        up rows start random (nn.Linear's scale), their down_proj columns at zero, so a resumed
        head keeps what it learned and gains capacity that training fills in."""
        old = self.gate_proj.out_features
        if inter < old:
            raise ValueError(f"an MLP of {old} units cannot widen to {inter}")
        gen = torch.Generator().manual_seed(seed)
        hidden = self.gate_proj.in_features
        bound = 1.0 / hidden ** 0.5
        grown = {}
        for name in ("gate_proj", "up_proj"):
            w = getattr(self, name).weight
            extra = (torch.rand(inter - old, hidden, generator=gen) * 2 - 1) * bound
            grown[name] = torch.cat([w.detach(), extra.to(w)])
        w = self.down_proj.weight
        grown["down_proj"] = torch.cat([w.detach(), w.new_zeros(hidden, inter - old)], dim=1)
        for name, weight in grown.items():
            layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False,
                              device=weight.device, dtype=weight.dtype)
            layer.weight.copy_(weight)
            setattr(self, name, layer)


class TargetShape:
    """The handful of target facts every head needs."""

    def __init__(self, hidden=576, n_heads=9, n_kv=3, head_dim=64, inter=1536, eps=1e-5,
                 theta=1e5, vocab=49152):
        self.hidden, self.n_heads, self.n_kv, self.head_dim = hidden, n_heads, n_kv, head_dim
        self.inter, self.eps, self.theta, self.vocab = inter, eps, theta, vocab


class Eagle1Head(nn.Module):
    attention_layers = 1

    def __init__(self, t: TargetShape, inter: int):
        super().__init__()
        d = t.hidden
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.self_attn = Attention(d, d, t.n_heads, t.n_kv, t.head_dim, t.theta)
        self.post_attention_layernorm = RMSNorm(d, t.eps)
        self.mlp = MLP(d, inter)

    def first_hidden(self, batch):
        return batch["post"]

    def step(self, hidden, emb, caches, lm_head_weight):
        x = self.fc(torch.cat((emb, hidden), dim=-1))
        h = x + self.self_attn(x, caches[0])
        out = h + self.mlp(self.post_attention_layernorm(h))
        return out, F.linear(out, lm_head_weight)

    def export_tensors(self) -> dict:
        sd = {f"layers.0.{k}": v for k, v in self.state_dict().items() if not k.startswith("fc.")}
        sd["fc.weight"] = self.fc.weight
        return sd


class DecoderLayer(nn.Module):
    """A plain pre-norm Llama layer: what vLLM's EAGLE-3 head runs after its first layer
    (llama_eagle3.LlamaDecoderLayer with layer_idx > 0: input norm over the residual stream,
    attention over hidden_size inputs, MLP)."""

    def __init__(self, t: TargetShape, inter: int):
        super().__init__()
        d = t.hidden
        self.input_layernorm = RMSNorm(d, t.eps)
        self.self_attn = Attention(d, d, t.n_heads, t.n_kv, t.head_dim, t.theta)
        self.post_attention_layernorm = RMSNorm(d, t.eps)
        self.mlp = MLP(d, inter)

    def forward(self, x, cache: list):
        h = x + self.self_attn(self.input_layernorm(x), cache)
        return h + self.mlp(self.post_attention_layernorm(h))

    @torch.no_grad()
    def start_as_identity(self) -> None:
        """Zero the projections that write into the residual stream (o_proj, down_proj): the
        layer then passes its input through unchanged, and a head it is added to keeps its
        function while training fills the layer in (the other weights stay random, so the
        gradients reaching the zeroed projections are not zero)."""
        self.self_attn.o_proj.weight.zero_()
        self.mlp.down_proj.weight.zero_()


class Eagle3Head(nn.Module):
    def __init__(self, t: TargetShape, inter: int, draft_vocab_ids: torch.Tensor,
                 num_layers: int = 1, aux_layers=AUX_LAYERS):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"an EAGLE-3 head needs at least one layer, got {num_layers}")
        d = t.hidden
        # The target taps its fc reads, "after k layers", in increasing order (vLLM gathers
        # them in layer order); the default is vLLM's for a 30-layer target. Not a tensor: it
        # travels in the config (configs.eagle3_config).
        self.aux_layers = tuple(aux_layers)
        self.fc = nn.Linear(len(self.aux_layers) * d, d, bias=False)
        self.input_layernorm = RMSNorm(d, t.eps)
        self.hidden_norm = RMSNorm(d, t.eps)
        self.self_attn = Attention(2 * d, d, t.n_heads, t.n_kv, t.head_dim, t.theta)
        self.post_attention_layernorm = RMSNorm(d, t.eps)
        self.mlp = MLP(d, inter)
        # Layers 1.. (vLLM's ``layers.N``); empty for the one-layer head shipped until now.
        self.extra_layers = nn.ModuleList(DecoderLayer(t, inter) for _ in range(num_layers - 1))
        self.norm = RMSNorm(d, t.eps)
        self.lm_head = nn.Linear(d, len(draft_vocab_ids), bias=False)
        self.register_buffer("vocab_ids", draft_vocab_ids.clone(), persistent=False)
        self.target_vocab = t.vocab
        self._shape = t

    @property
    def attention_layers(self) -> int:
        return 1 + len(self.extra_layers)

    @torch.no_grad()
    def grow(self, num_layers: int) -> None:
        """Add layers up to ``num_layers``, each starting as the identity
        (DecoderLayer.start_as_identity): the head's drafts stay what they were."""
        if num_layers < self.attention_layers:
            raise ValueError(f"a head of {self.attention_layers} layers cannot shrink to "
                             f"{num_layers}")
        inter = self.mlp.gate_proj.out_features
        ref = self.fc.weight
        while self.attention_layers < num_layers:
            layer = DecoderLayer(self._shape, inter).to(device=ref.device, dtype=ref.dtype)
            layer.start_as_identity()
            self.extra_layers.append(layer)

    @torch.no_grad()
    def add_taps(self, aux_layers) -> None:
        """Read more target taps: ``aux_layers`` holds the current ones and more, in increasing
        order. The new taps' fc columns start at zero, so the drafts do not change until
        training gives them weight (as ``grow`` does for layers)."""
        new = tuple(aux_layers)
        if list(new) != sorted(set(new)) or not set(self.aux_layers) <= set(new):
            raise ValueError(f"taps {list(new)}: want increasing layer counts that keep the "
                             f"current {list(self.aux_layers)}")
        d = self.fc.out_features
        old = self.fc.weight
        weight = old.new_zeros(d, len(new) * d)
        for j, k in enumerate(self.aux_layers):
            i = new.index(k)
            weight[:, i * d:(i + 1) * d] = old[:, j * d:(j + 1) * d]
        self.fc = nn.Linear(len(new) * d, d, bias=False, device=old.device, dtype=old.dtype)
        self.fc.weight.copy_(weight)
        self.aux_layers = new

    def first_hidden(self, batch):
        return self.fc(batch["aux"])

    def step(self, hidden, emb, caches, lm_head_weight):
        del lm_head_weight  # own (reduced-vocab) head
        x = torch.cat((self.input_layernorm(emb), self.hidden_norm(hidden)), dim=-1)
        h = hidden + self.self_attn(x, caches[0])
        pre = h + self.mlp(self.post_attention_layernorm(h))
        for layer, cache in zip(self.extra_layers, caches[1:]):
            pre = layer(pre, cache)
        return pre, self.lm_head(self.norm(pre))

    def export_tensors(self) -> dict:
        layer = ("input_layernorm", "hidden_norm", "self_attn", "post_attention_layernorm", "mlp")
        sd = {}
        for k, v in self.state_dict().items():
            if k.startswith("extra_layers."):
                index, rest = k.removeprefix("extra_layers.").split(".", 1)
                sd[f"layers.{int(index) + 1}.{rest}"] = v
            else:
                sd[f"midlayer.{k}" if k.startswith(layer) else k] = v
        for i in range(1, self.attention_layers):
            # vLLM builds a hidden_norm in every layer but uses it only in layer 0; its loader
            # wants every parameter in the file, so the unused ones ship as ones.
            sd[f"layers.{i}.hidden_norm.weight"] = torch.ones_like(self.norm.weight)
        ids = self.vocab_ids.long().cpu()
        sd["d2t"] = ids - torch.arange(len(ids))
        t2d = torch.zeros(self.target_vocab, dtype=torch.bool)
        t2d[ids] = True
        sd["t2d"] = t2d
        return sd


class MtpHead(nn.Module):
    attention_layers = 1

    def __init__(self, t: TargetShape):
        super().__init__()
        d = t.hidden
        self.token_layernorm = RMSNorm(d, t.eps)
        self.hidden_layernorm = RMSNorm(d, t.eps)
        self.input_proj = nn.Linear(2 * d, d, bias=False)
        self.input_layernorm = RMSNorm(d, t.eps)
        self.self_attn = Attention(d, d, t.n_heads, t.n_kv, t.head_dim, t.theta)
        self.post_attention_layernorm = RMSNorm(d, t.eps)
        self.mlp = MLP(d, t.inter)
        self.final_layernorm = RMSNorm(d, t.eps)

    def first_hidden(self, batch):
        return batch["pre"]

    def step(self, hidden, emb, caches, lm_head_weight):
        emb = emb.clone()
        emb[:, 0] = 0  # vLLM zeroes the embedding at position 0
        x = self.input_proj(torch.cat((self.hidden_layernorm(hidden),
                                       self.token_layernorm(emb)), dim=-1))
        h = x + self.self_attn(self.input_layernorm(x), caches[0])
        out = self.final_layernorm(h + self.mlp(self.post_attention_layernorm(h)))
        return out, F.linear(out, lm_head_weight)

    def export_tensors(self) -> dict:
        """Names as stored in a MiMo checkpoint (before vLLM's mtp_block remap), bias included."""
        sd = {f"model.mtp_layers.0.{k}": v for k, v in self.state_dict().items()}
        for proj in ("q_proj", "k_proj", "v_proj"):
            w = sd[f"model.mtp_layers.0.self_attn.{proj}.weight"]
            sd[f"model.mtp_layers.0.self_attn.{proj}.bias"] = torch.zeros(w.shape[0])
        return sd


def run_chain(head, batch, emb_next, lm_head_weight, steps: int):
    """Outputs (feature, logits) of each chained step; inputs as described in the docstring."""
    hidden = head.first_hidden(batch)
    # One list of per-step (k, v) for each attention layer of the head.
    caches: list = [[] for _ in range(head.attention_layers)]
    outs = []
    for _ in range(steps):
        feat, logits = head.step(hidden, emb_next, caches, lm_head_weight)
        outs.append((feat, logits))
        # Step j+1 at position q continues from step j's output at q-1.
        hidden = torch.cat((torch.zeros_like(feat[:, :1]), feat[:, :-1]), dim=1)
    return outs


def eagle3_num_layers(tensors: dict) -> int:
    """Decoder layers of an EAGLE-3 file: ``midlayer`` plus any ``layers.N`` (N >= 1)."""
    extra = {int(k.split(".")[1]) for k in tensors if k.startswith("layers.")}
    return 1 + (max(extra) if extra else 0)


def head_from_tensors(kind: str, tensors: dict, t: TargetShape | None = None,
                      aux_layers=None):
    """Rebuild a head from its shipped (vLLM-named) tensors: the inverse of export_tensors.
    ``aux_layers``: an EAGLE-3 head's taps from its config (default vLLM's, AUX_LAYERS)."""
    t = t or TargetShape()
    if kind == "eagle":
        inter = tensors["layers.0.mlp.gate_proj.weight"].shape[0]
        head = Eagle1Head(t, inter)
        state = {k.removeprefix("layers.0."): v for k, v in tensors.items()}
    elif kind == "eagle3":
        inter = tensors["midlayer.mlp.gate_proj.weight"].shape[0]
        d2t = tensors["d2t"].long()
        # The tap ids live in the config (drafter_io passes them); the file gives their count.
        aux_layers = tuple(aux_layers or AUX_LAYERS)
        if tensors["fc.weight"].shape[1] != len(aux_layers) * t.hidden:
            raise ValueError(f"the EAGLE-3 fc reads {tensors['fc.weight'].shape[1]} inputs, not "
                             f"{len(aux_layers)} taps of {t.hidden}: pass the config's taps")
        head = Eagle3Head(t, inter, torch.arange(len(d2t)) + d2t,
                          num_layers=eagle3_num_layers(tensors), aux_layers=aux_layers)
        state = {}
        for k, v in tensors.items():
            if k in ("d2t", "t2d") or (k.startswith("layers.") and k.endswith(".hidden_norm.weight")):
                continue  # the unused norms of layers 1.. (see export_tensors)
            if k.startswith("layers."):
                index, rest = k.removeprefix("layers.").split(".", 1)
                k = f"extra_layers.{int(index) - 1}.{rest}"
            state[k.removeprefix("midlayer.")] = v
    elif kind == "mtp":
        head = MtpHead(t)
        prefix = "model.mtp_layers.0."
        state = {k.removeprefix(prefix): v for k, v in tensors.items() if not k.endswith(".bias")}
    else:
        raise ValueError(kind)
    head.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return head.eval()
