// metrics.jsonl -> gnuplot data files (two columns: step, value; blank-free) and a script with
// one PNG per topic; a panel whose series are all missing says so instead of failing.
#include "monitor/plots.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/regular_file.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// step -> value, by series name ("loss", "casts/bf16_grad/underflow", "gpu0/sm_clock_mhz").
using Series = std::map<std::string, std::vector<std::pair<int64_t, double>>>;

void add(Series& s, const std::string& name, int64_t step, const nlohmann::json& v) {
  if (v.is_number() && std::isfinite(v.get<double>())) s[name].emplace_back(step, v.get<double>());
}

Series read_series(const std::string& path) {
  require_regular_file(path, "plot: metrics file");
  std::ifstream in(path);
  if (!in) fail("plot: cannot read '", path, "'");
  Series s;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (!r.is_object() || !r.contains("step") || !r["step"].is_number_integer()) continue;
    const int64_t step = r["step"].get<int64_t>();
    add(s, "val_loss", step, r.value("val_loss", nlohmann::json()));
    if (!r.contains("loss")) continue;
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s"})
      add(s, key, step, r.value(key, nlohmann::json()));
    for (const char* key : {"peak_memory_bytes", "host_peak_rss_bytes", "device_peak_bytes"})
      if (r.contains(key) && r[key].is_number())
        add(s, key, step, r[key].get<double>() / 1048576.0);
    if (!r.contains("health")) continue;
    const nlohmann::json& h = r["health"];
    add(s, "loss_z", step, h.value("loss_z", nlohmann::json()));
    if (h.contains("casts"))
      for (const auto& [name, rates] : h["casts"].items()) {
        add(s, "casts/" + name + "/underflow", step, rates.value("underflow", nlohmann::json()));
        add(s, "casts/" + name + "/overflow", step, rates.value("overflow", nlohmann::json()));
      }
    if (h.contains("link"))
      add(s, "link/utilisation", step, h["link"].value("utilisation", nlohmann::json()));
    if (h.contains("gpus"))
      for (size_t g = 0; g < h["gpus"].size(); ++g) {
        const nlohmann::json& gpu = h["gpus"][g];
        if (!gpu.is_object()) continue;
        const std::string rank = "gpu" + std::to_string(g) + "/";
        add(s, rank + "sm_clock_mhz", step, gpu.value("sm_clock_mhz", nlohmann::json()));
        add(s, rank + "temperature_c", step, gpu.value("temperature_c", nlohmann::json()));
      }
  }
  if (!s.count("loss")) fail("plot: '", path, "' holds no training step");
  return s;
}

// A series' file name: its name with '/' as '_'.
std::string file_of(const std::string& name) {
  std::string f = name;
  for (char& c : f)
    if (c == '/') c = '_';
  return f + ".dat";
}

// The gnuplot title of a series: no underscores (gnuplot's subscript).
std::string title_of(const std::string& name) {
  std::string t = name;
  for (char& c : t)
    if (c == '_' || c == '/') c = ' ';
  return t;
}

struct Panel {
  std::string title, ylabel;
  std::vector<std::string> series;  // names present in the data
  bool log_y = false;
};

// "plot 'a.dat' ... , 'b.dat' ...", or a label that says nothing was measured.
std::string plot_command(const Panel& p) {
  std::ostringstream out;
  out << "set title '" << p.title << "'\nset ylabel '" << p.ylabel << "'\n";
  out << (p.log_y ? "set logscale y\n" : "unset logscale y\n");
  if (p.series.empty()) {
    out << "unset key\nset label 1 'not measured in this run' at graph 0.5, 0.5 center\n"
        << "plot [0:1] [0:1] NaN notitle\nunset label 1\nset key\n";
    return out.str();
  }
  out << "plot ";
  for (size_t i = 0; i < p.series.size(); ++i) {
    const bool points = p.series[i] == "val_loss";
    out << (i ? ", " : "") << "'" << file_of(p.series[i]) << "' using 1:2 with "
        << (points ? "linespoints pt 7 lw 2" : "lines lw 1.5") << " title '"
        << title_of(p.series[i]) << "'";
  }
  out << "\n";
  return out.str();
}

}  // namespace

std::vector<std::string> write_plot_script(const std::string& metrics_path,
                                           const std::string& out_dir) {
  const Series s = read_series(metrics_path);
  fs::create_directories(out_dir);
  for (const auto& [name, points] : s) {
    std::ofstream f(fs::path(out_dir) / file_of(name));
    for (const auto& [step, v] : points) f << step << " " << v << "\n";
    if (!f) fail("plot: cannot write '", (fs::path(out_dir) / file_of(name)).string(), "'");
  }
  auto present = [&s](std::vector<std::string> names) {
    std::vector<std::string> kept;
    for (const std::string& n : names)
      if (s.count(n)) kept.push_back(n);
    return kept;
  };
  auto with_prefix = [&s](const std::string& prefix, const std::string& suffix) {
    std::vector<std::string> kept;
    for (const auto& [name, points] : s)
      if (name.rfind(prefix, 0) == 0 && name.size() >= suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        kept.push_back(name);
    return kept;
  };
  std::vector<std::string> rates = with_prefix("casts/", "");
  // Log scale only where every value is positive.
  bool positive_rates = !rates.empty();
  for (const std::string& n : rates)
    for (const auto& [step, v] : s.at(n)) positive_rates = positive_rates && v > 0;

  std::ostringstream gp;
  gp << "# Written by frugal plot from " << metrics_path << "; run with: gnuplot plots.gp\n"
     << "set terminal pngcairo size 1100,650 font 'sans,11'\nset grid\nset key top right\n"
     << "set xlabel 'step'\n";
  gp << "set output 'loss.png'\n"
     << plot_command({"loss (train) and validation loss", "loss", present({"loss", "val_loss"})});
  gp << "set output 'throughput.png'\n"
     << plot_command({"training throughput", "tokens/s", present({"tokens_per_s"})});
  gp << "set output 'memory.png'\n"
     << plot_command({"memory", "MiB",
                      present({"peak_memory_bytes", "host_peak_rss_bytes", "device_peak_bytes"})});
  gp << "set output 'health.png'\nset multiplot layout 2,2 title 'health'\n"
     << plot_command({"gradient norm", "norm", present({"grad_norm"})})
     << plot_command(
            {"cast underflow / overflow (fraction of values)", "fraction", rates, positive_rates})
     << plot_command(
            {"offload link utilisation", "of the measured peak", present({"link/utilisation"})});
  std::vector<std::string> gpu = with_prefix("gpu", "sm_clock_mhz");
  for (const std::string& t : with_prefix("gpu", "temperature_c")) gpu.push_back(t);
  gp << plot_command({"GPU SM clock (MHz) and temperature (C)", "MHz, C", gpu})
     << "unset multiplot\n";
  std::ofstream script(fs::path(out_dir) / "plots.gp");
  script << gp.str();
  if (!script) fail("plot: cannot write '", (fs::path(out_dir) / "plots.gp").string(), "'");
  return {"loss.png", "throughput.png", "memory.png", "health.png"};
}

}  // namespace frugal
