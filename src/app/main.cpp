// frugal's entry point: starts MPI, dispatches the subcommand, turns errors into a message
// and a non-zero exit.
#include <mpi.h>

#include <cstdio>

#include "app/commands.h"

int main(int argc, char** argv) { return frugal::run_frugal(argc, argv); }
