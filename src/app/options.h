// Command-line and .cfg parsing (Boost.Program_options) for the training configuration:
// INI sections map to "section.key", every key can be overridden as --section.key=value,
// and unknown keys or bad values stop the program before any work. The keys themselves are
// config/config_keys.h's table. Also the parsing every subcommand shares: Boost's errors, token
// ids.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace boost::program_options {
class error;
}

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

// Whitespace-separated token ids (`generate --prompt-ids`, a line of `eval --tokens`); a word
// that is not an id in [0, 2^31) is an Error "<where>: '<word>' is not a token id", the word
// quoted printable (it may come from a binary file).
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& where);

// What a Boost.Program_options error says, safe to ask for any input. Boost's own what() fills
// its template by replacing each placeholder ("%canonical_option%") until none is left, so an
// argument or a .cfg line that holds a placeholder's name makes it loop forever (found by
// fuzzing the .cfg parser; `frugal export '--%canonical_option%'` hung). Every subcommand's
// parsing errors go through here.
std::string program_options_message(const boost::program_options::error& e);

}  // namespace frugal
