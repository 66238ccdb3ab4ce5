// Deterministic, sharding-independent parameter initialisation.
#include <cmath>
#include <cstdint>

#include "core/random.h"
#include "model/lora.h"
#include "model/parameter_provider.h"

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
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n_rows; ++r) {
    uint64_t state = seed ^ name_hash ^ (0xD1B54A32D192ED03ull * uint64_t(first_row + r + 1));
    float* row = out + r * row_len;
    for (int64_t j = 0; j < row_len; j += 2) {
      // Box-Muller on two uniforms in (0, 1].
      double u1 = (double(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: finite log
      double u2 = uniform01(state);
      double radius = std::sqrt(-2.0 * std::log(u1));
      row[j] = static_cast<float>(std * radius * std::cos(2.0 * M_PI * u2));
      if (j + 1 < row_len)
        row[j + 1] = static_cast<float>(std * radius * std::sin(2.0 * M_PI * u2));
    }
  }
}

}  // namespace frugal
