// The subcommands of the frugal executable. Each takes the arguments after its name and
// returns the process exit code; errors are thrown as frugal::Error.
#pragma once

#include <string>
#include <vector>

namespace frugal {

int run_frugal(int argc, char** argv);  // MPI start-up, dispatch, error reporting

int cmd_train(const std::vector<std::string>& args);
int cmd_prepare(const std::vector<std::string>& args);

}  // namespace frugal
