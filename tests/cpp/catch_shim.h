// One include for Catch2 v2 (Debian 12) and v3 (Debian 13): the build defines TORCHSPEED_CATCH2_V3.
#pragma once

#if defined(TORCHSPEED_CATCH2_V3)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif
