// pybind11 bindings of the quant area: the int8 Linear's CPU path queries (torchspeed._C
// .cpu_int8_path / .cpu_amx_status, read by torchspeed.quant.int8_path and torchspeed.info). The
// area's tensor ops are torch.ops.torchspeed.* and its module is a Python class over them.
#include "python/bindings.h"
#include "torchspeed/quant.h"

namespace torchspeed::python {

void bind_quant(pybind11::module_& m) {
  m.def("cpu_int8_path", &torchspeed::cpu_int8_path,
        "The int8 Linear's CPU kernel path now (honours TORCHSPEED_CPU_ISA).");
  m.def("cpu_amx_status", &torchspeed::cpu_amx_status,
        "Why the amx int8 path cannot run here ('' when it can).");
}

}  // namespace torchspeed::python
