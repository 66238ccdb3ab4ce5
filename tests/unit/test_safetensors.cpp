// safetensors: write -> read round trips (f32 bit-exact, bf16/f16 rounded as core/dtype.h
// rounds), row-range reads, conversions against files the safetensors library wrote, and the
// errors for truncated files, bad headers, missing shards, wrong shapes, and config.json
// files frugal must refuse.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "catch_compat.h"
#include "ckpt/safetensors.h"
#include "model/hf_model.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(FRUGAL_SOURCE_DIR) / "tests" / "fixtures" / "hf";

Tensor random_f32(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file made of a raw header string and `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               uint64_t header_len_override = 0) {
  std::string bytes(8, '\0');
  const uint64_t n = header_len_override ? header_len_override : header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  bytes += header;
  bytes.append(data_bytes, '\0');
  write_bytes(path, bytes);
}

void copy_dir(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from))
    fs::copy_file(e.path(), to / e.path().filename(), fs::copy_options::overwrite_existing);
  for (const auto& e : fs::directory_iterator(to))
    fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write);
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2);
}

}  // namespace

TEST_CASE("safetensors f32 round trip is bit-exact, header sorted and aligned") {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"zeta.weight", random_f32({7, 13}, 1)}, {"alpha", random_f32({5}, 2)},
      {"mid.3d", random_f32({3, 1, 11}, 3)},   {"scalar", random_f32({}, 4)},
      {"empty", Tensor::empty({0, 9})},
  };
  const std::string path = dir.file("a.safetensors");
  write_safetensors(path, tensors, DType::f32, {{"format", "pt"}});
  REQUIRE_FALSE(fs::exists(path + ".tmp"));

  // The layout: header length, JSON with names in order, data 8-byte aligned.
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  CHECK((8 + n) % 8 == 0);
  const std::string header = bytes.substr(8, n);
  CHECK(header.find("\"alpha\"") < header.find("\"empty\""));
  CHECK(header.find("\"mid.3d\"") < header.find("\"zeta.weight\""));
  CHECK(contains(header, "\"__metadata__\":{\"format\":\"pt\"}"));
  size_t data = 0;
  for (const auto& [name, t] : tensors) data += t.bytes();
  CHECK(bytes.size() == 8 + n + data);

  SafetensorsFile file(path);
  CHECK(file.tensor_names() ==
        std::vector<std::string>{"alpha", "empty", "mid.3d", "scalar", "zeta.weight"});
  CHECK(file.metadata().at("format") == "pt");
  for (const auto& [name, t] : tensors) {
    INFO(name);
    CHECK(file.entry(name).dtype == "F32");
    CHECK(same_bytes(file.read(name), t));
  }
  // Row ranges read only those rows.
  Tensor rows = file.read_rows("zeta.weight", 2, 5);
  CHECK(rows.shape() == Shape{3, 13});
  CHECK(same_bytes(rows, tensors[0].second.rows(2, 5).clone()));
  CHECK(file.read_rows("zeta.weight", 4, 4).numel() == 0);
  CHECK(contains(error_of([&] { file.read_rows("zeta.weight", 5, 8); }), "out of range"));
  CHECK(contains(error_of([&] { file.read("nope"); }), "has no tensor 'nope'"));
}

TEST_CASE("safetensors bf16 and f16 writes round to nearest even, reads widen exactly") {
  TempDir dir;
  Tensor t = random_f32({6, 5}, 9);
  t.data<float>()[0] = 1.0f + 0x1p-8f;  // a bf16 tie: rounds to even (1.0)
  t.data<float>()[1] = 70000.0f;        // past f16's range: inf
  for (DType type : {DType::bf16, DType::f16}) {
    INFO(dtype_name(type));
    const std::string path = dir.file(dtype_name(type) + ".safetensors");
    write_safetensors(path, {{"w", t}}, type);
    SafetensorsFile file(path);
    CHECK(file.entry("w").dtype == (type == DType::bf16 ? "BF16" : "F16"));
    Tensor back = file.read("w");
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float x = t.data<float>()[i];
      const float expected =
          type == DType::bf16 ? bf16_to_float(float_to_bf16(x)) : f16_to_float(float_to_f16(x));
      REQUIRE(std::memcmp(&back.data<float>()[i], &expected, 4) == 0);
    }
    // Written again from what was read: the same bytes (bf16 -> f32 -> bf16 is exact).
    const std::string again = dir.file("again.safetensors");
    write_safetensors(again, {{"w", back}}, type);
    CHECK(read_bytes(again) == read_bytes(path));
  }
  CHECK(contains(error_of([&] {
                   write_safetensors(dir.file("x"), {{"w", t}}, DType::e4m3);
                 }),
                 "frugal writes f32, bf16 or f16"));
}

TEST_CASE("safetensors written by the safetensors library convert as expected") {
  const std::string path = (kFixtures / "dtypes.safetensors").string();
  const nlohmann::json expected = read_json(kFixtures / "dtypes.json");
  SafetensorsFile file(path);
  for (const auto& [name, e] : expected.items()) {
    INFO(name);
    Tensor t = file.read(name);
    CHECK(t.shape() == e["shape"].get<Shape>());
    const auto values = e["values"].get<std::vector<double>>();
    REQUIRE(static_cast<int64_t>(values.size()) == t.numel());
    for (size_t i = 0; i < values.size(); ++i)
      CHECK(t.data<float>()[i] == static_cast<float>(values[i]));
  }
  CHECK(file.entry("bf16").dtype == "BF16");
  CHECK(file.entry("f16").dtype == "F16");
  CHECK(file.entry("f64").dtype == "F64");
  const std::string err = error_of([&] { file.read("i64"); });
  CHECK(contains(err, path));
  CHECK(contains(err, "tensor 'i64'"));
  CHECK(contains(err, "'I64' is not a floating-point type"));
}

TEST_CASE("safetensors: truncated files and bad headers fail naming the file and tensor") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  write_safetensors(good, {{"a", random_f32({4, 4}, 1)}, {"b", random_f32({8, 3}, 2)}}, DType::f32);
  const std::string bytes = read_bytes(good);

  SECTION("truncated inside the data") {
    const std::string path = dir.file("cut.safetensors");
    write_bytes(path, bytes.substr(0, bytes.size() - 10));
    const std::string err = error_of([&] { SafetensorsFile f(path); });
    CHECK(contains(err, path));
    CHECK(contains(err, "tensor 'b'"));
    CHECK(contains(err, "truncated"));
  }
  SECTION("truncated inside the header") {
    const std::string path = dir.file("cut.safetensors");
    write_bytes(path, bytes.substr(0, 40));
    const std::string err = error_of([&] { SafetensorsFile f(path); });
    CHECK(contains(err, path));
    CHECK(contains(err, "runs past the end of the file"));
  }
  SECTION("shorter than the header length") {
    const std::string path = dir.file("tiny.safetensors");
    write_bytes(path, bytes.substr(0, 5));
    CHECK(contains(error_of([&] { SafetensorsFile f(path); }), "too short"));
  }
  SECTION("missing file") {
    CHECK(contains(error_of([&] { SafetensorsFile f(dir.file("none.safetensors")); }),
                   "safetensors file '" + dir.file("none.safetensors") + "' does not exist"));
  }
  SECTION("header length beyond the format's limit") {
    const std::string path = dir.file("huge.safetensors");
    write_raw(path, "{}", 0, uint64_t(1) << 40);
    CHECK(contains(error_of([&] { SafetensorsFile f(path); }), "exceeds the 100 MB limit"));
  }
  SECTION("header that is not JSON") {
    const std::string path = dir.file("bad.safetensors");
    write_raw(path, "{\"a\": {\"dtype\": ", 0);
    const std::string err = error_of([&] { SafetensorsFile f(path); });
    CHECK(contains(err, path));
    CHECK(contains(err, "not valid JSON"));
  }
  SECTION("sizes that do not match shape x dtype") {
    const std::string path = dir.file("size.safetensors");
    write_raw(path, R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24);
    const std::string err = error_of([&] { SafetensorsFile f(path); });
    CHECK(contains(err, "tensor 'w'"));
    CHECK(contains(err, "needs 24"));
  }
  SECTION("unknown dtype, missing fields, overlaps") {
    const std::string path = dir.file("dtype.safetensors");
    write_raw(path, R"({"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}})", 8);
    CHECK(contains(error_of([&] { SafetensorsFile f(path); }), "unknown dtype 'F7'"));
    write_raw(path, R"({"w": {"dtype": "F32", "shape": [2]}})", 8);
    CHECK(contains(error_of([&] { SafetensorsFile f(path); }),
                   "needs dtype, shape and data_offsets"));
    write_raw(path,
              R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
              12);
    CHECK(contains(error_of([&] { SafetensorsFile f(path); }), "overlap"));
    // A shape whose element count wraps around 64 bits must not pass as 0 bytes.
    write_raw(
        path,
        R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
    CHECK(contains(error_of([&] { SafetensorsFile f(path); }),
                   "tensor 'w': tensor shape [4294967296, 4294967296]: 4294967296 x 4294967296 "
                   "does not fit in int64"));
    // Nor a product of elements and element size that wraps: 2^62 F32 elements are 2^64 bytes.
    write_raw(path,
              R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})",
              0);
    std::string err = error_of([&] { SafetensorsFile f(path); });
    CHECK(contains(err, "tensor 'w'"));
    CHECK(contains(err, "4611686018427387904 x 4 does not fit in"));
    // An element count past int64 (what shapes and tensors count in).
    write_raw(
        path,
        R"({"w": {"dtype": "U8", "shape": [4611686018427387904, 2], "data_offsets": [0, 0]}})", 0);
    err = error_of([&] { SafetensorsFile f(path); });
    CHECK(contains(err, "tensor 'w'"));
    CHECK(contains(err, "4611686018427387904 x 2 does not fit in int64"));
  }
}

TEST_CASE("sharded safetensors: the index maps names to shards, a missing shard is named") {
  SafetensorsSet set((kFixtures / "mha_tied_sharded").string());
  CHECK(set.has("model.embed_tokens.weight"));
  CHECK(set.has("model.norm.weight"));
  CHECK(contains(set.description(), "model.safetensors.index.json"));
  CHECK(set.file_of("model.embed_tokens.weight").path() != set.file_of("model.norm.weight").path());

  TempDir dir;
  const fs::path copy = dir.path / "m";
  copy_dir(kFixtures / "mha_tied_sharded", copy);
  fs::remove(copy / "model-00002-of-00002.safetensors");
  const std::string err = error_of([&] { SafetensorsSet s(copy.string()); });
  CHECK(contains(err, "model-00002-of-00002.safetensors"));
  CHECK(contains(err, "is missing"));
  CHECK(contains(err, "model.layers.1."));
  // The same through the model directory (frugal eval/generate open it this way).
  CHECK(contains(error_of([&] { HfModelDir m(copy.string()); }), "is missing"));

  // An index that names a shard which lacks the tensor.
  nlohmann::json index = read_json(copy / "model.safetensors.index.json");
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  index["weight_map"].erase("model.layers.1.input_layernorm.weight");
  for (auto& [name, shard] : index["weight_map"].items())
    shard = "model-00001-of-00002.safetensors";
  write_json(copy / "model.safetensors.index.json", index);
  CHECK(contains(error_of([&] { SafetensorsSet s(copy.string()); }), "which does not hold it"));

  CHECK(contains(error_of([&] { SafetensorsSet s(dir.file("nowhere")); }),
                 "neither model.safetensors nor model.safetensors.index.json"));
}

TEST_CASE("HF model directory: wrong shapes and missing tensors are named") {
  TempDir dir;
  const fs::path copy = dir.path / "m";
  copy_dir(kFixtures / "gqa_untied", copy);
  const std::string st = (copy / "model.safetensors").string();
  std::vector<std::pair<std::string, Tensor>> tensors;
  {
    SafetensorsFile file(st);
    for (const std::string& name : file.tensor_names()) tensors.push_back({name, file.read(name)});
  }
  const std::string k_proj = "model.layers.1.self_attn.k_proj.weight";

  SECTION("wrong shape") {
    for (auto& [name, t] : tensors)
      if (name == k_proj) t = t.view({t.size(1), t.size(0)});
    write_safetensors(st, tensors, DType::f32);
    const std::string err = error_of([&] { HfModelDir m(copy.string()); });
    CHECK(contains(err, st));
    CHECK(contains(err, "tensor '" + k_proj + "' has shape [64, 32]"));
    CHECK(contains(err, "config.json implies [32, 64]"));
  }
  SECTION("missing tensor") {
    std::erase_if(tensors, [](const auto& p) { return p.first == "lm_head.weight"; });
    write_safetensors(st, tensors, DType::f32);
    const std::string err = error_of([&] { HfModelDir m(copy.string()); });
    CHECK(contains(err, st));
    CHECK(contains(err, "has no tensor 'lm_head.weight'"));
  }
  SECTION("integer tensor") {
    // Not a float dtype: refused up front, naming the tensor.
    write_safetensors(st, tensors, DType::f32);
    std::string bytes = read_bytes(st);
    const size_t at = bytes.find("\"model.norm.weight\":{\"dtype\":\"F32\"");
    REQUIRE(at != std::string::npos);
    // F32 -> I32: same size, so the header stays valid.
    bytes.replace(bytes.find("F32", at), 3, "I32");
    write_bytes(st, bytes);
    const std::string err = error_of([&] { HfModelDir m(copy.string()); });
    CHECK(contains(err, "tensor 'model.norm.weight'"));
    CHECK(contains(err, "'I32' is not a floating-point type"));
  }
  SECTION("no config.json") {
    fs::remove(copy / "config.json");
    CHECK(contains(error_of([&] { HfModelDir m(copy.string()); }), "has no config.json"));
  }
  SECTION("tensors the model does not use: config.json declares fewer layers") {
    nlohmann::json config = read_json(copy / "config.json");
    config["num_hidden_layers"] = 1;
    write_json(copy / "config.json", config);
    const std::string err = error_of([&] { HfModelDir m(copy.string()); });
    CHECK(contains(err, st));
    CHECK(contains(err, "holds 9 tensors that the model of its config.json does not use"));
    CHECK(contains(err, "model.layers.1.input_layernorm.weight"));
  }
  SECTION("a rotary inv_freq buffer (older checkpoints) is not a weight: ignored") {
    tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", Tensor::zeros({8})});
    write_safetensors(st, tensors, DType::f32);
    HfModelDir m(copy.string());
    CHECK(m.config().num_hidden_layers == 2);
  }
  SECTION("lm_head.weight in a tied model: refused when it differs from the embedding") {
    nlohmann::json config = read_json(copy / "config.json");
    config["tie_word_embeddings"] = true;
    write_json(copy / "config.json", config);
    const std::string err = error_of([&] { HfModelDir m(copy.string()); });
    CHECK(contains(err, "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight'"));
    CHECK(contains(err, "tie_word_embeddings"));
    // Equal to the embedding: transformers ignores it, and so does frugal, saying so.
    Tensor embed;
    for (auto& [name, t] : tensors)
      if (name == "model.embed_tokens.weight") embed = t;
    for (auto& [name, t] : tensors)
      if (name == "lm_head.weight") t = embed.clone();
    write_safetensors(st, tensors, DType::f32);
    HfModelDir m(copy.string());
    CHECK(m.config().tie_word_embeddings);
  }
  SECTION("a non-finite weight is named when it is read") {
    for (auto& [name, t] : tensors)
      if (name == k_proj)
        t.data<float>()[2 * 64 + 5] = std::numeric_limits<float>::infinity();
      else if (name == "model.norm.weight")
        t.data<float>()[7] = std::nanf("");
    write_safetensors(st, tensors, DType::f32);
    HfModelDir m(copy.string());
    CHECK(contains(error_of([&] { m.read(k_proj); }),
                   "tensor '" + k_proj + "' holds inf at row 2, column 5"));
    CHECK(contains(error_of([&] { m.read_rows(k_proj, 2, 3); }), "holds inf at row 2, column 5"));
    CHECK(m.read_rows(k_proj, 3, 32).size(0) == 29);  // the rows without it read
    CHECK(contains(error_of([&] { m.load(); }), "holds"));
    CHECK(contains(error_of([&] { m.read("model.norm.weight"); }),
                   "tensor 'model.norm.weight' holds nan at row 7"));
  }
}

TEST_CASE("config.json of the Llama family: accepted layouts and refused ones") {
  // transformers 4's layout: rope_theta at the top level, rope_scaling null.
  nlohmann::json v4 = {{"architectures", {"LlamaForCausalLM"}},
                       {"model_type", "llama"},
                       {"hidden_size", 64},
                       {"intermediate_size", 96},
                       {"num_hidden_layers", 2},
                       {"num_attention_heads", 4},
                       {"num_key_value_heads", 2},
                       {"vocab_size", 112},
                       {"max_position_embeddings", 64},
                       {"rope_theta", 500000.0},
                       {"rope_scaling", nullptr},
                       {"rms_norm_eps", 1e-5},
                       {"hidden_act", "silu"},
                       {"attention_bias", false},
                       {"mlp_bias", false},
                       {"head_dim", nullptr},
                       {"tie_word_embeddings", true}};
  LlamaConfig c = llama_config_from_hf_json(v4, "v4.json");
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.tie_word_embeddings);
  CHECK(c.attention_head_dim() == 16);

  // transformers 5's layout: rope_parameters.
  nlohmann::json v5 = v4;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_theta", 50000.0}, {"rope_type", "default"}};
  v5["head_dim"] = 32;  // given explicitly, not hidden / heads
  c = llama_config_from_hf_json(v5, "v5.json");
  CHECK(c.rope_theta == 50000.0);
  CHECK(c.attention_head_dim() == 32);

  // Mistral: the sliding window is read, the context stays; null is no window. A Llama's
  // config may carry the key, which transformers' Llama ignores: so does frugal.
  nlohmann::json mistral = v4;
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 32;
  c = llama_config_from_hf_json(mistral, "mistral.json");
  CHECK(c.sliding_window == 32);
  CHECK(c.max_position_embeddings == 64);
  CHECK(llama_config_from_json(llama_config_to_json(c), "manifest").sliding_window == 32);
  const nlohmann::json exported = hf_config_json(c, DType::bf16, 1, 2);
  CHECK(exported.at("architectures") == nlohmann::json::array({"MistralForCausalLM"}));
  CHECK(exported.at("model_type") == "mistral");
  CHECK(exported.at("sliding_window") == 32);
  CHECK_FALSE(exported.contains("attention_bias"));
  CHECK(llama_config_from_hf_json(exported, "exported.json").sliding_window == 32);
  for (const nlohmann::json& bad : {nlohmann::json(0), nlohmann::json(-4), nlohmann::json(2.5)})
    CHECK(contains(error_of([&] {
                     nlohmann::json j = mistral;
                     j["sliding_window"] = bad;
                     llama_config_from_hf_json(j, "mistral.json");
                   }),
                   "key 'sliding_window' has value"));
  mistral["sliding_window"] = nullptr;
  CHECK(llama_config_from_hf_json(mistral, "mistral.json").sliding_window == 0);
  nlohmann::json llama_with_key = v4;
  llama_with_key["sliding_window"] = 16;
  CHECK(llama_config_from_hf_json(llama_with_key, "llama.json").sliding_window == 0);
  CHECK_FALSE(
      hf_config_json(llama_config_from_hf_json(llama_with_key, "llama.json"), DType::bf16, 1, 2)
          .contains("sliding_window"));

  auto refused = [&](const char* key, const nlohmann::json& value, const std::string& message) {
    nlohmann::json j = v4;
    j[key] = value;
    const std::string err = error_of([&] { llama_config_from_hf_json(j, "cfg.json"); });
    INFO(key << " = " << value.dump() << ": " << err);
    CHECK(contains(err, "cfg.json"));
    CHECK(contains(err, message));
  };
  refused("architectures", {"Qwen3ForCausalLM"},
          "architecture 'Qwen3ForCausalLM' is not supported");
  refused("model_type", "gemma", "model_type 'gemma' is not supported");
  refused("rope_scaling", {{"rope_type", "longrope"}, {"factor", 8.0}},
          "rope_scaling of type 'longrope'");
  refused("rope_parameters", {{"rope_type", "su"}, {"rope_theta", 1e4}},
          "rope_scaling of type 'su'");
  refused("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}},
          "needs the key 'original_max_position_embeddings'");
  refused("rope_scaling",
          {{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 8192}},
          "needs the key 'low_freq_factor'");
  refused("rope_scaling", {{"type", "linear"}}, "needs the key 'factor'");
  refused("rope_scaling", {{"type", "linear"}, {"factor", "two"}}, "key 'factor' has value");
  refused("rope_scaling", {{"type", "linear"}, {"factor", 0.5}}, "must be >= 1");
  refused("rope_scaling", {{"type", "yarn"}}, "needs 'factor' or");
  // transformers 4's "type", and YaRN's factor from the two lengths when it is not given.
  nlohmann::json linear = v4;
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  const LlamaConfig lc = llama_config_from_hf_json(linear, "cfg.json");
  CHECK(lc.rope_scaling.type == RopeScalingType::linear);
  CHECK(lc.rope_scaling.factor == 2.0);
  nlohmann::json yarn = v4;
  yarn["max_position_embeddings"] = 4096;
  yarn["rope_parameters"] = {
      {"rope_type", "yarn"}, {"rope_theta", 1e4}, {"original_max_position_embeddings", 1024}};
  yarn.erase("rope_scaling");
  const LlamaConfig yc = llama_config_from_hf_json(yarn, "cfg.json");
  CHECK(yc.rope_scaling.type == RopeScalingType::yarn);
  CHECK(yc.rope_scaling.factor == 4.0);
  CHECK(yc.rope_theta == 1e4);
  refused("attention_bias", true, "attention_bias = true is not supported");
  {
    nlohmann::json qwen2 = v4;
    qwen2["architectures"] = {"Qwen2ForCausalLM"};
    qwen2["model_type"] = "qwen2";
    CHECK(llama_config_from_hf_json(qwen2, "cfg.json").architecture == Architecture::qwen2);
    CHECK(llama_config_from_hf_json(qwen2, "cfg.json").qkv_bias());
    qwen2["use_sliding_window"] = true;
    CHECK(contains(error_of([&] { llama_config_from_hf_json(qwen2, "cfg.json"); }),
                   "use_sliding_window = true is not supported"));
  }
  refused("mlp_bias", true, "mlp_bias = true is not supported");
  refused("hidden_act", "gelu", "hidden_act 'gelu' is not supported");
  refused("quantization_config", {{"quant_method", "gptq"}}, "quantized checkpoints");
  refused("hidden_size", "big", "key 'hidden_size'");
  // A fractional size is refused by name, not truncated (64.7 is no 64); a whole one is fine.
  refused("hidden_size", 64.7, "key 'hidden_size' has value 64.7, not a whole number");
  refused("num_hidden_layers", 2.5, "key 'num_hidden_layers' has value 2.5, not a whole number");
  refused("vocab_size", 1e30, "key 'vocab_size' has value 1e+30, not a whole number");
  nlohmann::json whole = v4;
  whole["hidden_size"] = 64.0;
  CHECK(llama_config_from_hf_json(whole, "cfg.json").hidden_size == 64);
  nlohmann::json bare = v4;
  bare.erase("architectures");
  bare.erase("model_type");
  CHECK(contains(error_of([&] { llama_config_from_hf_json(bare, "cfg.json"); }),
                 "neither 'architectures' nor 'model_type'"));
  // rope_scaling {"rope_type": "default"} is the plain rotary embedding: accepted.
  nlohmann::json plain = v4;
  plain["rope_scaling"] = {{"rope_type", "default"}};
  CHECK(llama_config_from_hf_json(plain, "cfg.json").rope_theta == 500000.0);
}
