// `frugal plot`'s data: the series of a run's metrics.jsonl as gnuplot data files, and the
// gnuplot script that draws them (loss and validation loss, tokens/s, memory, and health: grad
// norm, cast underflow and overflow rates, link utilisation, GPU clocks and temperatures).
#pragma once

#include <string>
#include <vector>

namespace frugal {

// Reads `metrics_path` and writes into `out_dir` one data file per series and plots.gp, which
// writes loss.png, throughput.png, memory.png and health.png there. Returns the PNG names. An
// Error names the file when it cannot be read or holds no training step.
std::vector<std::string> write_plot_script(const std::string& metrics_path,
                                           const std::string& out_dir);

}  // namespace frugal
