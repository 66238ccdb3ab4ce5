// The one main() of frugal's Catch2 programs: it starts MPI (single rank unless mpiexec
// says otherwise) so that every test binary can use frugal's communicators.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include "catch_compat.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  // Every rank must agree on the outcome, so that mpiexec reports a failure of any rank.
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
