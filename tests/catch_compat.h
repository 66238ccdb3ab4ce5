// Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04) behind one include.
#pragma once
#if defined(FRUGAL_CATCH2_V3)
#include <catch2/catch_all.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif
