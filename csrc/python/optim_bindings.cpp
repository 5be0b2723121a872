// pybind11 bindings of the optimizer area: step statistics the profiler reads.
#include "python/bindings.h"

namespace torchspeed::python {

void bind_optim(pybind11::module_& m) {
  m.def_submodule("optim", "torchspeed optimizer internals");
}

}  // namespace torchspeed::python
