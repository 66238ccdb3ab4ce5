// bench_attention: times frugal's CUDA causal attention (forward, forward + backward) on one
// shape and prints one JSON line; with --dump FILE it also writes the inputs and outputs of one
// forward + backward for tools/bench/torch_sdpa.py to compare with PyTorch.
//
// usage: bench_attention --batch B --heads H --kv-heads KVH --seq S --head-dim D
//                        [--iters N] [--dump FILE] [--backward-tiles large|small]
//                        [--kernel auto|fa2|sm90] [--sm90-dq auto|fused|separate] [--window W]
//                        [--grads auto|f32|bf16] [--documents fixed:N|mix:SEED]
// (--backward-tiles forces the FlashAttention-2 backward's tiling, e.g. the one for 99 KiB of
// shared memory. --kernel: auto is attention.h's choice (the Hopper kernels on compute
// capability 9.0), fa2 the FlashAttention-2 kernels
// (flash_attention.h), sm90 the Hopper ones (flash_attention_sm90.h, compute capability 9.0 only).
// --sm90-dq, with --kernel sm90: how its backward sums dQ (Sm90DqSum: fused into the dK/dV pass,
// or a separate kernel). --grads: the gradients the backward makes, bf16 written once (the
// Hopper kernels, dQ by the separate kernel: what a training step's attention uses there) or fp32
// accumulated (zeroed first, and that is timed too; a ring's blocks add up this way); auto is
// bf16 where attention_backward_writes_bf16 says so and --sm90-dq is not fused, otherwise f32.)
// Layouts are frugal's: q, out [B, S, H, D]; k, v [B, S, KVH, D]; lse [B, H, S] (bf16, fp32).
// FLOPs counted as FlashAttention does: forward 4 B H S^2 D / 2 (causal), backward 2.5x that.
// --window W (Mistral's sliding window; not with --dump) counts the pairs inside the window
// instead of S^2 / 2: W (W + 1) / 2 + (S - W) W, so time / FLOPs shows whether the kernels skip
// the tiles outside it (constant TFLOP/s as S grows at fixed W means O(S W) time).
// --documents packs each sequence with documents back to back and masks attention to stay inside
// each (AttentionShape::documents, per-sequence bounds on the device; not with --window):
// fixed:N documents of N tokens, mix:SEED lengths drawn as document_lengths says; the last
// document of a sequence is cut where the sequence ends. FLOPs then count the visible pairs,
// L^2 / 2 for each document of L tokens (S^2 / 2 is the same count for one document), and the
// JSON line adds the lengths (per sequence, so tools/bench/torch_flex_attention.py rebuilds the
// same mask), their summary, and the share of the causal 128x128 tiles that hold no visible
// pair (the work a kernel that skips empty tiles saves).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_sm90.h"

namespace {

using bf16 = __nv_bfloat16;

// Uniform values in [-amplitude, amplitude] from a counter hash (splitmix64), so inputs are
// random but cheap to make at any size.
__global__ void fill_random(bf16* x, int64_t n, uint64_t seed, float amplitude) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
    x[i] = __float2bfloat16((2.0f * u - 1.0f) * amplitude);
  }
}

template <class T>
T* device_alloc(int64_t n) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, sizeof(T) * static_cast<size_t>(std::max<int64_t>(n, 1))));
  return p;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class T>
void write_host(FILE* f, const std::vector<T>& h) {
  if (std::fwrite(h.data(), sizeof(T), h.size(), f) != h.size()) {
    std::fprintf(stderr, "bench_attention: short write\n");
    std::exit(1);
  }
}

template <class T>
void write_device(FILE* f, const T* d, int64_t n) {
  std::vector<T> h(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(h.data(), d, sizeof(T) * h.size(), cudaMemcpyDeviceToHost));
  write_host(f, h);
}

// bf16 values written as fp32 (exactly: a bf16 is the top half of its float).
void write_device_widened(FILE* f, const bf16* d, int64_t n) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(bits.data(), d, sizeof(uint16_t) * bits.size(), cudaMemcpyDeviceToHost));
  std::vector<float> h(bits.size());
  for (size_t i = 0; i < h.size(); ++i) {
    const uint32_t word = uint32_t{bits[i]} << 16;
    std::memcpy(&h[i], &word, sizeof(float));
  }
  write_host(f, h);
}

// How --documents fills each sequence.
enum class DocumentKind { kNone, kFixed, kMix };
struct DocumentSpec {
  DocumentKind kind = DocumentKind::kNone;
  int64_t length = 0;  // kFixed: tokens per document
  uint64_t seed = 0;   // kMix: the lengths' random stream
  std::string text = "none";
};

// Digits only (no sign, no suffix), at most 18 of them: strtoull alone takes " 12", "-1", "1x".
bool parse_count(const std::string& text, uint64_t* value) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *value = std::strtoull(text.c_str(), nullptr, 10);
  return true;
}

// "fixed:N" (N >= 1) or "mix:SEED"; false for anything else.
bool parse_documents(const std::string& text, DocumentSpec* spec) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  const std::string kind = text.substr(0, colon);
  uint64_t value = 0;
  if (!parse_count(text.substr(colon + 1), &value)) return false;
  if (kind == "fixed" && value >= 1) {
    spec->kind = DocumentKind::kFixed;
    spec->length = static_cast<int64_t>(value);
  } else if (kind == "mix") {
    spec->kind = DocumentKind::kMix;
    spec->seed = value;
  } else {
    return false;
  }
  spec->text = text;
  return true;
}

// Lengths of the documents packed into each of `batch` sequences of `seq` tokens, in order;
// each sequence's sum is seq (its last document cut where the sequence ends).
// mix: a log-normal with median 300 tokens and sigma 1 (natural log), at least 16 tokens:
// mean ~500, one in ten past ~1,100 and one in a hundred past ~3,000. Chat and instruction
// sets look like this (most examples a few hundred tokens, a long tail of long ones), and the
// tail matters here: a long document keeps its full causal triangle, so it sets how much work
// the mask saves. An assumed shape, not one fitted to a data set. The draws come from
// mt19937_64 (its output is fixed by the standard) through Box-Muller written out here
// (std::normal_distribution's is not), so a seed gives the same lengths on every machine;
// one stream for the whole batch, so the sequences differ.
std::vector<std::vector<int64_t>> document_lengths(const DocumentSpec& spec, int64_t batch,
                                                   int64_t seq) {
  constexpr double kMedianTokens = 300, kSigma = 1.0;
  constexpr int64_t kMinTokens = 16;
  std::mt19937_64 random(spec.seed);
  auto unit = [&] { return (static_cast<double>(random() >> 11) + 1.0) * 0x1p-53; };  // (0, 1]
  auto draw = [&]() -> int64_t {
    if (spec.kind == DocumentKind::kFixed) return spec.length;
    constexpr double kTwoPi = 6.283185307179586;
    const double radius = std::sqrt(-2.0 * std::log(unit()));  // two draws, in this order
    const double z = radius * std::cos(kTwoPi * unit());
    return std::max(kMinTokens,
                    static_cast<int64_t>(std::llround(kMedianTokens * std::exp(kSigma * z))));
  };
  std::vector<std::vector<int64_t>> lengths(static_cast<size_t>(batch));
  for (auto& sequence : lengths) {
    if (spec.kind == DocumentKind::kNone) {
      sequence.push_back(seq);
      continue;
    }
    for (int64_t filled = 0; filled < seq;) {
      const int64_t length = std::min(draw(), seq - filled);
      sequence.push_back(length);
      filled += length;
    }
  }
  return lengths;
}

// The mask's arrays (cpu::DocumentMask) for self-attention over sequences packed as `lengths`:
// for every position, where its document starts and one past where it ends ([batch, seq]).
struct DocumentBoundsHost {
  std::vector<int32_t> start, end;
};
DocumentBoundsHost document_bounds(const std::vector<std::vector<int64_t>>& lengths) {
  DocumentBoundsHost bounds;
  for (const auto& sequence : lengths) {
    int64_t first = 0;
    for (const int64_t length : sequence) {
      bounds.start.insert(bounds.start.end(), static_cast<size_t>(length),
                          static_cast<int32_t>(first));
      bounds.end.insert(bounds.end.end(), static_cast<size_t>(length),
                        static_cast<int32_t>(first + length));
      first += length;
    }
  }
  return bounds;
}

// Tiles of 128 query rows x 128 keys of all sequences that hold a visible pair, under the
// document mask and under plain causal attention. A row q sees keys [start(q), q]; all rows of
// a tile row share q / 128 as their last tile, and start is non-decreasing, so the tile row's
// visible tiles run from its first row's start / 128 to the diagonal.
struct TileCounts {
  int64_t documents = 0, causal = 0;
};
TileCounts visible_tiles(const DocumentBoundsHost& bounds, int64_t batch, int64_t seq) {
  constexpr int64_t kTile = 128;
  TileCounts counts;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t row = 0; row < seq; row += kTile) {
      const int64_t diagonal = row / kTile;
      counts.causal += diagonal + 1;
      counts.documents += diagonal - bounds.start[static_cast<size_t>(b * seq + row)] / kTile + 1;
    }
  return counts;
}

// The lengths as JSON: one array per sequence.
std::string lengths_json(const std::vector<std::vector<int64_t>>& lengths) {
  std::string json = "[";
  for (size_t b = 0; b < lengths.size(); ++b) {
    json += b == 0 ? "[" : ", [";
    for (size_t i = 0; i < lengths[b].size(); ++i)
      json += (i == 0 ? "" : ", ") + std::to_string(lengths[b][i]);
    json += "]";
  }
  return json + "]";
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_attention --batch B --heads H --kv-heads KVH --seq S --head-dim D "
               "[--iters N] [--dump FILE] [--backward-tiles large|small] [--kernel auto|fa2|sm90] "
               "[--sm90-dq auto|fused|separate] [--window W] [--grads auto|f32|bf16] "
               "[--documents fixed:N|mix:SEED]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0, window = 0;
  int iters = 10;
  std::string dump, tiles_name = "auto", kernel = "auto", sm90_dq = "auto", grads = "auto";
  DocumentSpec documents;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--batch")
      batch = std::atoll(value.c_str());
    else if (key == "--heads")
      heads = std::atoll(value.c_str());
    else if (key == "--kv-heads")
      kv_heads = std::atoll(value.c_str());
    else if (key == "--seq")
      seq = std::atoll(value.c_str());
    else if (key == "--head-dim")
      head_dim = std::atoll(value.c_str());
    else if (key == "--iters")
      iters = std::atoi(value.c_str());
    else if (key == "--dump")
      dump = value;
    else if (key == "--backward-tiles")
      tiles_name = value;
    else if (key == "--kernel")
      kernel = value;
    else if (key == "--sm90-dq")
      sm90_dq = value;
    else if (key == "--window")
      window = std::atoll(value.c_str());
    else if (key == "--grads")
      grads = value;
    else if (key == "--documents") {
      if (!parse_documents(value, &documents)) {
        std::fprintf(stderr,
                     "bench_attention: --documents '%s': expected fixed:N (N >= 1 tokens per "
                     "document) or mix:SEED (SEED a non-negative integer)\n",
                     value.c_str());
        return 2;
      }
    } else
      return usage();
  }
  if (argc % 2 == 0 || batch <= 0 || heads <= 0 || kv_heads <= 0 || seq <= 0 || head_dim <= 0 ||
      iters <= 0 || (tiles_name != "auto" && tiles_name != "large" && tiles_name != "small") ||
      (kernel != "auto" && kernel != "fa2" && kernel != "sm90") ||
      (kernel == "sm90" && tiles_name != "auto") || window < 0 || (window > 0 && !dump.empty()) ||
      (sm90_dq != "auto" && sm90_dq != "fused" && sm90_dq != "separate") ||
      (sm90_dq != "auto" && kernel != "sm90") ||
      (grads != "auto" && grads != "f32" && grads != "bf16") ||
      (grads == "bf16" && (kernel == "fa2" || sm90_dq == "fused")))
    return usage();
  if (documents.kind != DocumentKind::kNone && window > 0) {
    std::fprintf(stderr, "bench_attention: --documents and --window together are not measured\n");
    return 2;
  }
  if (seq > INT32_MAX / 2) {
    std::fprintf(stderr, "bench_attention: --seq %lld is too long\n", static_cast<long long>(seq));
    return 2;
  }
  // The lengths, their mask's arrays and tile counts are made on the host before any CUDA call.
  const std::vector<std::vector<int64_t>> doc_lengths = document_lengths(documents, batch, seq);
  const DocumentBoundsHost doc_bounds = document_bounds(doc_lengths);
  const TileCounts tiles_visible = visible_tiles(doc_bounds, batch, seq);
  const auto dq_sum = sm90_dq == "fused"      ? frugal::cuda::Sm90DqSum::kFused
                      : sm90_dq == "separate" ? frugal::cuda::Sm90DqSum::kSeparateKernel
                                              : frugal::cuda::Sm90DqSum::kAuto;
  const auto tiles = tiles_name == "large"   ? frugal::cuda::FlashBackwardTiles::kLargeSmem
                     : tiles_name == "small" ? frugal::cuda::FlashBackwardTiles::kSmallSmem
                                             : frugal::cuda::FlashBackwardTiles::kAuto;

  try {
    frugal::cuda::AttentionShape s;
    s.batch = batch;
    s.q_len = s.kv_len = seq;
    s.n_heads = heads;
    s.n_kv_heads = kv_heads;
    s.head_dim = head_dim;
    s.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    s.causal_offset = 0;
    s.window = window;
    const int64_t q_n = batch * seq * heads * head_dim, kv_n = batch * seq * kv_heads * head_dim;
    const int64_t lse_n = batch * heads * seq;
    bf16 *q = device_alloc<bf16>(q_n), *k = device_alloc<bf16>(kv_n), *v = device_alloc<bf16>(kv_n);
    bf16 *out = device_alloc<bf16>(q_n), *dout = device_alloc<bf16>(q_n);
    float *lse = device_alloc<float>(lse_n), *dq = device_alloc<float>(q_n);
    float *dk = device_alloc<float>(kv_n), *dv = device_alloc<float>(kv_n);
    float* scratch = device_alloc<float>(frugal::cuda::attention_backward_scratch_floats(s));
    bf16 *dq_bf16 = device_alloc<bf16>(q_n), *dk_bf16 = device_alloc<bf16>(kv_n),
         *dv_bf16 = device_alloc<bf16>(kv_n);
    if (documents.kind != DocumentKind::kNone) {
      int32_t* doc_start = device_alloc<int32_t>(batch * seq);
      int32_t* doc_end = device_alloc<int32_t>(batch * seq);
      CUDA_CHECK(cudaMemcpy(doc_start, doc_bounds.start.data(), sizeof(int32_t) * batch * seq,
                            cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(doc_end, doc_bounds.end.data(), sizeof(int32_t) * batch * seq,
                            cudaMemcpyHostToDevice));
      s.documents.query_doc_start = doc_start;
      s.documents.key_doc_end = doc_end;
      s.documents.key_position0 = 0;  // self-attention: key row j is position j
    }
    fill_random<<<1024, 256>>>(q, q_n, 1, 2.0f);
    fill_random<<<1024, 256>>>(k, kv_n, 2, 2.0f);
    fill_random<<<1024, 256>>>(v, kv_n, 3, 1.0f);
    fill_random<<<1024, 256>>>(dout, q_n, 4, 1.0f);
    CUDA_CHECK_LAUNCH();
    const cudaStream_t stream = nullptr;

    if (kernel == "sm90" &&
        !frugal::cuda::flash_attention_sm90_supports(s, {q, k, v, out, dout}, {dq, dk, dv})) {
      std::fprintf(stderr,
                   "bench_attention: --kernel sm90 needs a compute capability 9.0 GPU "
                   "and a build with sm_90a\n");
      return 1;
    }
    auto forward = [&] {
      if (kernel == "sm90")
        frugal::cuda::flash_attention_sm90_forward(out, lse, q, k, v, s, stream);
      else if (kernel == "fa2")
        frugal::cuda::flash_attention_forward(out, lse, q, k, v, s, stream);
      else
        frugal::cuda::attention_forward(out, lse, q, k, v, s, /*allow_sm90=*/true, stream);
    };
    if (grads == "auto")
      grads = kernel != "fa2" && sm90_dq != "fused" &&
                      frugal::cuda::attention_backward_writes_bf16(
                          s, {q, k, v, out, dout, dq_bf16, dk_bf16, dv_bf16}, /*allow_sm90=*/true)
                  ? "bf16"
                  : "f32";
    auto forward_backward = [&] {
      forward();
      if (grads == "bf16") {
        if (kernel == "sm90")
          frugal::cuda::flash_attention_sm90_backward(dq_bf16, dk_bf16, dv_bf16, dout, q, k, v, out,
                                                      lse, s, scratch, stream, dq_sum);
        else
          frugal::cuda::attention_backward(dq_bf16, dk_bf16, dv_bf16, dout, q, k, v, out, lse, s,
                                           scratch, /*allow_sm90=*/true, stream);
        return;
      }
      // The backward accumulates: a caller zeroes the gradients first, so that is timed too.
      CUDA_CHECK(cudaMemsetAsync(dq, 0, sizeof(float) * q_n, stream));
      CUDA_CHECK(cudaMemsetAsync(dk, 0, sizeof(float) * kv_n, stream));
      CUDA_CHECK(cudaMemsetAsync(dv, 0, sizeof(float) * kv_n, stream));
      if (kernel == "sm90")
        frugal::cuda::flash_attention_sm90_backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch,
                                                    stream, dq_sum);
      else if (kernel == "auto" && tiles == frugal::cuda::FlashBackwardTiles::kAuto)
        frugal::cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch,
                                         /*allow_sm90=*/true, stream);
      else
        frugal::cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch,
                                               stream, tiles);
    };
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    auto time_ms = [&](auto&& fn) {
      for (int i = 0; i < 3; ++i) fn();  // warm-up
      std::vector<float> ms;
      for (int i = 0; i < iters; ++i) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        fn();
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
      }
      return median(ms);
    };
    const double fwd_ms = time_ms(forward);
    const double fwdbwd_ms = time_ms(forward_backward);
    const double w = double(window > 0 && window < seq ? window : seq);
    double pairs = window > 0 && window < seq ? w * (w + 1) / 2 + (double(seq) - w) * w
                                              : double(seq) * seq / 2;
    if (documents.kind != DocumentKind::kNone) {  // per sequence, averaged over the batch
      pairs = 0;
      for (const auto& sequence : doc_lengths)
        for (const int64_t length : sequence) pairs += double(length) * length / 2;
      pairs /= double(batch);
    }
    const double fwd_flop = 4.0 * batch * heads * pairs * head_dim;
    const double fwdbwd_flop = fwd_flop * 3.5;
    std::string document_fields;
    if (documents.kind != DocumentKind::kNone) {
      std::vector<int64_t> all;
      for (const auto& sequence : doc_lengths)
        all.insert(all.end(), sequence.begin(), sequence.end());
      std::sort(all.begin(), all.end());
      char summary[512];
      std::snprintf(summary, sizeof summary,
                    ", \"doc_count\": %zu, \"doc_len_min\": %lld, \"doc_len_median\": %lld, "
                    "\"doc_len_mean\": %.1f, \"doc_len_max\": %lld, \"pairs_share_of_causal\": "
                    "%.4f, \"tiles_visible\": %lld, \"tiles_causal\": %lld, "
                    "\"tiles_skipped_vs_causal\": %.4f, \"doc_lengths\": ",
                    all.size(), static_cast<long long>(all.front()),
                    static_cast<long long>(all[all.size() / 2]),
                    double(batch * seq) / double(all.size()), static_cast<long long>(all.back()),
                    pairs / (double(seq) * seq / 2),
                    static_cast<long long>(tiles_visible.documents),
                    static_cast<long long>(tiles_visible.causal),
                    1.0 - double(tiles_visible.documents) / double(tiles_visible.causal));
      document_fields = summary + lengths_json(doc_lengths);
    }
    std::printf(
        "{\"impl\": \"frugal\", \"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"seq\": "
        "%lld, \"head_dim\": %lld, \"window\": %lld, \"kernel\": \"%s\", \"backward_tiles\": "
        "\"%s\", \"sm90_dq\": \"%s\", \"grads\": \"%s\", \"fwd_ms\": %.4f, \"fwd_tflops\": "
        "%.1f, \"fwdbwd_ms\": %.4f, "
        "\"fwdbwd_tflops\": %.1f, \"documents\": \"%s\"%s}\n",
        static_cast<long long>(batch), static_cast<long long>(heads),
        static_cast<long long>(kv_heads), static_cast<long long>(seq),
        static_cast<long long>(head_dim), static_cast<long long>(window), kernel.c_str(),
        tiles_name.c_str(), sm90_dq.c_str(), grads.c_str(), fwd_ms, fwd_flop / fwd_ms * 1e-9,
        fwdbwd_ms, fwdbwd_flop / fwdbwd_ms * 1e-9, documents.text.c_str(), document_fields.c_str());

    if (!dump.empty()) {
      // One more forward + backward on the same inputs (the result is deterministic), then
      // header (5 int64: B H KVH S D) q k v dout out (bf16) lse dq dk dv (fp32), and with
      // --documents the lengths: per sequence an int64 count, then that many int64 lengths.
      forward_backward();
      CUDA_CHECK(cudaDeviceSynchronize());
      FILE* f = std::fopen(dump.c_str(), "wb");
      if (f == nullptr) {
        std::fprintf(stderr, "bench_attention: cannot write %s\n", dump.c_str());
        return 1;
      }
      const int64_t header[5] = {batch, heads, kv_heads, seq, head_dim};
      std::fwrite(header, sizeof(int64_t), 5, f);
      write_device(f, q, q_n);
      write_device(f, k, kv_n);
      write_device(f, v, kv_n);
      write_device(f, dout, q_n);
      write_device(f, out, q_n);
      write_device(f, lse, lse_n);
      if (grads == "bf16") {
        write_device_widened(f, dq_bf16, q_n);
        write_device_widened(f, dk_bf16, kv_n);
        write_device_widened(f, dv_bf16, kv_n);
      } else {
        write_device(f, dq, q_n);
        write_device(f, dk, kv_n);
        write_device(f, dv, kv_n);
      }
      if (documents.kind != DocumentKind::kNone)
        for (const auto& sequence : doc_lengths) {
          write_host(f, std::vector<int64_t>{static_cast<int64_t>(sequence.size())});
          write_host(f, sequence);
        }
      if (std::fclose(f) != 0) {
        std::fprintf(stderr, "bench_attention: cannot write %s\n", dump.c_str());
        return 1;
      }
    }
    CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
