// Command-line and .cfg parsing (Boost.Program_options) for the training configuration:
// INI sections map to "section.key", every key can be overridden as --section.key=value,
// and unknown keys or bad values stop the program before any work. The keys themselves are
// train/config_keys.h's table.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "train/train_config.h"

namespace frugal {

struct TrainOptions {
  TrainConfig config;
  bool help = false;                // --help: print train_options_help() and stop
  bool help_keys_markdown = false;  // --help-keys-markdown: print doc/usage.md's key table
};

// args: the arguments after the subcommand: [CONFIG.cfg ...] [--config FILE] [--section.key=value
// ...]
TrainOptions parse_train_options(const std::vector<std::string>& args);
std::string train_options_help();

}  // namespace frugal
