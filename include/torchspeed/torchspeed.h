// Umbrella header for LibTorch apps: `#include <torchspeed/torchspeed.h>` and link
// torchspeed::torchspeed (find_package(torchspeed)).
//
//   #include <torchspeed/torchspeed.h>
//   auto stats = torchspeed::grad_stats(model->parameters());
//
// The larger parts have their own headers (each includes this one):
//   <torchspeed/optim.h>        torchspeed::optim::Adam, AdamW, SGD, Lion, LAMB
//   <torchspeed/data/loader.h>  torchspeed::data::Loader (when built with TORCHSPEED_WITH_DATA)
#pragma once

#include <cstdint>
#include <string>

#include "torchspeed/export.h"
#include "torchspeed/ops.h"

namespace torchspeed {

/// The library version, e.g. "0.1.0".
TORCHSPEED_API const char* version();

/// The CPU instruction set the kernels would use now ("scalar", "avx2", "avx512"), honouring
/// TORCHSPEED_CPU_ISA.
TORCHSPEED_API std::string cpu_isa();

/// The best ISA this CPU supports, and the ISAs this build has kernels for (comma-separated).
TORCHSPEED_API std::string cpu_isa_detected();
TORCHSPEED_API std::string cpu_isas_compiled();

namespace detail {
/// Referenced below so that linking torchspeed::torchspeed always loads the library and runs its
/// static op registrations, even under --as-needed.
TORCHSPEED_API int link_anchor();
[[maybe_unused]] static const int kLinkAnchor = link_anchor();
}  // namespace detail

}  // namespace torchspeed
