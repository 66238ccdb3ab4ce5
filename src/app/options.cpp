// Command-line and .cfg parsing of the training keys with Boost.Program_options: the options,
// their defaults and --help come from the key table (config/config_keys.h).
#include "app/options.h"

#include <boost/program_options.hpp>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "config/config_keys.h"
#include "core/log.h"
#include "core/regular_file.h"

namespace po = boost::program_options;

namespace frugal {

namespace {

// One options_description per section, every key a string that ConfigKey::set parses (so a
// bad value reads "config key 'train.lr': value 'abc' is not a number"). The defaults are shown
// by --help only: parsing sets the keys given and leaves the others at TrainConfig's defaults.
enum class ShowDefaults { no, yes };
po::options_description describe(const std::vector<ConfigKey>& keys, ShowDefaults show) {
  po::options_description all("frugal train options");
  for (const ConfigSection& section : config_sections()) {
    po::options_description options("[" + section.name + "] " + section.title);
    for (const ConfigKey& key : keys) {
      if (key.section() != section.name) continue;
      const std::string allowed = key.allowed();
      const bool says_more = allowed != "any text" && allowed != "a path";
      const std::string doc = says_more ? key.doc + " (allowed: " + allowed + ")" : key.doc;
      auto* value = po::value<std::string>();
      if (show == ShowDefaults::yes) value->default_value(key.text());
      options.add_options()(key.name.c_str(), value, doc.c_str());
    }
    all.add(options);
  }
  return all;
}

// What the parser matches against, built once: the table is fixed, and building it (a hundred
// options with their docs) cost more than parsing a .cfg file.
const po::options_description& parsing_description() {
  static const po::options_description* const all = [] {
    TrainConfig defaults;
    return new po::options_description(describe(config_keys(defaults), ShowDefaults::no));
  }();
  return *all;
}

// An error's copy whose substituted texts hold no '%' (shown as the fullwidth '％'), so that no
// substitution can bring back a placeholder: a derived class may rewrite its own base's
// protected substitution tables.
class PlaceholderFreeError : public po::error_with_option_name {
 public:
  explicit PlaceholderFreeError(const po::error_with_option_name& e)
      : po::error_with_option_name(e) {
    for (auto& [name, text] : m_substitutions) text = without_percent(text);
    for (auto& [name, placeholder_and_text] : m_substitution_defaults)
      placeholder_and_text.second = without_percent(placeholder_and_text.second);
  }

 private:
  static std::string without_percent(const std::string& text) {
    std::string out;
    for (char c : text) out += c == '%' ? std::string("\xef\xbc\x85") : std::string(1, c);
    return out;
  }
};

}  // namespace

std::string program_options_message(const po::error& e) {
  if (auto* named = dynamic_cast<const po::error_with_option_name*>(&e))
    return PlaceholderFreeError(*named).what();
  return e.what();
}

namespace {

// "config key 'train.lr': the required argument for option '--train.lr' is missing"
[[noreturn]] void rethrow_as_error(const po::error& e) {
  if (auto* named = dynamic_cast<const po::error_with_option_name*>(&e)) {
    std::string key = named->get_option_name();
    while (!key.empty() && key[0] == '-') key.erase(0, 1);
    key = key.substr(0, key.find('='));
    if (dynamic_cast<const po::unknown_option*>(&e))
      fail("unknown config key '", key, "' (see `frugal train --help` for every key)");
    if (!key.empty()) fail("config key '", key, "': ", program_options_message(e));
  }
  fail(program_options_message(e));
}

// A file's values are parsed as they are read, so that a bad one names the file.
void check_values(const po::parsed_options& parsed) {
  TrainConfig scratch;
  const std::vector<ConfigKey> keys = config_keys(scratch);
  for (const po::option& option : parsed.options)
    for (const ConfigKey& key : keys)
      if (key.name == option.string_key && !option.value.empty()) key.set(option.value.front());
}

// "--section.key value" becomes "--section.key=value", and when a key is given more than
// once the last one wins (so a script can append overrides to a user's command line).
std::vector<std::string> last_override_wins(const std::vector<std::string>& args) {
  std::vector<std::string> merged;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool dotted_key = a.rfind("--", 0) == 0 && a.find('.') != std::string::npos &&
                            a.find('=') == std::string::npos;
    if (dotted_key && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0)
      merged.push_back(a + "=" + args[++i]);
    else
      merged.push_back(a);
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < merged.size(); ++i) {
    const std::string& a = merged[i];
    const size_t eq = a.find('=');
    bool overridden = false;
    if (a.rfind("--", 0) == 0 && eq != std::string::npos)
      for (size_t j = i + 1; j < merged.size(); ++j)
        overridden = overridden || merged[j].rfind(a.substr(0, eq + 1), 0) == 0;
    if (!overridden) out.push_back(a);
  }
  return out;
}

}  // namespace

TrainOptions parse_train_options(const std::vector<std::string>& raw_args) {
  const std::vector<std::string> args = last_override_wins(raw_args);
  TrainOptions out;
  TrainConfig& c = out.config;
  const std::vector<ConfigKey> keys = config_keys(c);
  const po::options_description& all = parsing_description();

  po::options_description cli("command line");
  std::vector<std::string> config_files;
  cli.add_options()("help,h", "print every key with its default and exit")(
      "help-keys-markdown", "print doc/usage.md's table of every key and exit")(
      "config", po::value<std::vector<std::string>>(&config_files)->composing(),
      "a .cfg file (also accepted as a positional argument; later files win)");
  cli.add(all);
  po::positional_options_description positional;
  positional.add("config", -1);

  po::variables_map vm;
  try {
    // The command line is stored first, so its values win over the files'.
    po::store(po::command_line_parser(args).options(cli).positional(positional).run(), vm);
    if (vm.count("help")) {
      out.help = true;
      return out;
    }
    if (vm.count("help-keys-markdown")) {
      out.help_keys_markdown = true;
      return out;
    }
    if (vm.count("config")) {
      std::vector<std::string> files = vm["config"].as<std::vector<std::string>>();
      // Later files win: store them last to first, since store keeps the first value.
      for (auto it = files.rbegin(); it != files.rend(); ++it) {
        // (An ifstream opens a directory, which then reads as an empty file.)
        std::error_code ec;
        if (std::filesystem::is_directory(*it, ec))
          fail("config file '", *it, "' is a directory, not a .cfg file");
        require_regular_file(*it, "config file");  // a FIFO would block the open
        std::ifstream in(*it);
        if (!in) fail("cannot read config file '", *it, "'");
        try {
          const po::parsed_options parsed =
              po::parse_config_file(in, all, /*allow_unregistered=*/false);
          check_values(parsed);
          po::store(parsed, vm);
        } catch (const po::error& e) {
          try {
            rethrow_as_error(e);
          } catch (const Error& inner) {
            fail("config file '", *it, "': ", inner.what());
          }
        } catch (const Error& e) {
          fail("config file '", *it, "': ", e.what());
        }
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    rethrow_as_error(e);
  }
  for (const ConfigKey& key : keys) {
    const po::variable_value& value = vm[key.name];
    if (!value.empty()) key.set(value.as<std::string>());
  }
  c.resolve();
  c.validate();
  // A key given but not read (galore.rank under AdamW): said, since the run trains otherwise
  // than its author may think. Not an error: one .cfg serves runs of either mode.
  std::map<std::string, std::string> ignored;  // why -> the keys
  for (const ConfigKey& key : keys)
    if (const std::string why = c.unused_because(key.name); !vm[key.name].empty() && !why.empty())
      ignored[why] += (ignored[why].empty() ? "" : ", ") + key.name;
  for (const auto& [why, names] : ignored) log_warn("config keys ignored (", why, "): ", names);
  return out;
}

std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& where) {
  std::istringstream words(text);
  std::vector<int32_t> ids;
  for (std::string word; words >> word;) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || id < 0 || id > INT32_MAX)
      fail(where, ": '", printable(word), "' is not a token id");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::string train_options_help() {
  TrainConfig defaults;
  std::ostringstream out;
  out << "usage: frugal train [CONFIG.cfg ...] [--section.key=value ...]\n\n"
         "Trains a Llama-family model. Keys come from .cfg files (INI sections such as\n"
         "[train] with `lr = 3e-3`), overridden by --section.key=value on the command line.\n"
         "Launch several ranks with mpirun -np N. --help-keys-markdown prints the keys as\n"
         "doc/usage.md's table.\n\n"
      << describe(config_keys(defaults), ShowDefaults::yes);
  return out.str();
}

}  // namespace frugal
