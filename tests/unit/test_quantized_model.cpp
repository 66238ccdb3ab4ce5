// A model whose linear layers are stored NF4 or HQQ computes exactly what the same model
// computes with those weights replaced by their dequantization (the reference is built here
// from the quantize/dequantize functions, weight by weight, in a plain LocalParameters).
#include <random>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "quant/quantized_parameters.h"

using namespace frugal;

namespace {

LlamaConfig config64() {
  LlamaConfig c;
  c.hidden_size = 64;  // rows of 64: whole NF4 / HQQ blocks
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 37;
  c.max_position_embeddings = 32;
  return c;
}

Batch batch_of(int64_t sequences, int64_t seq) {
  std::mt19937 rng(5);
  Batch b;
  b.batch = sequences;
  b.seq = seq;
  b.tokens = Tensor::empty({sequences * seq}, DType::i32);
  b.targets = Tensor::empty({sequences * seq}, DType::i32);
  for (int64_t i = 0; i < sequences * seq; ++i) {
    b.tokens.data<int32_t>()[i] = int32_t(rng() % 37);
    b.targets.data<int32_t>()[i] = int32_t(rng() % 37);
  }
  b.positions = sequence_positions(sequences, seq);
  return b;
}

void check(QuantKind kind) {
  const LlamaConfig config = config64();
  LlamaModel model(config);
  LocalParameters original(config, 11, 0.2f, false);
  QuantizedParameters quantized(llama_units(config), kind,
                                [&](const ParamSpec& p) { return original.param(p.name); });

  LocalParameters reference(config, 11, 0.2f, false);
  size_t fp32_bytes = 0;
  for (const UnitSpec& unit : reference.specs())
    for (const ParamSpec& p : unit.params) {
      fp32_bytes += size_t(shape_numel(p.shape)) * 4;
      if (!is_quantized_linear(p.name)) continue;
      Tensor& w = reference.param(p.name);
      w.copy_from(kind == QuantKind::nf4 ? nf4_dequantize(nf4_quantize(w, p.name))
                                         : hqq_dequantize(hqq_quantize(w, p.name)));
    }

  const Batch b = batch_of(2, 19);
  const double q_loss = model.forward_loss(b, quantized);
  CHECK(q_loss == model.forward_loss(b, reference));
  CHECK(q_loss != model.forward_loss(b, original));  // the quantization did something
  CHECK(quantized.stored_bytes() < fp32_bytes / 2);
  CHECK_THROWS_AS(quantized.grads(1, frugal::GradSums::kSeveral), Error);
}

}  // namespace

TEST_CASE("a 4-bit base model equals its dequantized twin", "[quant][model]") {
  SECTION("nf4") { check(QuantKind::nf4); }
  SECTION("hqq") { check(QuantKind::hqq); }
}

TEST_CASE("quantization names", "[quant]") {
  CHECK(quant_kind_from_name("nf4") == QuantKind::nf4);
  CHECK_THROWS_AS(quant_kind_from_name("int3"), Error);
  CHECK(is_quantized_linear("model.layers.3.mlp.down_proj.weight"));
  CHECK_FALSE(is_quantized_linear("model.layers.3.input_layernorm.weight"));
  CHECK_FALSE(is_quantized_linear("lm_head.weight"));
}
