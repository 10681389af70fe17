#include "model.h"

#include <accelerant/sharded.h>

#include <cmath>
#include <limits>

namespace gpt {

namespace {

// nanoGPT's initialisation: N(0, 0.02) for every Linear and Embedding weight, zero biases, and
// the projections that write into the residual stream scaled down by sqrt(2 n_layer) (GPT-2's
// rule: the residual sum of 2 n_layer branches keeps its variance).
void init_linear(torch::nn::Linear& linear, double std) {
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0.0, std);
  if (linear->bias.defined()) linear->bias.zero_();
}

torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

double residual_std(const ModelConfig& config) {
  return 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
}

}  // namespace

LayerNormImpl::LayerNormImpl(int64_t features, bool with_bias) {
  weight = register_parameter("weight", torch::ones({features}));
  if (with_bias) bias = register_parameter("bias", torch::zeros({features}));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {weight.size(0)}, weight, bias, 1e-5);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& config)
    : n_head(config.n_head) {
  c_attn = register_module("c_attn", make_linear(config.n_embd, 3 * config.n_embd, config.bias));
  c_proj = register_module("c_proj", make_linear(config.n_embd, config.n_embd, config.bias));
  attn_dropout = register_module("attn_dropout", torch::nn::Dropout(config.dropout));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(config.dropout));
  init_linear(c_attn, 0.02);
  init_linear(c_proj, residual_std(config));
  // Adding -inf gives what masked_fill(-inf) gives, and lets baddbmm scale, mask and multiply
  // in one call.
  const int64_t t = config.block_size;
  mask = torch::full({t, t}, -std::numeric_limits<float>::infinity()).triu(1);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hs = c / n_head;
  auto qkv = c_attn(x).split(c, 2);
  // [B, T, C] -> [B * H, T, hs]: one batched matrix product over every head of every row.
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, n_head, hs}).transpose(1, 2).reshape({b * n_head, t, hs});
  };
  auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  if (mask.device() != x.device()) mask = mask.to(x.device());
  auto scores = torch::baddbmm(mask.narrow(0, 0, t).narrow(1, 0, t), q, k.transpose(1, 2),
                               /*beta=*/1.0, /*alpha=*/1.0 / std::sqrt(static_cast<double>(hs)));
  auto att = torch::softmax(scores, -1);
  if (attn_dropout->options.p() > 0) att = attn_dropout(att);
  auto y = torch::bmm(att, v).view({b, n_head, t, hs}).transpose(1, 2).reshape({b, t, c});
  y = c_proj(y);
  return resid_dropout->options.p() > 0 ? resid_dropout(y) : y;
}

MlpImpl::MlpImpl(const ModelConfig& config) {
  c_fc = register_module("c_fc", make_linear(config.n_embd, 4 * config.n_embd, config.bias));
  c_proj = register_module("c_proj", make_linear(4 * config.n_embd, config.n_embd, config.bias));
  dropout = register_module("dropout", torch::nn::Dropout(config.dropout));
  init_linear(c_fc, 0.02);
  init_linear(c_proj, residual_std(config));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto y = c_proj(torch::gelu(c_fc(x)));
  return dropout->options.p() > 0 ? dropout(y) : y;
}

BlockImpl::BlockImpl(const ModelConfig& config) {
  ln_1 = register_module("ln_1", LayerNorm(config.n_embd, config.bias));
  attn = register_module("attn", CausalSelfAttention(config));
  ln_2 = register_module("ln_2", LayerNorm(config.n_embd, config.bias));
  mlp = register_module("mlp", Mlp(config));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn(ln_1(x));
  return x + mlp(ln_2(x));
}

GptImpl::GptImpl(const ModelConfig& c) : config(c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  {
    torch::NoGradGuard no_grad;
    wte->weight.normal_(0.0, 0.02);
    wpe->weight.normal_(0.0, 0.02);
  }
  drop = register_module("drop", torch::nn::Dropout(c.dropout));
  blocks = register_module("blocks", torch::nn::ModuleList());
  // Each block wrapped for ZeRO stage 3, which gathers a block's parameters only while it runs
  // (accelerant/sharded.h); below stage 3 the wrapper passes through, and it adds no name.
  for (int64_t i = 0; i < c.n_layer; ++i) blocks->push_back(accelerant::Sharded(Block(c)));
  ln_f = register_module("ln_f", LayerNorm(c.n_embd, c.bias));
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  const int64_t t = idx.size(1);
  TORCH_CHECK(t <= config.block_size, "a sequence of ", t, " tokens is longer than block_size ",
              config.block_size);
  auto positions = torch::arange(t, idx.options().dtype(torch::kLong));
  auto x = wte(idx) + wpe(positions);
  if (drop->options.p() > 0) x = drop(x);
  for (const auto& block : *blocks) x = block->as<accelerant::Sharded>()->forward(x);
  // The tied head: the token embedding's matrix read backwards (no weight of its own, so the
  // optimizer, the checkpoint and the safetensors file hold it once).
  return torch::matmul(ln_f(x), wte->weight.t());
}

torch::Tensor GptImpl::generate(torch::Tensor idx, int64_t new_tokens, double temperature,
                                int64_t top_k, torch::Generator generator) {
  torch::NoGradGuard no_grad;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const int64_t t = idx.size(1);
    auto context =
        t <= config.block_size ? idx : idx.narrow(1, t - config.block_size, config.block_size);
    auto logits = forward(context).select(1, context.size(1) - 1) / temperature;
    if (top_k > 0 && top_k < logits.size(-1)) {
      // Everything below the k-th largest logit gets probability 0.
      auto kth = std::get<0>(logits.topk(top_k, -1)).narrow(-1, top_k - 1, 1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    auto probabilities = torch::softmax(logits, -1);
    auto next = torch::multinomial(probabilities, 1, false, generator);
    idx = torch::cat({idx, next}, 1);
  }
  return idx;
}

int64_t GptImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n - wpe->weight.numel();
}

}  // namespace gpt
