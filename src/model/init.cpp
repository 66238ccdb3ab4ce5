// Deterministic, sharding-independent parameter initialisation.
#include <cmath>
#include <cstdint>

#include "core/random.h"
#include "model/lora.h"
#include "model/parameter_provider.h"
#include "ops/ops.h"

namespace frugal {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool is_norm(const std::string& name) { return name.find("norm") != std::string::npos; }

}  // namespace

void init_parameter_rows(Tensor& rows, const std::string& name, int64_t first_row, uint64_t seed,
                         float std) {
  float* out = rows.data<float>();
  if (is_norm(name)) {
    for (int64_t i = 0; i < rows.numel(); ++i) out[i] = 1.0f;
    return;
  }
  const int64_t n_rows = rows.ndim() == 0 ? 1 : rows.size(0);
  const int64_t row_len = n_rows ? rows.numel() / n_rows : 0;
  const uint64_t name_hash = fnv1a(name);
  if (is_lora_b(name)) {  // LoRA starts from the base model: B = 0
    for (int64_t i = 0; i < rows.numel(); ++i) out[i] = 0.0f;
    return;
  }
  if (is_lora_a(name)) {  // PEFT's kaiming_uniform(a = sqrt(5)): uniform in +-1/sqrt(fan_in)
    const double bound = 1.0 / std::sqrt(double(row_len));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n_rows; ++r) {
      uint64_t state = seed ^ name_hash ^ (0xD1B54A32D192ED03ull * uint64_t(first_row + r + 1));
      for (int64_t j = 0; j < row_len; ++j)
        out[r * row_len + j] = static_cast<float>(bound * (2.0 * uniform01(state) - 1.0));
    }
    return;
  }
  // Box-Muller pairs on each row's own stream (kernels/normal_init.h).
  ops::normal_rows(rows, init_row_key(name, seed), first_row, std);
}

bool init_is_normal(const std::string& name) {
  return !is_norm(name) && !is_lora_a(name) && !is_lora_b(name);
}

uint64_t init_row_key(const std::string& name, uint64_t seed) { return seed ^ fnv1a(name); }

}  // namespace frugal
