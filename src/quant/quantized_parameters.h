// A frozen model whose linear layers are stored 4-bit (NF4 with double quantization, or HQQ)
// and dequantized one unit at a time when the model gathers it: the base of QLoRA, and
// `frugal eval --quant`. Embeddings, norms and the head stay in fp32, as in QLoRA.
#pragma once

#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "model/llama_config.h"
#include "model/parameter_provider.h"
#include "quant/hqq.h"
#include "quant/nf4.h"

namespace frugal {

enum class QuantKind { none, nf4, hqq };
QuantKind quant_kind_from_name(const std::string& name);  // "none" | "nf4" | "hqq"; Error else
std::string quant_kind_name(QuantKind kind);

// The transformer blocks' projection weights (q, k, v, o, gate, up, down).
bool is_quantized_linear(const std::string& name);

class QuantizedParameters : public ParameterProvider {
 public:
  // `load` returns one parameter's fp32 values; it is called once per parameter, so host
  // memory holds the quantized model plus one full tensor at a time.
  QuantizedParameters(std::vector<UnitSpec> units, QuantKind kind,
                      const std::function<Tensor(const ParamSpec&)>& load);

  std::vector<Tensor> gather(int64_t unit) override;      // dequantized into fresh buffers
  void release(int64_t) override {}                       // the buffers go with their last user
  UnitGrads grads(int64_t unit, GradSums sums) override;  // an Error: the base is frozen
  void grads_done(int64_t) override {}
  void zero_grads() override {}
  std::vector<TrainableShard> trainable() override { return {}; }

  size_t stored_bytes() const;  // what the model occupies as stored (codes, scales, fp32)

 private:
  using Stored = std::variant<Tensor, Nf4Weight, HqqWeight>;
  std::vector<UnitSpec> units_;
  std::vector<std::vector<Stored>> stored_;
};

}  // namespace frugal
