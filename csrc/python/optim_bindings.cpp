// pybind11 bindings of the optimizer area: the hyperparameter validators the Python optimizers
// share with the C++ ones. (The ops' argument validators are reached through the dispatcher: see
// _validate_only in torchspeed/optim/_fused.py.)
#include "python/bindings.h"
#include "torchspeed/optim/hyperparams.h"

namespace torchspeed::python {

void bind_optim(pybind11::module_& m) {
  namespace py = pybind11;
  auto optim = m.def_submodule("optim", "torchspeed optimizer internals");
  optim.def("check_hyperparameter", &torchspeed::optim::check_hyperparameter, py::arg("optimizer"),
            py::arg("name"), py::arg("value"),
            "Raises ValueError when `value` is out of range for hyperparameter `name` (the same "
            "check the C++ optimizers run).");
  optim.def("check_nesterov", &torchspeed::optim::check_nesterov, py::arg("optimizer"),
            py::arg("nesterov"), py::arg("momentum"), py::arg("dampening"));
}

}  // namespace torchspeed::python
