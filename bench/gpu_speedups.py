"""Speed-ups for the DiffusionGemma read benchmark (bench/gpu_read.py): the whole read captured
as a CUDA graph, and the compiled pieces (RMSNorm, each layer's feed-forward half, the q/k/v
inputs of attention). Each patch computes what transformers computes (checked on CPU)."""

from __future__ import annotations

from typing import Any

from router.backends.torch.diffusion import DiffusionSlotReader, SlotItem


class GraphedRead:
    """One read shape captured as a CUDA graph: new inputs are copied into the captured
    tensors, the graph replays the encoder + decoder + slot read, outputs are copied back."""

    def __init__(self, reader: DiffusionSlotReader, items: list[SlotItem], cached: bool) -> None:
        import torch

        self.reader = reader
        self.prefix_len = len(items[0].prefix_ids) if cached else 0
        self.base = reader.prefix_cache(items[0].prefix_ids) if cached else empty_cache(reader)
        self.static = reader.prepare(items, prefix_len=self.prefix_len)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels and the allocator outside the capture
                reader.forward(self.static, self.base)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.out = reader.forward(self.static, self.base)

    def __call__(self, items: list[SlotItem]) -> Any:
        import torch

        fresh = self.reader.prepare(items, prefix_len=self.prefix_len)
        with torch.inference_mode():
            for name in ("input_ids", "canvas", "canvas_positions", "position_ids"):
                getattr(self.static, name).copy_(getattr(fresh, name), non_blocking=True)
            self.graph.replay()
            return self.out[0].float().cpu()


def empty_cache(reader: DiffusionSlotReader) -> Any:
    """A cache whose layers are already initialised on the device, so a captured forward does
    no host-to-device work when it starts from nothing."""
    import torch

    cache = reader.new_cache()
    dtype = next(reader.model.parameters()).dtype
    for index, layer in enumerate(cache.layers):
        per_layer = reader.text_config.per_layer_config[index]
        shape = (1, per_layer.num_key_value_heads, 0, per_layer.head_dim)
        empty = torch.empty(shape, dtype=dtype, device=reader.device)
        layer.lazy_initialization(empty, empty)
        layer.keys, layer.values = empty, empty.clone()
    return cache


def fuse_norms() -> None:
    """Replace DiffusionGemma's RMSNorm (nine kernels: casts, pow, mean, add, pow, two muls) by one
    compiled function, so each norm is one fused kernel."""
    import torch
    from transformers.models.diffusion_gemma import modeling_diffusion_gemma as mdg

    raise_recompile_limit()

    @torch.compile(dynamic=True)
    def rms(x: Any, weight: Any, eps: float) -> Any:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
        if weight is not None:
            h = h * weight.float()
        return h.type_as(x)

    def forward(self: Any, hidden_states: Any) -> Any:
        return rms(hidden_states, self.weight if self.with_scale else None, self.eps)

    mdg.DiffusionGemmaRMSNorm.forward = forward


def raise_recompile_limit(limit: int = 64) -> None:
    """Norms see 2-D to 4-D inputs with and without a scale: more variants than dynamo's default 8."""
    import torch

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, limit)


def compile_ffn_blocks() -> None:
    """Compile the half of every encoder/decoder layer after attention (residual, norms, dense
    MLP, router, grouped-GEMM experts, combination): it never touches the KV cache, so one
    compiled graph serves all 30 layers of a kind (the attention half indexes the cache by
    ``layer_idx``, which would recompile per layer)."""
    import torch
    from transformers.models.diffusion_gemma import modeling_diffusion_gemma as mdg

    raise_recompile_limit()

    @torch.compile(dynamic=True)
    def ffn(layer: Any, attn_out: Any, residual: Any) -> Any:
        hidden_states = layer.post_attention_layernorm(attn_out)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = layer.pre_feedforward_layernorm(hidden_states)
        hidden_states = layer.mlp(hidden_states)
        hidden_states_1 = layer.post_feedforward_layernorm_1(hidden_states)
        flat = residual.reshape(-1, residual.shape[-1])
        for_experts = layer.pre_feedforward_layernorm_2(flat)
        _, top_k_weights, top_k_index = layer.router(flat)
        hidden_states_2 = layer.experts(for_experts, top_k_index, top_k_weights)
        hidden_states_2 = hidden_states_2.reshape(residual.shape)
        hidden_states_2 = layer.post_feedforward_layernorm_2(hidden_states_2)
        hidden_states = layer.post_feedforward_layernorm(hidden_states_1 + hidden_states_2)
        return (residual + hidden_states) * layer.layer_scalar

    def forward(self: Any, hidden_states: Any, position_embeddings: Any = None,
                attention_mask: Any = None, position_ids: Any = None, **kwargs: Any) -> Any:
        attn_out, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            position_embeddings=position_embeddings, attention_mask=attention_mask,
            position_ids=position_ids, **kwargs)
        return ffn(self, attn_out, hidden_states)

    for cls in (mdg.DiffusionGemmaEncoderTextLayer, mdg.DiffusionGemmaDecoderTextLayer):
        cls.forward = forward
    from router.backends import torch_fused

    # The one-pass read calls this half directly, over both streams' tokens at once.
    torch_fused.ffn_half = torch.compile(torch_fused.ffn_half, dynamic=True)


def compile_attention_inputs() -> None:
    """Compile the attention half up to the cache: q/k/v projections, their norms and rotary
    embeddings (no cache access, so one graph serves every layer of a kind). The cache update
    and SDPA stay eager, exactly as transformers does them."""
    import torch
    from transformers.models.diffusion_gemma import modeling_diffusion_gemma as mdg

    raise_recompile_limit()
    rotary = mdg.apply_rotary_pos_emb

    @torch.compile(dynamic=True)
    def qkv(attn: Any, hidden_states: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
        hidden_shape = (*hidden_states.shape[:-1], -1, attn.head_dim)
        query = attn.q_norm(attn.q_proj(hidden_states).view(hidden_shape))
        query = rotary(query, cos, sin, unsqueeze_dim=2).transpose(1, 2)
        key = attn.k_proj(hidden_states).view(hidden_shape)
        value = attn.v_proj(hidden_states).view(hidden_shape) if attn.v_proj is not None else key
        key = rotary(attn.k_norm(key), cos, sin, unsqueeze_dim=2).transpose(1, 2)
        return query, key, attn.v_norm(value).transpose(1, 2)

    def forward(self: Any, hidden_states: Any, position_embeddings: Any, attention_mask: Any,
                cache: Any = None, past_key_values: Any = None, **kwargs: Any) -> Any:
        cache = cache if cache is not None else past_key_values
        query, key, value = qkv(self, hidden_states, *position_embeddings)
        if cache is not None:
            if isinstance(self, mdg.DiffusionGemmaDecoderTextAttention):
                key, value = self.append_to_cache(cache, key, value)  # read-only prefix
            else:
                key, value = cache.update(key, value, self.layer_idx)
        interface = mdg.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, mdg.eager_attention_forward)
        out, weights = interface(self, query, key, value, attention_mask, dropout=0.0,
                                 scaling=self.scaling, sliding_window=self.sliding_window,
                                 is_causal=self.is_causal, **kwargs)
        out = self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous())
        return out, weights

    for cls in (mdg.DiffusionGemmaEncoderTextAttention, mdg.DiffusionGemmaDecoderTextAttention):
        cls.forward = forward


def compile_layers(model: Any) -> None:
    """torch.compile every encoder and decoder layer (dynamic shapes, so one compile serves every
    batch and prompt length); the layers share code, so they share compiled graphs."""
    import torch

    raise_recompile_limit()
    layers = [*model.model.encoder.language_model.layers, *model.model.decoder.layers]
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
