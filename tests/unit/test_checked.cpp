// Checked size arithmetic (core/checked.h) and the sizes built on it: a shape's element count
// and byte size, which every reader of shapes from files uses; integers read from JSON.
#include <cstdint>
#include <limits>

#include "catch_compat.h"
#include "core/checked.h"
#include "core/json_integer.h"
#include "core/tensor.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;

TEST_CASE("checked_mul and checked_add: exact results, and an Error naming the overflow") {
  const int64_t max64 = std::numeric_limits<int64_t>::max();
  CHECK(checked_mul<int64_t>(3037000499, 3037000499, "x") == 9223372030926249001);
  CHECK(checked_add<int64_t>(max64 - 1, 1, "x") == max64);
  CHECK(checked_mul<uint64_t>(uint64_t(1) << 32, (uint64_t(1) << 32) - 1, "x") ==
        0xffffffff00000000ull);
  CHECK(error_of([&] { checked_mul<int64_t>(3037000500, 3037000500, "the rows of ", "w"); }) ==
        "the rows of w: 3037000500 x 3037000500 does not fit in int64 (at most "
        "9223372036854775807)");
  CHECK(error_of([&] { checked_add<int64_t>(max64, 1, "n"); }) ==
        "n: 9223372036854775807 + 1 does not fit in int64 (at most 9223372036854775807)");
  CHECK(error_of([&] { checked_mul<uint64_t>(uint64_t(1) << 63, 2, "b"); }) ==
        "b: 9223372036854775808 x 2 does not fit in uint64 (at most 18446744073709551615)");
  CHECK(contains(error_of([&] { checked_mul<int32_t>(65536, 32768, "i"); }), "int32"));
  // Signed products that overflow below the minimum are caught too.
  CHECK(
      !error_of([&] { checked_mul<int64_t>(-(int64_t(1) << 32), int64_t(1) << 32, "s"); }).empty());
}

TEST_CASE("shape sizes: element counts and bytes past 64 bits are Errors naming the shape") {
  CHECK(shape_numel({}) == 1);
  CHECK(shape_numel({7, 0, 5}) == 0);
  CHECK(shape_numel({3037000499, 3037000499}) == 9223372030926249001);
  CHECK(shape_bytes({1000, 3}, DType::bf16) == 6000);
  CHECK(error_of([] {
          shape_numel({int64_t(1) << 32, int64_t(1) << 32});
        }) ==
        "tensor shape [4294967296, 4294967296]: 4294967296 x 4294967296 does not fit in int64 "
        "(at most 9223372036854775807)");
  // 2^62 f32 elements are 2^64 bytes: wrapped around, that would allocate 0 bytes.
  const std::string err = error_of([] { Tensor::empty({int64_t(1) << 60, 4}, DType::f32); });
  CHECK(contains(err, "tensor shape [1152921504606846976, 4] of f32"));
  CHECK(contains(err, "4611686018427387904 x 4 does not fit in uint64"));
  CHECK(contains(error_of([] { Tensor::empty({3, -2}); }), "negative dimension"));
}

TEST_CASE("json_integer: integers in range only, never a cast of a float or a wrap") {
  using nlohmann::json;
  CHECK(json_integer(json::parse("42"), "x") == 42);
  CHECK(json_integer(json::parse("-7"), "x") == -7);
  CHECK(json_integer(json::parse("9223372036854775807"), "x") == INT64_MAX);
  // Out of int64 (stored unsigned by nlohmann), fractional, far beyond any integer type (a cast
  // there is undefined behaviour: the fuzzed manifest's 3.3e93), not a number, below lo.
  CHECK(contains(error_of([] { json_integer(json::parse("9223372036854775808"), "x"); }),
                 "x is 9223372036854775808, outside"));
  CHECK(contains(error_of([] { json_integer(json::parse("3.5"), "sampler state 'epoch'"); }),
                 "sampler state 'epoch' is 3.5, not an integer"));
  CHECK(contains(error_of([] { json_integer(json::parse("3.3e93"), "x"); }), "not an integer"));
  CHECK(contains(error_of([] { json_integer(json::parse("\"4\""), "x"); }), "not an integer"));
  CHECK(contains(error_of([] { json_integer(json::parse("-1"), "position", 0); }),
                 "position is -1, outside [0, "));
  CHECK(contains(error_of([] { json_integer(json::parse("5"), "w", 1, 4); }),
                 "w is 5, outside [1, 4]"));
  CHECK(json_integer(json::parse("4"), "w", 1, 4) == 4);
  CHECK(contains(error_of([] { json_integer(json::parse("3"), "n", -9, -1); }),
                 "n is 3, outside [-9, -1]"));
  CHECK(json_integer(json::parse("-3"), "n", -9, -1) == -3);
}
