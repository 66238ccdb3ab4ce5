// Kernel choices read from the environment once at start-up (ops::KernelOptions): what each
// value of FRUGAL_ATTENTION_SM90 means, and that a bad one is named. No GPU needed.
#include "catch_compat.h"
#include "ops/ops.h"
#include "test_support.h"

using namespace frugal;

TEST_CASE("FRUGAL_ATTENTION_SM90 takes 0 or 1 (the default) and names any other value", "[ops]") {
  CHECK(ops::kernel_options_from_environment(nullptr).attention_sm90);
  CHECK(ops::kernel_options_from_environment("1").attention_sm90);
  CHECK_FALSE(ops::kernel_options_from_environment("0").attention_sm90);
  for (const char* bad : {"yes", "", "2", "01", "true"}) {
    INFO(bad);
    CHECK(test::contains(test::error_of([&] { ops::kernel_options_from_environment(bad); }),
                         std::string("FRUGAL_ATTENTION_SM90 is '") + bad + "'"));
  }
}

TEST_CASE("the kernel options are set once and read back", "[ops]") {
  CHECK(ops::kernel_options().attention_sm90);  // the default, before anyone sets them
  ops::set_kernel_options({.attention_sm90 = false});
  CHECK_FALSE(ops::kernel_options().attention_sm90);
  ops::set_kernel_options({});
  CHECK(ops::kernel_options().attention_sm90);
}
