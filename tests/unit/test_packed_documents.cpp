// Packed documents (issue 50): a sequence holding several documents back to back must train as
// the documents run alone. The CPU attention kernel against a float64 reference that runs each
// document alone (GQA, sliding window, batches of different documents, and ring-like block pairs
// merged by their log-sum-exps); and the whole model against transformers on the fixture of
// tools/make_packing_fixtures.py (loss and every gradient within 1e-5), against the documents run
// alone in frugal, and without the documents, which must be clearly off.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "ckpt/safetensors.h"
#include "kernels/cpu/attention.h"
#include "model/hf_model.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"

using namespace frugal;
namespace fs = std::filesystem;

namespace {

using Vec = std::vector<double>;
using FVec = std::vector<float>;
// Each sequence's documents, their lengths in order (they fill the sequence).
using DocumentLengths = std::vector<std::vector<int64_t>>;

// The largest |got - want| over the largest |want|: an error relative to the tensor's scale,
// meaningful where single elements are near zero.
template <typename A, typename B>
double scaled_error(const A& got, const B& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return diff / scale;
}

// Where each token's document starts and ends, in positions of its sequence (i32 [B*S]).
struct Bounds {
  std::vector<int32_t> start, end;
};
Bounds bounds_of(const DocumentLengths& rows, int64_t seq) {
  Bounds b;
  for (const std::vector<int64_t>& lengths : rows) {
    int64_t at = 0;
    for (int64_t n : lengths) {
      for (int64_t t = 0; t < n; ++t) {
        b.start.push_back(int32_t(at));
        b.end.push_back(int32_t(at + n));
      }
      at += n;
    }
    REQUIRE(at == seq);
  }
  return b;
}

// ---- kernel level -------------------------------------------------------------------------

struct Dims {
  int64_t batch, seq, heads, kv_heads, head_dim, window;
};

struct AttentionResult {
  Vec out, lse, dq, dk, dv;
};

// Causal (windowed) attention of ONE sequence of n rows in float64, knowing nothing of
// documents: out, lse, and the gradients of sum(out * dout), by the textbook backward
// (dS = P * (dP - rowsum(P * dP))).
AttentionResult causal_attention_reference(int64_t n, const Dims& d, const Vec& q, const Vec& k,
                                           const Vec& v, const Vec& dout) {
  const int64_t H = d.heads, G = d.kv_heads, D = d.head_dim;
  const double scale = 1.0 / std::sqrt(double(D));
  AttentionResult r{Vec(n * H * D), Vec(n * H), Vec(n * H * D), Vec(n * G * D), Vec(n * G * D)};
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / G);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t first = d.window > 0 ? std::max<int64_t>(0, i - d.window + 1) : 0;
      Vec p;
      for (int64_t j = first; j <= i; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < D; ++e) dot += q[(i * H + h) * D + e] * k[(j * G + g) * D + e];
        p.push_back(dot * scale);
      }
      const double max = *std::max_element(p.begin(), p.end());
      double sum = 0;
      for (double s : p) sum += std::exp(s - max);
      const double lse = max + std::log(sum);
      r.lse[i * H + h] = lse;
      for (double& s : p) s = std::exp(s - lse);
      Vec dp(p.size());
      double row_sum = 0;
      for (size_t m = 0; m < p.size(); ++m) {
        const int64_t j = first + int64_t(m);
        for (int64_t e = 0; e < D; ++e) {
          r.out[(i * H + h) * D + e] += p[m] * v[(j * G + g) * D + e];
          dp[m] += dout[(i * H + h) * D + e] * v[(j * G + g) * D + e];
        }
        row_sum += p[m] * dp[m];
      }
      for (size_t m = 0; m < p.size(); ++m) {
        const int64_t j = first + int64_t(m);
        const double ds = p[m] * (dp[m] - row_sum) * scale;
        for (int64_t e = 0; e < D; ++e) {
          r.dq[(i * H + h) * D + e] += ds * k[(j * G + g) * D + e];
          r.dk[(j * G + g) * D + e] += ds * q[(i * H + h) * D + e];
          r.dv[(j * G + g) * D + e] += p[m] * dout[(i * H + h) * D + e];
        }
      }
    }
  }
  return r;
}

// The packed layout's expected result: each document's rows copied out, run alone through
// causal_attention_reference, and copied back to their places.
AttentionResult documents_alone_reference(const Dims& d, const DocumentLengths& rows, const Vec& q,
                                          const Vec& k, const Vec& v, const Vec& dout) {
  const int64_t S = d.seq, H = d.heads, G = d.kv_heads, D = d.head_dim;
  AttentionResult r{Vec(q.size()), Vec(d.batch * H * S), Vec(q.size()), Vec(k.size()),
                    Vec(k.size())};
  for (int64_t b = 0; b < d.batch; ++b) {
    int64_t start = 0;
    for (int64_t n : rows[size_t(b)]) {
      auto rows_of = [&](const Vec& x, int64_t width) {
        const auto first = x.begin() + ((b * S + start) * width * D);
        return Vec(first, first + n * width * D);
      };
      const AttentionResult doc = causal_attention_reference(n, d, rows_of(q, H), rows_of(k, G),
                                                             rows_of(v, G), rows_of(dout, H));
      auto put = [&](Vec& to, const Vec& from, int64_t width) {
        std::copy(from.begin(), from.end(), to.begin() + (b * S + start) * width * D);
      };
      put(r.out, doc.out, H);
      put(r.dq, doc.dq, H);
      put(r.dk, doc.dk, G);
      put(r.dv, doc.dv, G);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < H; ++h) r.lse[(b * H + h) * S + start + i] = doc.lse[i * H + h];
      start += n;
    }
  }
  return r;
}

// Rows [first, first + count) of every sequence of x ([B, S, width]) as [B, count, width].
template <typename T>
std::vector<T> sequence_rows(const std::vector<T>& x, int64_t batch, int64_t seq, int64_t width,
                             int64_t first, int64_t count) {
  std::vector<T> part;
  for (int64_t b = 0; b < batch; ++b) {
    const auto from = x.begin() + (b * seq + first) * width;
    part.insert(part.end(), from, from + count * width);
  }
  return part;
}

// The kernel on the packed layout, its sequences cut into blocks at `cuts` (0 and seq
// included) as a ring cuts them: every query block against every key block (causal_offset =
// the distance of their first positions, key_position0 = the key block's first position),
// the blocks' outputs merged by their log-sum-exps, and the backward of each pair given the
// merged output and log-sum-exp, its dq, dk, dv added where the rows belong. One block (cuts
// {0, seq}) is ordinary self-attention. With `use_documents` false the kernel is given no
// documents (the case that must fail).
AttentionResult packed_kernel(const Dims& d, const Bounds& bounds, const std::vector<int64_t>& cuts,
                              const FVec& q, const FVec& k, const FVec& v, const FVec& dout,
                              bool use_documents = true) {
  const int64_t B = d.batch, S = d.seq, H = d.heads, G = d.kv_heads, D = d.head_dim;
  const int64_t n_blocks = int64_t(cuts.size()) - 1;
  auto shape_of = [&](int64_t qb, int64_t kb, const std::vector<int32_t>& q_start,
                      const std::vector<int32_t>& k_end) {
    cpu::AttentionShape s;
    s.batch = B;
    s.q_len = cuts[qb + 1] - cuts[qb];
    s.kv_len = cuts[kb + 1] - cuts[kb];
    s.n_heads = H;
    s.n_kv_heads = G;
    s.head_dim = D;
    s.scale = 1.0f / std::sqrt(float(D));
    s.causal_offset = cuts[qb] - cuts[kb];
    s.window = d.window;
    if (use_documents) {
      s.documents.query_doc_start = q_start.data();
      s.documents.key_doc_end = k_end.data();
      s.documents.key_position0 = cuts[kb];
    }
    return s;
  };
  auto rows = [&](const auto& x, int64_t width, int64_t block) {
    return sequence_rows(x, B, S, width, cuts[block], cuts[block + 1] - cuts[block]);
  };

  // Forward: each pair, merged per query row in float64.
  AttentionResult r{Vec(q.size()), Vec(B * H * S), Vec(q.size()), Vec(k.size()), Vec(k.size())};
  FVec merged_out(q.size()), merged_lse(B * H * S);
  for (int64_t qb = 0; qb < n_blocks; ++qb) {
    const int64_t Tq = cuts[qb + 1] - cuts[qb];
    const FVec q_blk = rows(q, H * D, qb);
    const std::vector<int32_t> q_start = rows(bounds.start, 1, qb);
    std::vector<FVec> outs, lses;
    for (int64_t kb = 0; kb < n_blocks; ++kb) {
      const std::vector<int32_t> k_end = rows(bounds.end, 1, kb);
      const cpu::AttentionShape s = shape_of(qb, kb, q_start, k_end);
      FVec out(q_blk.size()), lse(B * H * Tq);
      cpu::attention_forward(out.data(), lse.data(), q_blk.data(), rows(k, G * D, kb).data(),
                             rows(v, G * D, kb).data(), s);
      outs.push_back(out);
      lses.push_back(lse);
    }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          const int64_t at = (b * H + h) * Tq + i, row = b * S + cuts[qb] + i;
          double max = -std::numeric_limits<double>::infinity();
          for (const FVec& lse : lses) max = std::max(max, double(lse[at]));
          double sum = 0;
          for (const FVec& lse : lses) sum += std::isinf(lse[at]) ? 0.0 : std::exp(lse[at] - max);
          const double lse = max + std::log(sum);
          r.lse[(b * H + h) * S + cuts[qb] + i] = lse;
          merged_lse[(b * H + h) * S + cuts[qb] + i] = float(lse);
          for (int64_t e = 0; e < D; ++e) {
            double o = 0;
            for (size_t m = 0; m < outs.size(); ++m)
              if (!std::isinf(lses[m][at]))
                o += std::exp(lses[m][at] - lse) * outs[m][((b * Tq + i) * H + h) * D + e];
            r.out[(row * H + h) * D + e] = o;
            merged_out[(row * H + h) * D + e] = float(o);
          }
        }
  }

  // Backward of each pair with the merged row statistics.
  for (int64_t qb = 0; qb < n_blocks; ++qb) {
    const FVec q_blk = rows(q, H * D, qb), dout_blk = rows(dout, H * D, qb);
    const FVec out_blk = rows(merged_out, H * D, qb);
    const std::vector<int32_t> q_start = rows(bounds.start, 1, qb);
    FVec lse_blk;  // [B, H, Tq] of [B, H, S]
    for (int64_t bh = 0; bh < B * H; ++bh)
      lse_blk.insert(lse_blk.end(), merged_lse.begin() + bh * S + cuts[qb],
                     merged_lse.begin() + bh * S + cuts[qb + 1]);
    for (int64_t kb = 0; kb < n_blocks; ++kb) {
      const std::vector<int32_t> k_end = rows(bounds.end, 1, kb);
      const cpu::AttentionShape s = shape_of(qb, kb, q_start, k_end);
      const FVec k_blk = rows(k, G * D, kb), v_blk = rows(v, G * D, kb);
      FVec dq(q_blk.size()), dk(k_blk.size()), dv(v_blk.size());
      cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout_blk.data(), q_blk.data(),
                              k_blk.data(), v_blk.data(), out_blk.data(), lse_blk.data(), s);
      auto add = [&](Vec& to, const FVec& from, int64_t width, int64_t block) {
        const int64_t T = cuts[block + 1] - cuts[block];
        for (int64_t b = 0; b < B; ++b)
          for (int64_t x = 0; x < T * width; ++x)
            to[(b * S + cuts[block]) * width + x] += from[b * T * width + x];
      };
      add(r.dq, dq, H * D, qb);
      add(r.dk, dk, G * D, kb);
      add(r.dv, dv, G * D, kb);
    }
  }
  return r;
}

constexpr double kKernelTol = 1e-5;  // fp32 kernel against float64, scaled_error

void check_packed_attention(const Dims& d, const DocumentLengths& rows,
                            const std::vector<int64_t>& cuts, uint32_t seed) {
  std::mt19937 rng(seed);
  auto uniform = [&](int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    FVec x(static_cast<size_t>(n));
    for (float& e : x) e = u(rng);
    return x;
  };
  const int64_t nq = d.batch * d.seq * d.heads * d.head_dim;
  const int64_t nkv = d.batch * d.seq * d.kv_heads * d.head_dim;
  const FVec q = uniform(nq, -2, 2), k = uniform(nkv, -2, 2), v = uniform(nkv, -1, 1);
  const FVec dout = uniform(nq, -1, 1);
  auto wide = [](const FVec& x) { return Vec(x.begin(), x.end()); };
  const AttentionResult want =
      documents_alone_reference(d, rows, wide(q), wide(k), wide(v), wide(dout));
  const Bounds bounds = bounds_of(rows, d.seq);
  const AttentionResult got = packed_kernel(d, bounds, cuts, q, k, v, dout);
  const double e_out = scaled_error(got.out, want.out), e_lse = scaled_error(got.lse, want.lse);
  const double e_dq = scaled_error(got.dq, want.dq), e_dk = scaled_error(got.dk, want.dk);
  const double e_dv = scaled_error(got.dv, want.dv);
  std::printf(
      "packed attention, %zu blocks, window %lld: out %.1e lse %.1e dq %.1e dk %.1e "
      "dv %.1e\n",
      cuts.size() - 1, static_cast<long long>(d.window), e_out, e_lse, e_dq, e_dk, e_dv);
  CHECK(e_out < kKernelTol);
  CHECK(e_lse < kKernelTol);
  CHECK(e_dq < kKernelTol);
  CHECK(e_dk < kKernelTol);
  CHECK(e_dv < kKernelTol);

  // Where a sequence holds several documents, the kernel without them attends across them,
  // and the reference tells.
  bool several = false;
  for (const auto& lengths : rows) several = several || lengths.size() > 1;
  if (!several) return;
  const AttentionResult unmasked = packed_kernel(d, bounds, cuts, q, k, v, dout, false);
  CHECK(scaled_error(unmasked.out, want.out) > 1e-2);
  CHECK(scaled_error(unmasked.dk, want.dk) > 1e-2);
}

// ---- model level --------------------------------------------------------------------------

const fs::path kFixture = fs::path(FRUGAL_SOURCE_DIR) / "tests" / "fixtures" / "packing";

// The packed batch of the fixture as transformers ran it (tools/make_packing_fixtures.py).
struct PackedFixture {
  int64_t rows = 0, seq = 0;
  DocumentLengths documents;
  std::vector<std::vector<int64_t>> pad_documents;       // per row, indices into documents
  std::vector<int32_t> input_ids, position_ids, labels;  // [rows * seq], transformers' inputs
  nlohmann::json expected;
};

std::vector<int32_t> flat(const nlohmann::json& rows) {
  std::vector<int32_t> x;
  for (const auto& row : rows)
    for (const auto& e : row) x.push_back(e.get<int32_t>());
  return x;
}

PackedFixture load_fixture() {
  PackedFixture f;
  std::ifstream batch_in(kFixture / "batch.json"), expected_in(kFixture / "expected.json");
  REQUIRE(batch_in);
  REQUIRE(expected_in);
  const nlohmann::json batch = nlohmann::json::parse(batch_in);
  f.expected = nlohmann::json::parse(expected_in);
  f.rows = batch["rows"].get<int64_t>();
  f.seq = batch["seq"].get<int64_t>();
  f.documents = batch["documents"].get<DocumentLengths>();
  f.pad_documents = batch["pad_documents"].get<std::vector<std::vector<int64_t>>>();
  f.input_ids = flat(batch["input_ids"]);
  f.position_ids = flat(batch["position_ids"]);
  f.labels = flat(batch["labels"]);
  REQUIRE(int64_t(f.input_ids.size()) == f.rows * f.seq);
  return f;
}

bool is_pad(const PackedFixture& f, int64_t row, int64_t document) {
  const auto& pads = f.pad_documents[size_t(row)];
  return std::find(pads.begin(), pads.end(), document) != pads.end();
}

Tensor i32_tensor(const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty({int64_t(values.size())}, DType::i32);
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// frugal's Batch of the packed rows, made from the document lengths alone: targets[t] = the
// next token of t's document (-1 at its last token and in a pad document), positions restart
// at each document, and the documents' bounds. Without `documents` the bounds are left
// undefined: the plain causal batch of the same tokens, targets and positions.
Batch packed_batch(const PackedFixture& f, bool documents) {
  std::vector<int32_t> targets, positions;
  for (int64_t r = 0; r < f.rows; ++r) {
    int64_t start = 0;
    for (size_t d = 0; d < f.documents[size_t(r)].size(); ++d) {
      const int64_t n = f.documents[size_t(r)][d];
      for (int64_t t = start; t < start + n; ++t) {
        const bool last = t + 1 == start + n;
        targets.push_back(
            last || is_pad(f, r, int64_t(d)) ? -1 : f.input_ids[size_t(r * f.seq + t + 1)]);
        positions.push_back(int32_t(t - start));
      }
      start += n;
    }
  }
  Batch b;
  b.batch = f.rows;
  b.seq = f.seq;
  b.tokens = i32_tensor(f.input_ids);
  b.targets = i32_tensor(targets);
  b.positions = i32_tensor(positions);
  if (documents) {
    const Bounds bounds = bounds_of(f.documents, f.seq);
    b.documents.start = i32_tensor(bounds.start);
    b.documents.end = i32_tensor(bounds.end);
  }
  return b;
}

std::unique_ptr<LocalParameters> load_with_grads(const HfModelDir& hf) {
  auto params = std::make_unique<LocalParameters>(hf.config(), 0, 0.0f, true);
  hf.load_into(*params);
  params->zero_grads();
  return params;
}

// The largest scaled_error over every parameter's gradient against transformers', and where.
double worst_gradient_error(LocalParameters& params, const SafetensorsFile& want,
                            std::string* where) {
  double worst = 0;
  int64_t compared = 0;
  for (TrainableShard& s : params.trainable()) {
    const Tensor w = want.read(s.name);
    REQUIRE(w.numel() == s.grad.numel());
    const float* g = s.grad.data<float>();
    const double e = scaled_error(std::vector<float>(g, g + s.grad.numel()),
                                  std::vector<float>(w.data<float>(), w.data<float>() + w.numel()));
    if (e > worst || compared == 0) {
      worst = e;
      *where = s.name;
    }
    ++compared;
  }
  CHECK(compared == int64_t(want.tensor_names().size()));  // every gradient compared
  return worst;
}

constexpr double kModelTol = 1e-5;  // fp32 against transformers' fp32, relative / scaled_error

}  // namespace

TEST_CASE("packed attention equals each document alone: float64 reference", "[packing]") {
  SECTION("GQA 4 over 2, batch 2 of different documents, 1- and 2-token documents") {
    check_packed_attention({2, 24, 4, 2, 16, 0}, {{5, 1, 2, 9, 7}, {1, 13, 2, 8}}, {0, 24}, 1);
  }
  SECTION("one document per sequence is plain causal attention") {
    check_packed_attention({2, 11, 3, 1, 8, 0}, {{11}, {11}}, {0, 11}, 2);
  }
  SECTION("sliding window 4 with documents longer and shorter than it") {
    check_packed_attention({2, 24, 4, 2, 16, 4}, {{7, 3, 1, 13}, {2, 10, 12}}, {0, 24}, 3);
  }
  SECTION("ring-like block pairs: causal_offset > 0, key_position0 > 0, documents across cuts") {
    // Blocks [0, 8), [8, 16), [16, 24): row 0's document [8, 17) and row 1's [1, 14) cross a
    // cut, so a query block sees its document's keys in an earlier block.
    const DocumentLengths rows = {{5, 1, 2, 9, 7}, {1, 13, 2, 8}};
    check_packed_attention({2, 24, 4, 2, 16, 0}, rows, {0, 8, 16, 24}, 4);
    check_packed_attention({2, 24, 4, 2, 16, 5}, rows, {0, 8, 16, 24}, 5);
    check_packed_attention({2, 24, 4, 1, 8, 0}, rows, {0, 5, 17, 24}, 6);  // uneven blocks
  }
}

TEST_CASE("packed batch against transformers: loss and every gradient", "[packing]") {
  const PackedFixture f = load_fixture();
  const HfModelDir hf(kFixture.string());
  LlamaModel model(hf.config());
  const SafetensorsFile want_grads(
      (kFixture / f.expected["grads_file"].get<std::string>()).string());
  const double want_sum = f.expected["loss_sum"].get<double>();
  const Batch packed = packed_batch(f, true);

  // The batch as frugal reads it is the batch transformers ran: transformers scores the logits
  // of token t against labels[t + 1] (-100: ignored), with position_ids restarting per document.
  for (int64_t r = 0; r < f.rows; ++r)
    for (int64_t t = 0; t < f.seq; ++t) {
      const size_t i = size_t(r * f.seq + t);
      const int32_t label = t + 1 < f.seq ? f.labels[i + 1] : -100;
      CHECK(packed.targets.data<int32_t>()[i] == (label == -100 ? -1 : label));
      CHECK(packed.positions.data<int32_t>()[i] == f.position_ids[i]);
    }
  REQUIRE(counted_targets(packed.targets) == f.expected["count"].get<int64_t>());

  SECTION("packed with documents: transformers' loss and gradients") {
    auto params = load_with_grads(hf);
    const double loss = model.forward_backward(packed, *params, 1.0f, CheckpointPolicy::none);
    const double mean = loss / double(counted_targets(packed.targets));
    std::string where;
    const double grad_err = worst_gradient_error(*params, want_grads, &where);
    const double loss_err = std::abs(loss - want_sum) / want_sum;
    const double mean_err = std::abs(mean - f.expected["loss_mean"].get<double>()) /
                            f.expected["loss_mean"].get<double>();
    std::printf(
        "packed vs transformers: loss sum %.7f, transformers %.7f, rel %.1e (mean rel "
        "%.1e); gradients max scaled error %.1e (%s)\n",
        loss, want_sum, loss_err, mean_err, grad_err, where.c_str());
    CHECK(loss_err < kModelTol);
    CHECK(mean_err < kModelTol);
    CHECK(grad_err < kModelTol);

    // The documents recomputed under activation checkpointing keep their mask: same bits.
    for (CheckpointPolicy policy : {CheckpointPolicy::selective, CheckpointPolicy::full}) {
      INFO(checkpoint_policy_name(policy));
      auto again = load_with_grads(hf);
      CHECK(model.forward_backward(packed, *again, 1.0f, policy) == loss);
      std::vector<TrainableShard> a = params->trainable(), b = again->trainable();
      bool equal = true;
      for (size_t i = 0; i < a.size(); ++i)
        for (int64_t j = 0; j < a[i].grad.numel(); ++j)
          equal = equal && a[i].grad.data<float>()[j] == b[i].grad.data<float>()[j];
      CHECK(equal);
    }
  }

  SECTION("the documents run alone in frugal sum to the packed batch") {
    auto packed_params = load_with_grads(hf);
    const double packed_loss =
        model.forward_backward(packed, *packed_params, 1.0f, CheckpointPolicy::none);
    auto params = load_with_grads(hf);
    const auto want_docs = f.expected["document_loss_sums"].get<std::vector<std::vector<double>>>();
    double total = 0, worst_doc = 0;
    for (int64_t r = 0; r < f.rows; ++r) {
      int64_t start = 0;
      for (size_t d = 0; d < f.documents[size_t(r)].size(); ++d) {
        const int64_t n = f.documents[size_t(r)][d];
        if (!is_pad(f, r, int64_t(d))) {
          // A batch of one sequence: positions 0..n-1, the last target masked.
          const Batch alone = next_token_batch(f.input_ids.data() + r * f.seq + start, n);
          const double loss = model.forward_backward(alone, *params, 1.0f, CheckpointPolicy::none);
          const double want = want_docs[size_t(r)][d];
          INFO("row " << r << " document " << d << ": " << loss << " vs " << want);
          if (n == 1) {
            CHECK(loss == 0.0);  // no target
            CHECK(want == 0.0);
          } else {
            worst_doc = std::max(worst_doc, std::abs(loss - want) / want);
          }
          total += loss;
        }
        start += n;
      }
    }
    std::string where;
    // Gradients of the documents alone against the packed batch's, both frugal's.
    double grad_err = 0;
    std::vector<TrainableShard> a = params->trainable(), b = packed_params->trainable();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const float* ga = a[i].grad.data<float>();
      const float* gb = b[i].grad.data<float>();
      const double e = scaled_error(std::vector<float>(ga, ga + a[i].grad.numel()),
                                    std::vector<float>(gb, gb + b[i].grad.numel()));
      if (e > grad_err) {
        grad_err = e;
        where = a[i].name;
      }
    }
    const double loss_err = std::abs(total - packed_loss) / packed_loss;
    std::printf(
        "documents alone vs packed (frugal): loss rel %.1e, gradients max scaled error "
        "%.1e (%s); each document vs transformers alone: max rel %.1e\n",
        loss_err, grad_err, where.c_str(), worst_doc);
    CHECK(loss_err < kModelTol);
    CHECK(grad_err < kModelTol);
    CHECK(worst_doc < kModelTol);
  }

  SECTION("without the documents the batch is clearly not transformers' packed batch") {
    // Plain causal attention over the same tokens, targets and restarting positions: the
    // documents see each other, and the loss and gradients leave the tolerance by far.
    auto params = load_with_grads(hf);
    const double loss =
        model.forward_backward(packed_batch(f, false), *params, 1.0f, CheckpointPolicy::none);
    std::string where;
    const double grad_err = worst_gradient_error(*params, want_grads, &where);
    const double loss_err = std::abs(loss - want_sum) / want_sum;
    std::printf("unpacked vs transformers' packed: loss rel %.1e, gradients %.1e (%s)\n", loss_err,
                grad_err, where.c_str());
    CHECK(loss_err > 100 * kModelTol);
    CHECK(grad_err > 100 * kModelTol);
  }
}
