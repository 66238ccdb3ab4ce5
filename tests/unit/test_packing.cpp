// data.packing: documents packed into windows (data/packing.h) and the sampler's rows of them:
// every token of every document placed once, targets never crossing a document's end, bounds
// and roles as the stream says, long documents split or truncated and counted, pad one per
// window, deterministic resume; and the share of attention tiles skipped against brute force.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/error.h"
#include "data/packing.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "test_support.h"

using namespace frugal;

namespace {

// Document starts for these lengths, then the number of tokens.
std::vector<uint64_t> starts_of(const std::vector<uint64_t>& lengths) {
  std::vector<uint64_t> starts{0};
  for (const uint64_t n : lengths) starts.push_back(starts.back() + n);
  return starts;
}

// Lengths drawn from a seeded mix: many short documents, a few longer than `seq`.
std::vector<uint64_t> mixed_lengths(int count, uint64_t seq, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint64_t> lengths;
  for (int i = 0; i < count; ++i) {
    const uint32_t r = rng() % 100;
    lengths.push_back(r < 5 ? seq + 1 + rng() % (3 * seq) : 1 + rng() % seq);
  }
  return lengths;
}

// Which document each token of the stream belongs to.
std::vector<uint64_t> document_of_token(const std::vector<uint64_t>& starts) {
  std::vector<uint64_t> doc(starts.back());
  for (size_t d = 0; d + 1 < starts.size(); ++d)
    for (uint64_t t = starts[d]; t < starts[d + 1]; ++t) doc[t] = d;
  return doc;
}

}  // namespace

TEST_CASE("packing: documents place every token once, within windows, split pieces in order",
          "[packing]") {
  const uint64_t seq = 32;
  const std::vector<uint64_t> lengths = mixed_lengths(300, seq, 7);
  const std::vector<uint64_t> starts = starts_of(lengths);
  const PackedWindows packed(starts, int64_t(seq), Packing::documents, LongDocuments::split, "t");
  const std::vector<uint64_t> doc = document_of_token(starts);
  std::vector<int> placed(starts.back(), 0);
  uint64_t rows_used = 0;
  // The last row of a piece predicts the next token only when it is not its document's end.
  for (int64_t w = 0; w < packed.size(); ++w) {
    uint64_t rows = 0;
    for (const PackedPiece& p : packed.window(w)) {
      REQUIRE(p.rows > 0);
      rows += p.rows;
      for (uint64_t t = p.first; t < p.first + p.rows; ++t) {
        REQUIRE(doc[t] == doc[p.first]);  // a piece never crosses a document
        ++placed[t];
      }
      const uint64_t end = starts[doc[p.first] + 1];
      REQUIRE(p.last_predicts == (p.first + p.rows < end));
    }
    REQUIRE(rows <= seq);
    rows_used += rows;
  }
  REQUIRE(std::all_of(placed.begin(), placed.end(), [](int n) { return n == 1; }));
  const PackingCounts& n = packed.counts();
  REQUIRE(n.documents == lengths.size());
  REQUIRE(n.windows == uint64_t(packed.size()));
  REQUIRE(n.rows_used == rows_used);
  REQUIRE(n.split == uint64_t(std::count_if(lengths.begin(), lengths.end(),
                                            [&](uint64_t l) { return l > seq; })));
  // Best-fit decreasing is within 11/9 of the fewest windows (+ 1); the fewest is at least
  // the rows over the window.
  const uint64_t fewest = (rows_used + seq - 1) / seq;
  REQUIRE(n.windows * 9 <= fewest * 11 + 9);
  // The same input packs the same way.
  const PackedWindows again(starts, int64_t(seq), Packing::documents, LongDocuments::split, "t");
  REQUIRE(again.size() == packed.size());
  for (int64_t w = 0; w < packed.size(); ++w) {
    const auto a = packed.window(w), b = again.window(w);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i)
      REQUIRE((a[i].first == b[i].first && a[i].rows == b[i].rows));
  }
}

TEST_CASE("packing: truncate keeps seq rows of a long document and counts what it drops",
          "[packing]") {
  const std::vector<uint64_t> lengths{5, 40, 9, 17};  // seq 16: 40 and 17 are long
  const PackedWindows packed(starts_of(lengths), 16, Packing::documents, LongDocuments::truncate,
                             "t");
  const PackingCounts& n = packed.counts();
  REQUIRE(n.truncated == 2);
  REQUIRE(n.split == 0);
  REQUIRE(n.dropped_tokens == (40 - 17) + (17 - 17));  // seq rows + the last row's target
  REQUIRE(n.pieces == 4);
  int long_pieces = 0;
  for (int64_t w = 0; w < packed.size(); ++w)
    for (const PackedPiece& p : packed.window(w))
      if (p.rows == 16) {
        ++long_pieces;
        REQUIRE(p.last_predicts);
      }
  REQUIRE(long_pieces == 2);
}

TEST_CASE("packing: pad puts one document or piece per window", "[packing]") {
  const std::vector<uint64_t> lengths{3, 20, 8};
  const PackedWindows packed(starts_of(lengths), 8, Packing::pad, LongDocuments::split, "t");
  REQUIRE(packed.size() == 1 + 3 + 1);  // 20 = 8 + 8 + 4
  for (int64_t w = 0; w < packed.size(); ++w) REQUIRE(packed.window(w).size() == 1);
}

TEST_CASE("packing: bad settings are named", "[packing]") {
  const std::vector<uint64_t> none;  // a version 1 file records no starts
  REQUIRE(test::error_of([&] {
            PackedWindows(none, 8, Packing::documents, LongDocuments::split, "v1.tok");
          }).find("'v1.tok' records no document boundaries") != std::string::npos);
  REQUIRE_THROWS_AS(PackedWindows(starts_of({3}), 0, Packing::documents, LongDocuments::split, "t"),
                    Error);
  REQUIRE(resolved_packing(Packing::automatic, content_bit(DocumentContent::chat)) ==
          Packing::documents);
  REQUIRE(resolved_packing(Packing::automatic, content_bit(DocumentContent::instruction)) ==
          Packing::documents);
  REQUIRE(resolved_packing(Packing::automatic, content_bit(DocumentContent::text)) ==
          Packing::windows);
  REQUIRE(resolved_packing(Packing::pad, content_bit(DocumentContent::text)) == Packing::pad);
}

TEST_CASE("packing: the sampler's rows keep targets and attention inside documents", "[packing]") {
  const int64_t seq = 24;
  const std::vector<uint64_t> lengths = mixed_lengths(80, uint64_t(seq), 3);
  const std::vector<uint64_t> starts = starts_of(lengths);
  const std::vector<uint64_t> doc = document_of_token(starts);
  // Token t of the stream has id t, so a row's input names its place in the stream; odd tokens
  // are replies, even ones prompts (a selection of replies counts exactly the odd targets).
  std::vector<int32_t> ids(starts.back());
  std::vector<TokenRole> roles(starts.back());
  for (size_t t = 0; t < ids.size(); ++t) {
    ids[t] = int32_t(t);
    roles[t] = t % 2 ? TokenRole::reply : TokenRole::prompt;
  }
  const PackedWindows packed(starts, seq, Packing::documents, LongDocuments::split, "t");
  const TargetSelection replies{roles.data(), role_bit(TokenRole::reply)};
  const int64_t rows = 3;
  SamplerConfig config{.seq_len = seq, .micro_batch_size = rows, .seed = 5};
  BatchSampler sampler(view_of(ids), config, replies, &packed);
  REQUIRE(sampler.windows_per_epoch() == packed.size());
  // One epoch's windows, each once (the last batch may run into the next epoch: its rows past
  // the epoch are left out).
  std::vector<int> predicted(starts.back(), 0);
  int64_t window = 0;
  while (window < packed.size()) {
    const TokenBatch batch = sampler.next();
    const int32_t* in = batch.inputs.data<int32_t>();
    const int32_t* tg = batch.targets.data<int32_t>();
    const int32_t* st = batch.document_start.data<int32_t>();
    const int32_t* en = batch.document_end.data<int32_t>();
    int64_t batch_counted = 0;
    for (int64_t r = 0; r < rows; ++r, ++window) {
      for (int64_t t = 0; t < seq; ++t) {
        const int64_t i = r * seq + t;
        REQUIRE((st[i] <= t && t < en[i]));
        const bool padding = en[i] - st[i] == 1 && in[i] == 0 && tg[i] == kIgnoreTarget;
        // Rows of one document: the same bounds, consecutive tokens of one document.
        if (t > st[i]) {
          REQUIRE((st[i - 1] == st[i] && en[i - 1] == en[i]));
          REQUIRE(in[i] == in[i - 1] + 1);
          REQUIRE(doc[size_t(in[i])] == doc[size_t(in[i - 1])]);
        }
        if (tg[i] == kIgnoreTarget) {
          // Not trained: a prompt target, a document's last token, or padding.
          const auto next = uint64_t(in[i]) + 1;
          REQUIRE((padding || next >= starts.back() || next % 2 == 0 ||
                   doc[next] != doc[size_t(in[i])]));
          continue;
        }
        ++batch_counted;
        REQUIRE(tg[i] == in[i] + 1);
        REQUIRE(doc[size_t(tg[i])] == doc[size_t(in[i])]);
        REQUIRE(tg[i] % 2 == 1);
        if (window < packed.size()) ++predicted[size_t(tg[i])];
      }
    }
    REQUIRE(batch_counted == batch.target_tokens);
  }
  // Every reply token that is not its document's first is predicted exactly once an epoch.
  for (uint64_t t = 0; t < starts.back(); ++t) {
    const bool trained = t % 2 == 1 && t > 0 && doc[t] == doc[t - 1];
    REQUIRE(predicted[t] == (trained ? 1 : 0));
  }
}

TEST_CASE("packing: a resumed sampler hands out the same packed windows", "[packing]") {
  const std::vector<uint64_t> starts = starts_of(mixed_lengths(50, 16, 11));
  std::vector<int32_t> ids(starts.back());
  for (size_t t = 0; t < ids.size(); ++t) ids[t] = int32_t(t % 97);
  const PackedWindows packed(starts, 16, Packing::documents, LongDocuments::split, "t");
  SamplerConfig config{.seq_len = 16, .micro_batch_size = 2, .seed = 3};
  BatchSampler a(view_of(ids), config, {}, &packed);
  for (int i = 0; i < 5; ++i) a.next();
  BatchSampler b(view_of(ids), config, {}, &packed);
  b.restore(a.state());
  for (int i = 0; i < 7; ++i) {
    const TokenBatch x = a.next(), y = b.next();
    REQUIRE(std::equal(x.inputs.data<int32_t>(), x.inputs.data<int32_t>() + 32,
                       y.inputs.data<int32_t>()));
    REQUIRE(std::equal(x.document_start.data<int32_t>(), x.document_start.data<int32_t>() + 32,
                       y.document_start.data<int32_t>()));
  }
}

TEST_CASE("packing: skipped attention tiles equal a brute force over the mask", "[packing]") {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t seq = 128 * (1 + trial % 5) + (trial % 3) * 17;
    std::vector<int32_t> start(static_cast<size_t>(seq));
    int64_t at = 0;
    while (at < seq) {
      const int64_t len = std::min<int64_t>(seq - at, 1 + rng() % (trial % 2 ? 64 : 300));
      for (int64_t t = at; t < at + len; ++t) start[size_t(t)] = int32_t(at);
      at += len;
    }
    // Brute force: tile (m, n) is visible when some row i of m sees some key j of n.
    const int64_t tiles = (seq + 127) / 128;
    std::vector<char> seen(size_t(tiles * tiles), 0);
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = start[size_t(i)]; j <= i; ++j) seen[size_t(i / 128 * tiles + j / 128)] = 1;
    int64_t causal = 0, visible = 0;
    for (int64_t m = 0; m < tiles; ++m)
      for (int64_t n = 0; n <= m; ++n) {
        ++causal;
        visible += seen[size_t(m * tiles + n)];
      }
    REQUIRE(std::abs(skipped_attention_tiles(start) - double(causal - visible) / double(causal)) <
            1e-12);
  }
  // One document over the whole window skips nothing.
  std::vector<int32_t> whole(512, 0);
  REQUIRE(skipped_attention_tiles(whole) == 0.0);
}

TEST_CASE("packing: a checkpoint's sampler state is refused by a run with other windows",
          "[packing]") {
  const std::vector<uint64_t> starts = starts_of(mixed_lengths(50, 16, 11));
  std::vector<int32_t> ids(starts.back());
  for (size_t t = 0; t < ids.size(); ++t) ids[t] = int32_t(t % 97);
  const PackedWindows packed(starts, 16, Packing::documents, LongDocuments::split, "t");
  const PackedWindows pad(starts, 16, Packing::pad, LongDocuments::split, "t");
  SamplerConfig config{.seq_len = 16, .micro_batch_size = 2, .seed = 3};
  BatchSampler a(view_of(ids), config, {}, &packed);
  a.next();
  const nlohmann::json saved = a.state_values();
  // The same windows resume; a stride sampler, another packing or another count of windows not.
  BatchSampler same(view_of(ids), config, {}, &packed);
  same.load_state_values(saved);
  REQUIRE(same.state() == a.state());
  BatchSampler windows(view_of(ids), config);
  REQUIRE(test::error_of([&] {
            windows.load_state_values(saved);
          }).find("data.packing = documents, this run's are windows") != std::string::npos);
  BatchSampler padded(view_of(ids), config, {}, &pad);
  REQUIRE(test::error_of([&] {
            padded.load_state_values(saved);
          }).find("resume with --data.packing=documents") != std::string::npos);
  const PackedWindows longer(starts, 32, Packing::documents, LongDocuments::split, "t");
  SamplerConfig config32 = config;
  config32.seq_len = 32;
  BatchSampler other(view_of(ids), config32, {}, &longer);
  REQUIRE(test::error_of([&] { other.load_state_values(saved); }).find("windows an epoch") !=
          std::string::npos);
  // A checkpoint from before packing (no "packing", no "windows") resumes a stride sampler.
  BatchSampler old(view_of(ids), config);
  old.load_state_values({{"epoch", 0}, {"position", 2}});
  REQUIRE(old.state().position == 2);
}
