// Size arithmetic that cannot wrap around: products and sums of counts and byte sizes that come
// from files, configuration or shapes. An overflow is an Error naming what was being computed.
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"

namespace frugal {

// a * b and a + b into *out; false (and *out unspecified) when the exact result does not fit T.
// For callers that build their message only when it is needed.
template <std::integral T>
[[nodiscard]] bool mul_fits(T a, T b, T* out) {
  return !__builtin_mul_overflow(a, b, out);
}
template <std::integral T>
[[nodiscard]] bool add_fits(T a, T b, T* out) {
  return !__builtin_add_overflow(a, b, out);
}

namespace detail {
template <std::integral T>
std::string integer_type_name() {  // "int64", "uint64"
  return (std::numeric_limits<T>::is_signed ? "int" : "uint") + std::to_string(8 * sizeof(T));
}
}  // namespace detail

// The Error of a product or sum that does not fit T: "<what...>: 4611686018427387904 x 4 does
// not fit in uint64 (at most 18446744073709551615)". `what` names the quantity ("token file
// 'x': num_tokens x token_bytes").
template <std::integral T, class... What>
[[noreturn]] void fail_mul_overflow(T a, T b, const What&... what) {
  fail(what..., ": ", +a, " x ", +b, " does not fit in ", detail::integer_type_name<T>(),
       " (at most ", +std::numeric_limits<T>::max(), ")");
}
template <std::integral T, class... What>
[[noreturn]] void fail_add_overflow(T a, T b, const What&... what) {
  fail(what..., ": ", +a, " + ", +b, " does not fit in ", detail::integer_type_name<T>(),
       " (at most ", +std::numeric_limits<T>::max(), ")");
}

// a * b and a + b, or that Error. The parts of `what` are formatted only on overflow, so the
// check costs next to nothing; a caller whose message is costly to build (a shape's text) uses
// mul_fits and fail_mul_overflow instead.
template <std::integral T, class... What>
T checked_mul(T a, T b, const What&... what) {
  T out;
  if (!mul_fits(a, b, &out)) fail_mul_overflow(a, b, what...);
  return out;
}
template <std::integral T, class... What>
T checked_add(T a, T b, const What&... what) {
  T out;
  if (!add_fits(a, b, &out)) fail_add_overflow(a, b, what...);
  return out;
}

}  // namespace frugal
