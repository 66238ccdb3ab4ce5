// The GPU's seeded rows and NF4 first level against their CPU twins (kernels/cpu/normal_init.h,
// kernels/cpu/quant.h): the rows equal bit for bit except at the indices the kernel hands over,
// and equal everywhere once the host's values for those are put in place; the codes and absmax
// equal bit for bit, an inf or NaN block reported as the CPU reports it. Awkward sizes (odd row
// lengths, block counts not multiples of the warps per CUDA block).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <tuple>
#include <vector>

#include "catch_compat.h"
#include "gpu_support.h"
#include "kernels/cpu/normal_init.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/normal_init.h"
#include "kernels/cuda/quant.h"
#include "quant/nf4.h"

namespace {

using frugal::test::DeviceBuffer;

}  // namespace

TEST_CASE("cuda normal_rows equals the CPU's after the hand-over", "[gpu]") {
  SKIP_WITHOUT_GPU();
  const uint64_t key = 0x5EEDull;
  // The last shape is large enough for hand-overs (about 1 value in 10^5).
  for (const auto& [rows, row_len, first_row] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 0}, {3, 7, 11}, {37, 448, 2}, {1531, 4160, 77}}) {
    INFO("rows " << rows << " x " << row_len << " from row " << first_row);
    const int64_t n = rows * row_len, capacity = 4096;
    std::vector<float> want(static_cast<size_t>(n));
    frugal::cpu::normal_rows(want.data(), rows, row_len, key, first_row, 0.02f);
    DeviceBuffer<float> out(static_cast<size_t>(n));
    DeviceBuffer<int64_t> index(capacity);
    DeviceBuffer<unsigned long long> count(1);
    frugal::cuda::normal_rows(out.get(), rows, row_len, key, first_row, 0.02f, index.get(),
                              count.get(), capacity, nullptr);
    const int64_t handed = static_cast<int64_t>(count.download()[0]);
    REQUIRE(handed <= capacity);
    std::vector<int64_t> handed_index = index.download();
    handed_index.resize(static_cast<size_t>(handed));
    const std::set<int64_t> handed_set(handed_index.begin(), handed_index.end());
    CHECK(handed_set.size() == handed_index.size());
    // Every difference is at an index handed over.
    const std::vector<float> got = out.download();
    int64_t unannounced = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(&got[size_t(i)], &want[size_t(i)], sizeof(float)) != 0)
        unannounced += handed_set.count(i) == 0;
    CHECK(unannounced == 0);
    // The host's values put in place: equal everywhere.
    std::vector<float> values;
    for (int64_t i : handed_index)
      values.push_back(frugal::cpu::normal_value(key, first_row + i / row_len, i % row_len, 0.02f));
    DeviceBuffer<float> device_values(values.data(), values.size());
    DeviceBuffer<int64_t> device_index(handed_index.data(), handed_index.size());
    frugal::cuda::scatter_values(out.get(), device_index.get(), device_values.get(), handed,
                                 nullptr);
    const std::vector<float> patched = out.download();
    CHECK(std::memcmp(patched.data(), want.data(), want.size() * sizeof(float)) == 0);
    std::printf("normal_rows [%ld, %ld]: %ld of %ld values handed to the host\n", long(rows),
                long(row_len), long(handed), long(n));
  }
}

TEST_CASE("cuda nf4_quantize_blocks equals the CPU's", "[gpu]") {
  SKIP_WITHOUT_GPU();
  for (const int64_t blocks : {int64_t{1}, int64_t{9}, int64_t{1237}}) {
    INFO(blocks << " blocks");
    std::vector<float> w(static_cast<size_t>(blocks * 64));
    frugal::cpu::normal_rows(w.data(), blocks, 64, 42 + blocks, 0, 0.05f);
    std::fill_n(w.begin(), 64, 0.0f);  // an all-zero block
    if (blocks > 2) w[70] = 3.0f;      // an outlier
    const float* mid = frugal::nf4_midpoints().data();
    std::vector<uint8_t> want_codes(static_cast<size_t>(blocks * 32));
    std::vector<float> want_absmax(static_cast<size_t>(blocks));
    REQUIRE(frugal::cpu::nf4_quantize_blocks(want_codes.data(), want_absmax.data(), w.data(),
                                             blocks, mid) == blocks);
    DeviceBuffer<float> device_w(w.data(), w.size());
    DeviceBuffer<uint8_t> codes(want_codes.size());
    DeviceBuffer<float> absmax(want_absmax.size());
    std::vector<int64_t> none{blocks};
    DeviceBuffer<int64_t> bad(none.data(), 1);
    frugal::cuda::nf4_quantize_blocks(codes.get(), absmax.get(), device_w.get(), blocks, mid,
                                      bad.get(), nullptr);
    CHECK(bad.download()[0] == blocks);
    CHECK(codes.download() == want_codes);
    const std::vector<float> got_absmax = absmax.download();
    CHECK(std::memcmp(got_absmax.data(), want_absmax.data(), want_absmax.size() * 4) == 0);
    // Non-finite values in two blocks: the first is reported, as on the CPU.
    w[static_cast<size_t>((blocks - 1) * 64 + 5)] = INFINITY;
    if (blocks > 2) w[static_cast<size_t>(2 * 64 + 63)] = NAN;
    const int64_t want_bad = frugal::cpu::nf4_quantize_blocks(want_codes.data(), want_absmax.data(),
                                                              w.data(), blocks, mid);
    CHECK(want_bad == (blocks > 2 ? 2 : blocks - 1));
    DeviceBuffer<float> bad_w(w.data(), w.size());
    bad.upload(none);
    frugal::cuda::nf4_quantize_blocks(codes.get(), absmax.get(), bad_w.get(), blocks, mid,
                                      bad.get(), nullptr);
    CHECK(bad.download()[0] == want_bad);
  }
}
