// Library-level C++ API: the version, the CPU ISA queries and the link anchor. The ops' entry
// points live next to their schemas (csrc/ops/<area>.cpp).
#include "kernels/cpu/dispatch.h"
#include "ops/checks.h"
#include "torchspeed/torchspeed.h"
#include "torchspeed/version.h"

namespace torchspeed {

const char* version() { return TORCHSPEED_VERSION_STRING; }

std::string cpu_isa() {
  return ops::rethrow_as_torch_error("cpu_isa",
                                     [] { return std::string(kernels::cpu::cpu_kernels().name); });
}

std::string cpu_isa_detected() { return kernels::cpu::isa_name(kernels::cpu::detected_isa()); }

std::string cpu_isas_compiled() {
  std::string out;
  for (auto isa : kernels::cpu::compiled_isas()) {
    if (!out.empty()) out += ",";
    out += kernels::cpu::isa_name(isa);
  }
  return out;
}

namespace detail {
int link_anchor() { return 1; }
}  // namespace detail

}  // namespace torchspeed
