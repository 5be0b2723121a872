// The torchspeed._C pybind11 module: library info and the classes of each area. Tensor ops are
// not bound here; they are torch.ops.torchspeed.* (registered when libtorchspeed loads).
#include <torch/extension.h>

#include "python/bindings.h"
#include "torchspeed/torchspeed.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchspeed native module";
  m.def("version", &torchspeed::version);
  m.def("cpu_isa", &torchspeed::cpu_isa,
        "The CPU ISA the kernels use now (honours TORCHSPEED_CPU_ISA).");
  m.def("cpu_isa_detected", &torchspeed::cpu_isa_detected, "The best ISA this CPU supports.");
  m.def("cpu_isas_compiled", &torchspeed::cpu_isas_compiled,
        "Comma-separated ISAs this build has kernels for.");
#if defined(TORCHSPEED_WITH_CUDA)
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  torchspeed::python::bind_profile(m);
  torchspeed::python::bind_optim(m);
#if defined(TORCHSPEED_AREA_DATA)
  torchspeed::python::bind_data(m);
#endif
#if defined(TORCHSPEED_AREA_DIST)
  torchspeed::python::bind_dist(m);
#endif
#if defined(TORCHSPEED_AREA_QUANT)
  torchspeed::python::bind_quant(m);
#endif
}
