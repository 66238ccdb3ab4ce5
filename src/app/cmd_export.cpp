// `frugal export`: a frugal checkpoint (or a Hugging Face directory, e.g. to change its
// dtype) written as a Hugging Face directory that transformers and vLLM load.
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>

#include "app/commands.h"
#include "app/options.h"
#include "core/error.h"
#include "core/log.h"
#include "model/hf_model.h"
#include "train/saved_model.h"

namespace frugal {

namespace po = boost::program_options;
namespace fs = std::filesystem;

int cmd_export(const std::vector<std::string>& args) {
  std::string ckpt_path, hf_dir, out_dir, dtype_name_arg = "f32", tokenizer_path;
  bool peft = false;
  po::options_description named("options");
  // clang-format off
  named.add_options()
      ("help,h", "print this help and exit")
      ("ckpt", po::value<std::string>(&ckpt_path)->value_name("DIR"),
       "a frugal run directory, its ckpt/ directory, or one step directory")
      ("hf-model", po::value<std::string>(&hf_dir)->value_name("DIR"),
       "instead of --ckpt: a Hugging Face model directory (to change its dtype or layout)")
      ("out,o", po::value<std::string>(&out_dir)->value_name("DIR"),
       "output directory (required); created if missing, its files overwritten")
      ("dtype", po::value<std::string>(&dtype_name_arg)->default_value(dtype_name_arg)
           ->value_name("T"),
       "weights on disk: f32, or bf16 (rounded to nearest even)")
      ("tokenizer", po::value<std::string>(&tokenizer_path)->value_name("PATH"),
       "tokenizer.model to copy (default: the run's or the directory's own)")
      ("peft", po::bool_switch(&peft),
       "for a LoRA run (--ckpt): write its adapters as a PEFT adapter directory instead of "
       "the merged model");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(named).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail("export: ", program_options_message(e), " (see 'frugal export --help')");
  }
  if (vm.count("help")) {
    std::cout << "usage: frugal export --ckpt DIR --out DIR [--dtype f32|bf16] [--peft]\n\n"
                 "Writes a Hugging Face directory: config.json (LlamaForCausalLM),\n"
                 "generation_config.json, model.safetensors (every weight under its Hugging\n"
                 "Face name; tied embeddings are written once) and, when the run has one,\n"
                 "tokenizer.model with a tokenizer_config.json for LlamaTokenizer.\n"
                 "A LoRA run's adapters are merged into the weights; with --peft they are\n"
                 "written as a PEFT adapter directory instead.\n\n"
              << named << "\n";
    return 0;
  }
  if (out_dir.empty()) fail("export: --out DIR is required (see 'frugal export --help')");
  if (peft) {
    if (ckpt_path.empty() || !hf_dir.empty())
      fail("export: --peft takes --ckpt DIR (a LoRA run), not --hf-model");
    export_peft_adapters(ckpt_path, out_dir);
    log_info("export: the adapters of ", ckpt_path, " -> ", out_dir,
             " (adapter_model.safetensors, adapter_config.json)");
    return 0;
  }
  DType dtype = DType::f32;
  if (dtype_name_arg == "bf16") {
    dtype = DType::bf16;
  } else if (dtype_name_arg != "f32") {
    fail("export: --dtype '", dtype_name_arg, "' is not one of: f32, bf16");
  }
  if (!tokenizer_path.empty() && !fs::is_regular_file(tokenizer_path))
    fail("export: tokenizer '", tokenizer_path, "' does not exist");

  InferenceModel model = load_inference_model("export", hf_dir, ckpt_path);
  HfExportOptions options;
  options.dtype = dtype;
  options.tokenizer_path = tokenizer_path.empty() ? model.tokenizer_path : tokenizer_path;
  options.bos_token_id = model.bos_id;
  options.eos_token_id = model.eos_id;
  if (options.tokenizer_path.empty())
    log_warn("export: ", model.source, " has no tokenizer.model; the export has none either");
  export_hf(out_dir, model.config, *model.params, options);
  log_info("export: ", model.source, " -> ", out_dir, " (", model.config.parameter_count(),
           " parameters, ", dtype_name(dtype), ")");
  return 0;
}

}  // namespace frugal
