// Hugging Face directories: config.json <-> LlamaConfig, streamed weight reads, export.
#include "model/hf_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/safetensors.h"
#include "core/json_integer.h"
#include "core/log.h"
#include "core/regular_file.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// A key that must hold a JSON string; `what` names the key in messages.
std::string string_key(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.at(key).is_string())
    fail(source, ": key '", key, "' has value ", j.at(key).dump(), ", expected a string");
  return j.at(key).get<std::string>();
}

bool present(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null();
}

int32_t token_id(const nlohmann::json& j, const char* key) {
  if (!present(j, key)) return -1;
  const nlohmann::json& v = j.at(key);
  const nlohmann::json& id = v.is_array() && !v.empty() ? v[0] : v;
  if (!id.is_number_integer()) return -1;
  return int32_t(json_integer(id, std::string("config.json key '") + key + "'", -1, INT32_MAX));
}

}  // namespace

LlamaConfig llama_config_from_hf_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) fail(source, ": not a JSON object");
  // The architecture: what the model class is, and what kind of config this is.
  const char* supported =
      "LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (model_type llama, mistral, "
      "qwen2)";
  bool qwen2 = false, mistral = false;
  if (present(j, "architectures")) {
    const nlohmann::json& arch = j.at("architectures");
    if (!arch.is_array() || arch.empty())
      fail(source, ": key 'architectures' has value ", arch.dump(), ", expected a list");
    for (const auto& a : arch) {
      const std::string name = a.is_string() ? a.get<std::string>() : a.dump();
      if (name != "LlamaForCausalLM" && name != "MistralForCausalLM" && name != "Qwen2ForCausalLM")
        fail(source, ": architecture '", name, "' is not supported; frugal runs ", supported);
      qwen2 = qwen2 || name == "Qwen2ForCausalLM";
      mistral = mistral || name == "MistralForCausalLM";
    }
  }
  if (present(j, "model_type")) {
    const std::string type = string_key(j, "model_type", source);
    if (type != "llama" && type != "mistral" && type != "qwen2")
      fail(source, ": model_type '", type, "' is not supported; frugal runs ", supported);
    qwen2 = qwen2 || type == "qwen2";
    mistral = mistral || type == "mistral";
  }
  if (!present(j, "architectures") && !present(j, "model_type"))
    fail(source, ": has neither 'architectures' nor 'model_type'; frugal runs ", supported);

  // What would change the math, refused rather than silently ignored.
  for (const char* key : {"hidden_act", "hidden_activation"})
    if (present(j, key) && string_key(j, key, source) != "silu")
      fail(source, ": ", key, " '", j.at(key).get<std::string>(),
           "' is not supported; frugal's MLP is SwiGLU (silu)");
  // Qwen2's q/k/v biases come with its architecture; other biases are not implemented.
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (!qwen2 && present(j, key) && !(j.at(key).is_boolean() && !j.at(key).get<bool>()))
      fail(source, ": ", key, " = ", j.at(key).dump(),
           " is not supported; frugal's Llama layers have no biases (Qwen2's q/k/v biases are)");
  if (qwen2 && present(j, "use_sliding_window") && j.at("use_sliding_window") != false)
    fail(source, ": use_sliding_window = ", j.at("use_sliding_window").dump(),
         " is not supported; frugal runs Qwen2 with full attention");
  if (present(j, "quantization_config"))
    fail(source,
         ": quantized checkpoints (quantization_config) are not supported; give the "
         "unquantized model");

  // The shape, through the same reader as frugal's own manifests. Null entries mean "the
  // default" in Hugging Face's configs.
  nlohmann::json shape = nlohmann::json::object();
  for (const char* key :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "max_position_embeddings", "rope_theta",
        "rms_norm_eps", "tie_word_embeddings", "head_dim"})
    if (present(j, key)) shape[key] = j.at(key);
  // transformers 5 moved rope_theta (and the scaling) into "rope_parameters"; an older
  // config has "rope_scaling" (which wins when both are there, as in transformers).
  nlohmann::json rope = nullptr;
  if (present(j, "rope_parameters")) {
    rope = j.at("rope_parameters");
    if (!rope.is_object())
      fail(source, ": key 'rope_parameters' has value ", rope.dump(), ", expected an object");
    if (present(rope, "rope_theta")) shape["rope_theta"] = rope.at("rope_theta");
  }
  if (present(j, "rope_scaling") && !j.at("rope_scaling").empty()) rope = j.at("rope_scaling");
  if (!rope.is_null()) shape["rope_scaling"] = rope;
  // Both default to what transformers' LlamaConfig defaults to.
  if (!shape.contains("tie_word_embeddings")) shape["tie_word_embeddings"] = false;
  if (!shape.contains("rms_norm_eps")) shape["rms_norm_eps"] = 1e-6;
  LlamaConfig config = llama_config_from_json(shape, source);
  if (qwen2) config.architecture = Architecture::qwen2;

  // Mistral's sliding window (null: none). Llama's and Qwen2's configs may carry the key too,
  // unused by their transformers classes (Qwen2's use_sliding_window = true is refused above).
  if (mistral && !qwen2 && present(j, "sliding_window")) {
    try {
      config.sliding_window = json_integer(j.at("sliding_window"), "sliding_window", 1, INT64_MAX);
    } catch (const Error&) {
      fail(source, ": key 'sliding_window' has value ", j.at("sliding_window").dump(),
           ", expected a positive integer or null");
    }
  }
  return config;
}

nlohmann::json hf_config_json(const LlamaConfig& c, DType dtype, int32_t bos_token_id,
                              int32_t eos_token_id) {
  std::string torch_dtype;
  switch (dtype) {
    case DType::f32:
      torch_dtype = "float32";
      break;
    case DType::bf16:
      torch_dtype = "bfloat16";
      break;
    case DType::f16:
      torch_dtype = "float16";
      break;
    default:
      fail("export: dtype ", dtype_name(dtype), " is not one of f32, bf16");
  }
  nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.attention_head_dim()},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", rope_scaling_to_hf_json(c.rope_scaling, c.max_position_embeddings)},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"initializer_range", 0.02},
      {"pretraining_tp", 1},
      {"use_cache", true},
      {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_id},
      // transformers 4 reads "torch_dtype", transformers 5 "dtype".
      {"torch_dtype", torch_dtype},
      {"dtype", torch_dtype}};
  if (c.architecture == Architecture::qwen2) {
    // Qwen2's q/k/v biases come with the architecture; its sliding window stays off.
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["model_type"] = "qwen2";
    for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(key);
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  } else if (c.sliding_window > 0) {
    // A Llama with a sliding window is a Mistral: the keys MistralConfig writes.
    j["architectures"] = {"MistralForCausalLM"};
    j["model_type"] = "mistral";
    for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(key);
    j["sliding_window"] = c.sliding_window;
  }
  return j;
}

// --- HfModelDir ---------------------------------------------------------------------------

HfModelDir::HfModelDir(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("Hugging Face model directory '", dir, "' does not exist");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (non_regular_kind(config_path) == "missing")
    fail("'", dir, "' is not a Hugging Face model directory: it has no config.json");
  const std::string text = read_regular_file(config_path, "Hugging Face config");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(config_path, ": not valid JSON: ", e.what());
  }
  config_ = llama_config_from_hf_json(j, config_path);
  bos_token_id_ = token_id(j, "bos_token_id");
  eos_token_id_ = token_id(j, "eos_token_id");
  weights_ = std::make_unique<SafetensorsSet>(dir);
  // The layer count against the weights before the table of every layer's tensors is built: a
  // damaged count (millions of layers) must be refused, not allocated for.
  const std::string last_layer =
      hf_layer_prefix(config_.num_hidden_layers - 1) + "input_layernorm.weight";
  if (!weights_->has(last_layer))
    fail("'", weights_->description(), "' has no tensor '", last_layer,
         "', which config.json implies (num_hidden_layers = ", config_.num_hidden_layers, ")");
  specs_ = llama_units(config_);
  validate_tensors();
}

HfModelDir::~HfModelDir() = default;
HfModelDir::HfModelDir(HfModelDir&&) noexcept = default;
HfModelDir& HfModelDir::operator=(HfModelDir&&) noexcept = default;

std::string HfModelDir::tokenizer_path() const { return find_tokenizer(dir_); }

const Shape& HfModelDir::expected_shape(const std::string& hf_name) const {
  for (const UnitSpec& unit : specs_)
    for (const ParamSpec& p : unit.params)
      if (p.name == hf_name) return p.shape;
  fail("'", dir_, "': the model of its config.json has no parameter '", hf_name, "'");
}

void HfModelDir::validate_tensors() const {
  for (const UnitSpec& unit : specs_)
    for (const ParamSpec& p : unit.params) {
      if (!weights_->has(p.name))
        fail("'", weights_->description(), "' has no tensor '", p.name, "', which config.json ",
             "implies (shape ", shape_string(p.shape), ")");
      const SafetensorsFile& file = weights_->file_of(p.name);
      const SafetensorsEntry& e = file.entry(p.name);
      if (e.shape != p.shape)
        fail("safetensors file '", file.path(), "': tensor '", p.name, "' has shape ",
             shape_string(e.shape), ", but config.json implies ", shape_string(p.shape));
      try {
        safetensors_float_dtype(e.dtype);
      } catch (const Error& err) {
        fail("safetensors file '", file.path(), "': tensor '", p.name, "': ", err.what());
      }
    }
  // What the model does not use means config.json and the weights disagree (fewer layers, a
  // smaller model): refused, naming the tensors. Rotary inv_freq buffers, which older
  // checkpoints saved and transformers ignores, are not weights; a tied model's
  // lm_head.weight is compared with the embedding instead.
  std::set<std::string> used;
  for (const UnitSpec& unit : specs_)
    for (const ParamSpec& p : unit.params) used.insert(p.name);
  std::vector<std::string> unused;
  bool tied_head = false;
  for (const std::string& name : weights_->tensor_names()) {
    if (used.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
    if (config_.tie_word_embeddings && name == "lm_head.weight")
      tied_head = true;
    else
      unused.push_back(name);
  }
  if (!unused.empty()) {
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 6; ++i) names += (i ? ", " : "") + unused[i];
    if (unused.size() > 6) names += ", ...";
    fail("'", weights_->description(), "' holds ", unused.size(),
         " tensors that the model of its config.json does not use (", names,
         "): do config.json's num_hidden_layers and sizes match the weights?");
  }
  if (tied_head) check_tied_head();
}

void HfModelDir::check_tied_head() const {
  // transformers ignores lm_head.weight when tie_word_embeddings is set: harmless when it
  // equals the embedding, a silently different model otherwise.
  const std::string head = "lm_head.weight", embed = "model.embed_tokens.weight";
  const SafetensorsFile& head_file = weights_->file_of(head);
  const SafetensorsFile& embed_file = weights_->file_of(embed);
  const auto differs = [&](const std::string& why) {
    fail("safetensors file '", head_file.path(), "': tensor '", head, "' differs from '", embed,
         "' (", why, "), but config.json sets tie_word_embeddings, which ties the output head to ",
         "the embedding and ignores it: set tie_word_embeddings to false to use it, or remove it");
  };
  const Shape& shape = embed_file.entry(embed).shape;
  if (head_file.entry(head).shape != shape)
    differs("shape " + shape_string(head_file.entry(head).shape) + " against " +
            shape_string(shape));
  // A block of rows at a time: memory stays small for any vocabulary.
  constexpr int64_t kRows = 256;
  for (int64_t row = 0; row < shape[0]; row += kRows) {
    const int64_t end = std::min(shape[0], row + kRows);
    const Tensor a = head_file.read_rows(head, row, end), b = embed_file.read_rows(embed, row, end);
    if (std::memcmp(a.raw(), b.raw(), a.bytes()) != 0)
      differs("in rows " + std::to_string(row) + " to " + std::to_string(end - 1));
  }
  log_warn("'", head_file.path(), "': ", head, " is ignored: config.json ties the output head to ",
           embed, " (tie_word_embeddings), and it holds the same values");
}

void HfModelDir::read_rows_into(const std::string& hf_name, int64_t row_begin, int64_t row_end,
                                const Tensor& out) const {
  const Shape& shape = expected_shape(hf_name);
  const SafetensorsFile& file = weights_->file_of(hf_name);
  if (file.entry(hf_name).shape != shape)
    fail("safetensors file '", file.path(), "': tensor '", hf_name, "' has shape ",
         shape_string(file.entry(hf_name).shape), ", but config.json implies ",
         shape_string(shape));
  file.read_rows_into(hf_name, row_begin, row_end, out);
  // A NaN or an infinity in the weights makes every loss NaN: refused where it is read.
  const float* v = out.data<float>();
  const int64_t n = out.numel();
  const int64_t row_len = row_end > row_begin ? n / (row_end - row_begin) : 1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      fail("safetensors file '", file.path(), "': tensor '", hf_name, "' holds ", v[i], " at row ",
           row_begin + i / row_len,
           shape.size() >= 2 ? ", column " + std::to_string(i % row_len) : std::string(),
           ": a model with non-finite weights computes no loss");
}

Tensor HfModelDir::read_rows(const std::string& hf_name, int64_t row_begin, int64_t row_end,
                             Arena& arena) const {
  Shape shape = expected_shape(hf_name);
  if (row_begin < 0 || row_begin > row_end || row_end > shape[0])
    fail("'", weights_->file_of(hf_name).path(), "': tensor '", hf_name, "' of shape ",
         shape_string(shape), ": rows [", row_begin, ", ", row_end, ") are out of range");
  shape[0] = row_end - row_begin;
  Tensor out = Tensor::empty(shape, DType::f32, arena);
  read_rows_into(hf_name, row_begin, row_end, out);
  return out;
}

Tensor HfModelDir::read(const std::string& hf_name, Arena& arena) const {
  return read_rows(hf_name, 0, expected_shape(hf_name)[0], arena);
}

void HfModelDir::load_into(LocalParameters& params) const {
  for (const UnitSpec& unit : specs_)
    for (const ParamSpec& p : unit.params) {
      Tensor& dst = params.param(p.name);
      FRUGAL_CHECK(dst.shape() == p.shape, "parameter '", p.name, "' is ",
                   shape_string(dst.shape()), ", the HF model's is ", shape_string(p.shape));
      read_rows_into(p.name, 0, p.shape[0], dst);
    }
}

std::unique_ptr<LocalParameters> HfModelDir::load() const {
  // Zero-std initialisation is cheap (norms to one, the rest to zero) and is overwritten.
  auto params = std::make_unique<LocalParameters>(config_, 0, 0.0f, false);
  load_into(*params);
  return params;
}

// --- export -------------------------------------------------------------------------------

namespace {

void write_json_file(const fs::path& path, const nlohmann::json& j) {
  const std::string tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    out.close();
    if (!out) fail("export: cannot write '", tmp, "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("export: cannot rename '", tmp, "' to '", path.string(), "': ", ec.message());
}

}  // namespace

void export_hf(const std::string& dir, const LlamaConfig& config, ParameterProvider& params,
               const HfExportOptions& options) {
  if (options.dtype != DType::f32 && options.dtype != DType::bf16)
    fail("export: dtype ", dtype_name(options.dtype), " is not one of f32, bf16");
  config.validate();
  std::unique_ptr<Tokenizer> tokenizer;
  if (!options.tokenizer_path.empty()) {
    tokenizer = std::make_unique<Tokenizer>(options.tokenizer_path);
    if (tokenizer->vocab_size() > config.vocab_size)
      fail("export: tokenizer '", options.tokenizer_path, "' has ", tokenizer->vocab_size(),
           " pieces, more than the model's vocab_size ", config.vocab_size);
  }
  const std::vector<UnitSpec> units = llama_units(config);
  std::unique_ptr<SafetensorsWriter> writer;
  if (options.write_files) {
    if (fs::exists(fs::path(dir) / "model.safetensors.index.json"))
      fail("export: '", dir, "' holds a sharded model (model.safetensors.index.json), which ",
           "would shadow the new model.safetensors: export to another directory");
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail("export: cannot create directory '", dir, "': ", ec.message());
    std::vector<SafetensorsWriter::Spec> specs;
    for (const UnitSpec& unit : units)
      for (const ParamSpec& p : unit.params) specs.push_back({p.name, p.shape});
    writer = std::make_unique<SafetensorsWriter>(
        (fs::path(dir) / "model.safetensors").string(), specs, options.dtype,
        std::map<std::string, std::string>{{"format", "pt"}});
  }
  // Unit by unit, as training gathers them: under ZeRO-3 only one unit is whole at a time.
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<Tensor> weights = params.gather(static_cast<int64_t>(u));
    FRUGAL_CHECK(weights.size() == units[u].params.size(), "unit ", units[u].name, " gathered ",
                 weights.size(), " tensors, expected ", units[u].params.size());
    if (writer)
      for (size_t i = 0; i < weights.size(); ++i)
        writer->write(units[u].params[i].name, weights[i]);
    params.release(static_cast<int64_t>(u));
  }
  if (!writer) return;
  writer->close();

  const fs::path out(dir);
  write_json_file(out / "config.json", hf_config_json(config, options.dtype, options.bos_token_id,
                                                      options.eos_token_id));
  // The tokenizer travels with the files that were beside it (tokenizer_config.json: bos, eos,
  // the chat template; chat_template.jinja; generation_config.json: a chat model's end-of-turn
  // ids); what it does not bring is written here: generation_config.json from config.json's
  // ids, and for a SentencePiece model a tokenizer_config.json for LlamaTokenizer.
  if (tokenizer) copy_tokenizer(options.tokenizer_path, dir);
  std::error_code ec;
  if (!fs::exists(out / "generation_config.json", ec))
    write_json_file(out / "generation_config.json", {{"bos_token_id", options.bos_token_id},
                                                     {"eos_token_id", options.eos_token_id}});
  if (tokenizer && tokenizer->kind() == TokenizerKind::sentencepiece &&
      !fs::exists(out / "tokenizer_config.json", ec)) {
    auto piece_or_null = [&](int32_t id) -> nlohmann::json {
      if (id < 0) return nullptr;
      return tokenizer->piece(id);
    };
    write_json_file(out / "tokenizer_config.json",
                    {{"tokenizer_class", "LlamaTokenizer"},
                     {"bos_token", piece_or_null(tokenizer->bos_id())},
                     {"eos_token", piece_or_null(tokenizer->eos_id())},
                     {"unk_token", piece_or_null(tokenizer->unk_id())},
                     {"pad_token", piece_or_null(tokenizer->pad_id())},
                     {"add_bos_token", true},
                     {"add_eos_token", false},
                     {"model_max_length", config.max_position_embeddings},
                     {"clean_up_tokenization_spaces", false}});
  }
}

}  // namespace frugal
