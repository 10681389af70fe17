// nanoGPT's model (karpathy/nanoGPT model.py, described there and rebuilt here in LibTorch): a
// decoder-only transformer over characters. Token and learned position embeddings, n_layer
// pre-LayerNorm blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm, and an
// output head that is the token embedding itself (weight tying: logits = x @ wte^T).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace gpt {

/// The shape of the model (nanoGPT's GPTConfig names).
struct ModelConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 64;  ///< context length: positions the model can see
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool bias = false;  ///< biases in the Linears and LayerNorms (nanoGPT's default: none)
};

/// LayerNorm whose bias is optional: LibTorch's has both gain and bias or neither.
struct LayerNormImpl : torch::nn::Module {
  LayerNormImpl(int64_t features, bool bias);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;  // bias undefined without one
};
TORCH_MODULE(LayerNorm);

/// Multi-head causal self-attention with one fused q/k/v projection.
struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout attn_dropout{nullptr}, resid_dropout{nullptr};
  // Added to the attention scores: 0 where a position may attend (at or before itself), -inf
  // after it. A plain member, not a buffer: it is derived from block_size, so checkpoints and
  // the safetensors file need not carry it; forward moves it to the input's device.
  torch::Tensor mask;
  int64_t n_head;
};
TORCH_MODULE(CausalSelfAttention);

/// The feed-forward part: n_embd -> 4 n_embd, exact GELU, -> n_embd.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Mlp);

/// x + attn(ln_1(x)), then + mlp(ln_2(x)).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const ModelConfig& config);
  torch::Tensor forward(torch::Tensor x);
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

/// The whole model. forward maps token indices [B, T] (T <= block_size) to logits [B, T, vocab].
struct GptImpl : torch::nn::Module {
  explicit GptImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& idx);
  /// Appends `new_tokens` tokens to `idx` [1, T], each sampled from the softmax of the last
  /// logits divided by `temperature`, keeping only the `top_k` most likely (0: all). The context
  /// is cropped to the last block_size tokens. Draws from `generator`.
  torch::Tensor generate(torch::Tensor idx, int64_t new_tokens, double temperature, int64_t top_k,
                         torch::Generator generator);
  /// Parameters, counting the tied head once and (as nanoGPT reports) without wpe.
  int64_t num_parameters() const;

  ModelConfig config;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};  ///< accelerant::Sharded(Block), n_layer of them
  LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace gpt
