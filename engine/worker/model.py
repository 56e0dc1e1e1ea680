"""One decoder for Llama, Qwen2 and Qwen3 (see ModelConfig's flags for where they differ).

Inputs are flat: all scheduled tokens of all sequences, prefill chunks first, then one token per
decoding sequence. Projections are fused at load time (q|k|v and gate|up) so each is one matmul.

Under tensor parallelism (engine/parallel/distributed.py) each rank builds the same modules with its Shard's
sizes; o_proj, down_proj and the embedding end in an all-reduce, the LM head in a gather.

With FP8 weights (``cfg.quant``, engine/quant/) the projections are Fp8Linear; the embedding, norms
and LM head keep the model's dtype.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.worker.attention import AttentionMetadata, Backend
from engine.config import ModelConfig
from engine.parallel.distributed import Shard, TPGroup, whole
from pacore_kernels.batch_invariant import linear_invariant
from pacore_kernels.block_select import update_key_bounds


def projection(cfg: ModelConfig, in_features: int, out_features: int, bias: bool, parts: tuple[str, ...] = ()
               ) -> nn.Module:
    """An attention or MLP projection: nn.Linear, or Fp8Linear when the model runs FP8 weights and the
    checkpoint did not leave it unquantized. ``parts``: the Hugging Face modules it fuses (q, k, v)."""
    if cfg.quant is None:
        return nn.Linear(in_features, out_features, bias=bias)
    fp8 = {p: cfg.quant.quantizes(p) for p in parts}
    if len(set(fp8.values())) > 1:
        raise ValueError(f"the checkpoint's quantization_config leaves {[p for p, q in fp8.items() if not q]} "
                         f"unquantized but not {[p for p, q in fp8.items() if q]}; this engine fuses them into one "
                         f"projection, so they must be quantized alike")
    if not all(fp8.values()):
        return nn.Linear(in_features, out_features, bias=bias)
    from engine.quant.fp8 import Fp8Linear
    return Fp8Linear(in_features, out_features, bias, cfg.quant)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, shard: Shard, tp: TPGroup, layer: int = 0):
        super().__init__()
        self.layer = layer  # its row of the key bounds (sparse self-drafting)
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, cfg.head_dim
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        self.tp = tp
        hf = f"model.layers.{layer}.self_attn."
        self.qkv_proj = projection(cfg, cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.qkv_bias,
                                   (hf + "q_proj", hf + "k_proj", hf + "v_proj"))
        self.o_proj = projection(cfg, self.q_size, cfg.hidden_size, cfg.o_bias, (hf + "o_proj",))
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim ** -0.5
        # An FP8 cache's per-layer scales (stored = value / scale): the checkpoint's, else 1.0 (engine/worker/loader.py).
        self.k_scale = self.v_scale = 1.0

    def forward(self, x, positions, meta: AttentionMetadata, kv: torch.Tensor, ops: Backend,
                cos_sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = ops.rmsnorm(q.reshape(-1, self.head_dim), self.q_norm.weight, self.q_norm.eps).view_as(q)
            k = ops.rmsnorm(k.reshape(-1, self.head_dim), self.k_norm.weight, self.k_norm.eps).view_as(k)
        else:
            q, k = q.contiguous(), k.contiguous()
        q, k = ops.rope(positions, q, k, cos_sin)
        bounds = None
        if meta.key_bounds is not None:  # keep every block's key min/max current as it fills
            bounds = meta.key_bounds[self.layer]
            update_key_bounds(bounds, k, meta.slot_mapping, kv.shape[2])
        importance = None if meta.block_importance is None else meta.block_importance[self.layer]
        out = ops.attention(q, k, v.contiguous(), kv[0], kv[1], meta, self.scale, self.k_scale, self.v_scale, bounds,
                            importance)
        return self.tp.all_reduce(self.o_proj(out.reshape(-1, self.q_size)))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, shard: Shard, tp: TPGroup, layer: int = 0):
        super().__init__()
        hf = f"model.layers.{layer}.mlp."
        self.gate_up_proj = projection(cfg, cfg.hidden_size, 2 * shard.ffn_size, cfg.mlp_bias,
                                       (hf + "gate_proj", hf + "up_proj"))
        self.down_proj = projection(cfg, shard.ffn_size, cfg.hidden_size, cfg.mlp_bias, (hf + "down_proj",))
        self.tp = tp

    def forward(self, x: torch.Tensor, ops: Backend) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(ops.silu_and_mul(self.gate_up_proj(x))))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, shard: Shard, tp: TPGroup, layer: int = 0):
        super().__init__()
        self.self_attn = Attention(cfg, shard, tp, layer)
        self.mlp = MLP(cfg, shard, tp, layer)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, positions, meta, kv, ops: Backend, cos_sin):
        n1, n2 = self.input_layernorm, self.post_attention_layernorm
        if residual is None:
            residual, x = x, ops.rmsnorm(x, n1.weight, n1.eps)
        else:
            x, residual = ops.rmsnorm(x, n1.weight, n1.eps, residual)
        x = self.self_attn(x, positions, meta, kv, ops, cos_sin)
        x, residual = ops.rmsnorm(x, n2.weight, n2.eps, residual)
        return self.mlp(x, ops), residual


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, shard: Shard | None = None, tp: TPGroup | None = None):
        super().__init__()
        self.cfg, self.shard, self.tp = cfg, shard or whole(cfg), tp or TPGroup()
        shard, tp = self.shard, self.tp
        self.embed_tokens = nn.Embedding(shard.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, shard, tp, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, shard.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        for p in self.parameters():
            p.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor, ops: Backend, cos_sin: torch.Tensor,
                layers: tuple[int, ...] | None = None) -> torch.Tensor:
        """Final-norm hidden states [T, H]. ``layers``: run only these decoder layers (a layer-skipping draft
        step, engine/spec/layer_skip.py); a skipped layer passes the residual stream on unchanged."""
        x, residual = self.embed(input_ids), None
        for i in range(len(self.layers)) if layers is None else layers:
            x, residual = self.layers[i](x, residual, positions, meta, kv_cache[i], ops, cos_sin)
        x, _ = ops.rmsnorm(x, self.norm.weight, self.norm.eps, residual)
        return x

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.embed_tokens(input_ids)
        # Each rank looks up the ids in its vocabulary slice and zeroes the rest; the sum is the lookup.
        start, end = self.shard.vocab
        mine = (input_ids >= start) & (input_ids < end)
        x = self.embed_tokens(torch.where(mine, input_ids - start, 0)).masked_fill_(~mine.unsqueeze(-1), 0)
        return self.tp.all_reduce(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_last(self.lm_head(hidden))[:, :self.cfg.vocab_size].float()


class RowTiledLinear(nn.Module):
    """An nn.Linear's weights computed in fixed-size row tiles, so a row's output does not depend on
    how many rows are batched with it (pacore_kernels/batch_invariant.py)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias  # shared, not copied (tied embeddings stay tied)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_invariant(x, self.weight, self.bias)


def tile_linears(model: nn.Module) -> None:
    """Swap every nn.Linear of model (lm_head included) for a RowTiledLinear over the same weights; FP8
    projections compute in the same fixed row tiles (pacore_kernels/fp8_gemm.py, invariant=True)."""
    from engine.quant.fp8 import Fp8Linear
    for module in list(model.modules()):
        if isinstance(module, Fp8Linear):
            module.invariant = True
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, RowTiledLinear(child))
