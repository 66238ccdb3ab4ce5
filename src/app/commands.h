// The subcommands of the frugal executable. Each takes the arguments after its name and
// returns the process exit code; errors are thrown as frugal::Error.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/local_parameters.h"

namespace frugal {

int run_frugal(int argc, char** argv);  // MPI start-up, dispatch, error reporting

int cmd_train(const std::vector<std::string>& args);
int cmd_prepare(const std::vector<std::string>& args);
int cmd_ckpt(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);
int cmd_plot(const std::vector<std::string>& args);

// A whole model for eval, generate and export, from a Hugging Face directory (hf_dir) or a
// frugal checkpoint (ckpt_path): exactly one of them must be given. Defined in cmd_eval.cpp.
struct InferenceModel {
  LlamaConfig config;
  std::unique_ptr<LocalParameters> params;  // no gradients
  std::string source;                       // "Hugging Face model DIR" / "checkpoint DIR"
  std::string tokenizer_path;               // empty when the model has none
  int32_t bos_id = -1;                      // -1: unknown
  int32_t eos_id = -1;
};
InferenceModel load_inference_model(const std::string& command, const std::string& hf_dir,
                                    const std::string& ckpt_path);

}  // namespace frugal
