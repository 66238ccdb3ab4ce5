// Durations in messages ("12s", "4m50s", "2h11m") and the steady clock they are measured on.
#pragma once

#include <string>

namespace frugal {

std::string format_duration(double seconds);  // "?" for a negative or non-finite one
double now_seconds();                         // wall-clock seconds since an arbitrary epoch

}  // namespace frugal
