// frugal against transformers on the fixtures of tools/make_hf_fixtures.py: the mean loss
// (relative error < 1e-5 in fp32), every logit, and the greedy continuation; the KV-cache
// forward against the full forward; and import -> export -> import giving identical tensors.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "catch_compat.h"
#include "ckpt/safetensors.h"
#include "model/hf_model.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"
#include "model/sampling.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(FRUGAL_SOURCE_DIR) / "tests" / "fixtures" / "hf";

struct Fixture {
  fs::path dir;
  nlohmann::json expected;
  std::vector<std::vector<int32_t>> lines;
  std::vector<float> logits;  // [rows, vocab], lines concatenated
};

Fixture load_fixture(const std::string& name) {
  Fixture f;
  f.dir = kFixtures / name;
  std::ifstream json_in(f.dir / "expected.json");
  f.expected = nlohmann::json::parse(json_in);
  std::ifstream tokens_in(f.dir / "tokens.txt");
  for (std::string line; std::getline(tokens_in, line);) {
    std::istringstream words(line);
    std::vector<int32_t> ids;
    for (int32_t id; words >> id;) ids.push_back(id);
    f.lines.push_back(ids);
  }
  const auto shape = f.expected["logits_shape"].get<std::vector<int64_t>>();
  f.logits.resize(static_cast<size_t>(shape[0] * shape[1]));
  std::ifstream logits_in(f.dir / f.expected["logits_file"].get<std::string>(), std::ios::binary);
  logits_in.read(reinterpret_cast<char*>(f.logits.data()),
                 static_cast<std::streamsize>(f.logits.size() * sizeof(float)));
  REQUIRE(logits_in.gcount() == static_cast<std::streamsize>(f.logits.size() * sizeof(float)));
  return f;
}

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// no_cache_equal: the greedy output of generate() without a cache equals transformers' too.
// Not with dynamic scaling past the context: transformers' cached keys keep the frequencies
// of the length they were made at, which the cached generation reproduces and a re-run of the
// whole prefix does not.
void check_against_transformers(const std::string& name, bool no_cache_equal = true) {
  INFO(name);
  Fixture f = load_fixture(name);
  HfModelDir hf(f.dir.string());
  std::unique_ptr<LocalParameters> params = hf.load();
  LlamaModel model(hf.config());
  const int64_t vocab = hf.config().vocab_size;

  // Loss: the sum over all predicted positions of all lines, divided by their count.
  double loss_sum = 0;
  int64_t count = 0, row = 0;
  float logits_err = 0;
  for (const auto& ids : f.lines) {
    Batch b = next_token_batch(ids);
    loss_sum += model.forward_loss(b, *params);
    count += counted_targets(b.targets);
    Tensor logits = model.forward_logits(b, *params);
    REQUIRE(logits.shape() == Shape{b.seq, vocab});
    logits_err = std::max(logits_err, max_abs_diff(logits.data<float>(),
                                                   f.logits.data() + row * vocab, logits.numel()));
    row += b.seq;
  }
  const double loss = loss_sum / static_cast<double>(count);
  const double expected = f.expected["loss"].get<double>();
  const double rel_err = std::fabs(loss - expected) / expected;
  std::printf("%s: loss %.9f, transformers %.9f, rel err %.2e; logits max abs err %.2e\n",
              name.c_str(), loss, expected, rel_err, static_cast<double>(logits_err));
  CHECK(count == f.expected["tokens"].get<int64_t>());
  CHECK(rel_err < 1e-5);
  CHECK(logits_err < 1e-4f);

  // Greedy continuation, stopping at eos like transformers' generate.
  const auto prompt = f.expected["prompt"].get<std::vector<int32_t>>();
  const auto greedy = f.expected["greedy"].get<std::vector<int32_t>>();
  SamplingOptions options;
  options.max_new_tokens = static_cast<int64_t>(greedy.size() - prompt.size());
  options.stop_tokens = {hf.eos_token_id()};
  if (no_cache_equal) CHECK(generate(model, *params, prompt, options) == greedy);
  CHECK(generate_cached(hf.config(), *params, prompt, options) == greedy);
}

}  // namespace

TEST_CASE("transformers parity: GQA, untied, rope_theta 50000, one file") {
  check_against_transformers("gqa_untied");
}

TEST_CASE("transformers parity: MHA, tied embeddings, sharded") {
  check_against_transformers("mha_tied_sharded");
}

TEST_CASE("transformers parity: rotary scaling linear, dynamic, yarn, llama3") {
  // Sequences longer than the context each type scales from (tools/make_hf_fixtures.py).
  check_against_transformers("rope_linear");
  check_against_transformers("rope_dynamic", /*no_cache_equal=*/false);
  check_against_transformers("rope_yarn");
  check_against_transformers("rope_llama3");
  CHECK(HfModelDir((kFixtures / "rope_yarn").string()).config().rope_scaling.type ==
        RopeScalingType::yarn);
}

TEST_CASE("transformers parity: Qwen2, q/k/v biases") {
  check_against_transformers("qwen2_gqa");
  const HfModelDir hf((kFixtures / "qwen2_gqa").string());
  CHECK(hf.config().architecture == Architecture::qwen2);
  CHECK(hf.specs()[block_unit(0)].params.size() == kBlockParamCount + kQkvBiasCount);
}

TEST_CASE("transformers parity: Mistral, sliding window 5 over sequences of 16") {
  // Loss, logits and a greedy continuation 12 tokens past the window, with and without the
  // KV cache; the window changes transformers' own loss and greedy output (checked when the
  // fixture was made), so full attention would fail here.
  check_against_transformers("mistral_window");
  const HfModelDir hf((kFixtures / "mistral_window").string());
  CHECK(hf.config().sliding_window == 5);
  CHECK(hf.config().max_position_embeddings == 64);
}

TEST_CASE("export writes the rotary scaling and the architecture back, they read back the same") {
  for (const char* name :
       {"rope_linear", "rope_dynamic", "rope_yarn", "rope_llama3", "qwen2_gqa", "mistral_window"}) {
    INFO(name);
    HfModelDir original((kFixtures / name).string());
    auto params = original.load();
    TempDir tmp;
    export_hf(tmp.path.string(), original.config(), *params, HfExportOptions{});
    HfModelDir back(tmp.path.string());
    CHECK(back.config().rope_scaling == original.config().rope_scaling);
    CHECK(back.config().architecture == original.config().architecture);
    CHECK(back.config().max_position_embeddings == original.config().max_position_embeddings);
    CHECK(back.config().sliding_window == original.config().sliding_window);
    for (const UnitSpec& unit : original.specs())
      for (const ParamSpec& p : unit.params)
        CHECK(same_bytes(back.read(p.name), original.read(p.name)));
    // frugal's own manifests keep it too.
    const LlamaConfig again =
        llama_config_from_json(llama_config_to_json(original.config()), "manifest");
    CHECK(again.rope_scaling == original.config().rope_scaling);
    CHECK(again.architecture == original.config().architecture);
    CHECK(again.sliding_window == original.config().sliding_window);
  }
}

TEST_CASE("read_rows streams any row range, shards of ranks put together make the tensor") {
  HfModelDir hf((kFixtures / "gqa_untied").string());
  for (const UnitSpec& unit : hf.specs())
    for (const ParamSpec& p : unit.params) {
      INFO(p.name);
      Tensor whole = hf.read(p.name);
      REQUIRE(whole.shape() == p.shape);
      // Three "ranks", rows padded to a multiple of 3 as ZeRO-3 pads them.
      const int64_t rows = p.shape[0], per_rank = (rows + 2) / 3;
      for (int64_t r = 0; r < 3; ++r) {
        const int64_t begin = std::min(rows, r * per_rank), end = std::min(rows, begin + per_rank);
        Tensor part = hf.read_rows(p.name, begin, end);
        CHECK(same_bytes(part, whole.rows(begin, end).clone()));
      }
    }
  CHECK_THROWS_AS(hf.read_rows("model.norm.weight", 10, 100), Error);
  CHECK_THROWS_AS(hf.read("model.layers.7.mlp.up_proj.weight"), Error);
}

TEST_CASE("KV-cache forward equals the full forward, row for row") {
  for (const char* name : {"gqa_untied", "mha_tied_sharded", "mistral_window"}) {
    INFO(name);
    Fixture f = load_fixture(name);
    HfModelDir hf(f.dir.string());
    auto params = hf.load();
    LlamaModel model(hf.config());
    const std::vector<int32_t>& ids = f.lines[0];
    const auto n = static_cast<int64_t>(ids.size());
    Tensor full = model.forward_logits(next_token_batch(ids), *params);

    // A prefill of 5, then chunks of 1 and 3 tokens.
    KvCache cache(hf.config(), n);
    std::vector<Tensor> parts;
    int64_t at = 0;
    for (int64_t chunk : {5, 1, 1, 3, 1}) {
      std::vector<int32_t> next(ids.begin() + at, ids.begin() + at + chunk);
      parts.push_back(forward_cached(hf.config(), *params, cache, next, 0));
      at += chunk;
    }
    while (at < n) parts.push_back(forward_cached(hf.config(), *params, cache, {ids[at++]}, 0));
    CHECK(cache.length() == n);
    int64_t row = 0;
    float worst = 0;
    for (const Tensor& p : parts) {
      worst = std::max(
          worst,
          max_abs_diff(p.data<float>(), full.rows(row, row + p.size(0)).data<float>(), p.numel()));
      row += p.size(0);
    }
    std::printf("%s: KV-cache logits vs full forward, max abs err %.2e\n", name,
                static_cast<double>(worst));
    CHECK(worst < 1e-5f);
    CHECK_THROWS_AS(forward_cached(hf.config(), *params, cache, {1}, 1), Error);  // full
  }
}

TEST_CASE("cached generation equals generate(): sampling, and past the context window") {
  HfModelDir hf((kFixtures / "mha_tied_sharded").string());
  auto params = hf.load();
  LlamaModel model(hf.config());
  REQUIRE(hf.config().max_position_embeddings == 48);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 40; ++i) prompt.push_back((i * 37 + 5) % 100);

  SamplingOptions sampled;
  sampled.max_new_tokens = 16;  // crosses the 48-token window
  sampled.temperature = 0.8f;
  sampled.top_p = 0.9f;
  sampled.seed = 42;
  CHECK(generate_cached(hf.config(), *params, prompt, sampled) ==
        generate(model, *params, prompt, sampled));

  SamplingOptions greedy;
  greedy.max_new_tokens = 20;
  const std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + 3);
  CHECK(generate_cached(hf.config(), *params, short_prompt, greedy) ==
        generate(model, *params, short_prompt, greedy));
  // A prompt longer than the window: both keep its last 48 tokens.
  std::vector<int32_t> long_prompt = prompt;
  long_prompt.insert(long_prompt.end(), prompt.begin(), prompt.end());
  greedy.max_new_tokens = 3;
  CHECK(generate_cached(hf.config(), *params, long_prompt, greedy) ==
        generate(model, *params, long_prompt, greedy));
  CHECK_THROWS_AS(generate_cached(hf.config(), *params, {}, greedy), Error);
}

TEST_CASE("import -> export -> import gives bit-identical tensors, bf16 export is stable") {
  for (const char* name : {"gqa_untied", "mha_tied_sharded"}) {
    INFO(name);
    HfModelDir original((kFixtures / name).string());
    auto params = original.load();
    TempDir tmp;
    const fs::path out = tmp.path / "f32";
    HfExportOptions options;
    export_hf(out.string(), original.config(), *params, options);
    CHECK(fs::exists(out / "config.json"));
    CHECK(fs::exists(out / "generation_config.json"));
    CHECK_FALSE(fs::exists(out / "tokenizer.model"));

    HfModelDir back(out.string());
    CHECK(back.config().hidden_size == original.config().hidden_size);
    CHECK(back.config().num_key_value_heads == original.config().num_key_value_heads);
    CHECK(back.config().rope_theta == original.config().rope_theta);
    CHECK(back.config().rms_norm_eps == original.config().rms_norm_eps);
    CHECK(back.config().tie_word_embeddings == original.config().tie_word_embeddings);
    CHECK(back.config().max_position_embeddings == original.config().max_position_embeddings);
    CHECK(back.bos_token_id() == 1);
    CHECK(back.eos_token_id() == 2);
    for (const UnitSpec& unit : original.specs())
      for (const ParamSpec& p : unit.params) {
        INFO(p.name);
        CHECK(same_bytes(back.read(p.name), original.read(p.name)));
      }
    // A tied model exports no lm_head, as transformers saves it.
    SafetensorsSet written(out.string());
    CHECK(written.has("lm_head.weight") == !original.config().tie_word_embeddings);

    // bf16: the values are the bf16 roundings, and exporting them again changes no byte.
    options.dtype = DType::bf16;
    export_hf((tmp.path / "bf16").string(), original.config(), *params, options);
    HfModelDir bf16((tmp.path / "bf16").string());
    Tensor w = bf16.read("model.embed_tokens.weight");
    Tensor w0 = original.read("model.embed_tokens.weight");
    for (int64_t i = 0; i < w.numel(); ++i)
      REQUIRE(w.data<float>()[i] == bf16_to_float(float_to_bf16(w0.data<float>()[i])));
    auto bf16_params = bf16.load();
    export_hf((tmp.path / "bf16_again").string(), bf16.config(), *bf16_params, options);
    CHECK(read_bytes(tmp.path / "bf16" / "model.safetensors") ==
          read_bytes(tmp.path / "bf16_again" / "model.safetensors"));
  }
}
