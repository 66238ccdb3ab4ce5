// The one main() of frugal's Catch2 programs: it starts MPI (single rank unless mpiexec
// says otherwise) so that every test binary can use frugal's communicators.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include "catch_compat.h"

// Built with AddressSanitizer (FRUGAL_SANITIZE): GCC says so with __SANITIZE_ADDRESS__, clang
// with __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define FRUGAL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FRUGAL_ASAN 1
#endif
#endif
#if defined(FRUGAL_ASAN)
#include <sanitizer/lsan_interface.h>
#endif

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
#if defined(FRUGAL_ASAN)
  // The leak check runs here, before MPI_Finalize, instead of at exit: Open MPI unloads its
  // components in MPI_Finalize, after which LeakSanitizer can no longer name their frames, and
  // tests/sanitize/lsan.supp could not tell Open MPI's leaks from frugal's. Every test has run.
  __lsan_do_leak_check();
#endif
  MPI_Finalize();
  return worst;
}
