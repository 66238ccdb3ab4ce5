// 4-bit storage of the linear layers, dequantized per unit on gather.
#include "quant/quantized_parameters.h"

namespace frugal {

QuantKind quant_kind_from_name(const std::string& name) {
  if (name == "none") return QuantKind::none;
  if (name == "nf4") return QuantKind::nf4;
  if (name == "hqq") return QuantKind::hqq;
  fail("quantization '", name, "' is not one of none, nf4, hqq");
}

std::string quant_kind_name(QuantKind kind) {
  switch (kind) {
    case QuantKind::none:
      return "none";
    case QuantKind::nf4:
      return "nf4";
    case QuantKind::hqq:
      return "hqq";
  }
  return "?";
}

bool is_quantized_linear(const std::string& name) {
  for (const char* part :
       {".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj.", ".self_attn.o_proj.",
        ".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj."})
    if (name.find(part) != std::string::npos) return true;
  return false;
}

QuantizedParameters::QuantizedParameters(std::vector<UnitSpec> units, QuantKind kind,
                                         const std::function<Tensor(const ParamSpec&)>& load)
    : units_(std::move(units)) {
  for (const UnitSpec& unit : units_) {
    std::vector<Stored> stored;
    for (const ParamSpec& spec : unit.params) {
      Tensor w = load(spec);
      FRUGAL_CHECK(w.shape() == spec.shape, spec.name, " loaded as ", shape_string(w.shape()));
      if (kind == QuantKind::nf4 && is_quantized_linear(spec.name))
        stored.emplace_back(nf4_quantize(w, spec.name));
      else if (kind == QuantKind::hqq && is_quantized_linear(spec.name))
        stored.emplace_back(hqq_quantize(w, spec.name));
      else
        stored.emplace_back(w);
    }
    stored_.push_back(std::move(stored));
  }
}

std::vector<Tensor> QuantizedParameters::gather(int64_t unit) {
  std::vector<Tensor> out;
  for (const Stored& s : stored_.at(unit)) {
    if (const Tensor* t = std::get_if<Tensor>(&s))
      out.push_back(*t);
    else if (const Nf4Weight* q = std::get_if<Nf4Weight>(&s))
      out.push_back(nf4_dequantize(*q));
    else
      out.push_back(hqq_dequantize(std::get<HqqWeight>(s)));
  }
  return out;
}

UnitGrads QuantizedParameters::grads(int64_t unit, GradSums) {
  fail("unit ", units_.at(unit).name, " of a quantized model is frozen: it has no gradients");
}

size_t QuantizedParameters::stored_bytes() const {
  size_t bytes = 0;
  for (const auto& unit : stored_)
    for (const Stored& s : unit) {
      if (const Tensor* t = std::get_if<Tensor>(&s))
        bytes += t->bytes();
      else if (const Nf4Weight* q = std::get_if<Nf4Weight>(&s))
        bytes += q->codes.bytes() + q->absmax_codes.bytes() + q->absmax_scales.bytes();
      else {
        const HqqWeight& h = std::get<HqqWeight>(s);
        bytes += h.codes.bytes() + h.scales.bytes() + h.zeros.bytes();
      }
    }
  return bytes;
}

}  // namespace frugal
