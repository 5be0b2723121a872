// Declarations of each area's pybind11 bindings, called from module.cpp.
#pragma once

#include <torch/extension.h>

namespace torchspeed::python {

void bind_optim(pybind11::module_& m);
void bind_data(pybind11::module_& m);
void bind_profile(pybind11::module_& m);
void bind_dist(pybind11::module_& m);
void bind_quant(pybind11::module_& m);

}  // namespace torchspeed::python
