// pybind11 bindings of the optimizer area: the hyperparameter validators the Python optimizers
// share with the C++ ones. (The ops' argument validators are reached through the dispatcher: see
// _validate_only in torchspeed/optim/_fused.py.)
#include "python/bindings.h"
#include "torchspeed/optim/hyperparams.h"
#include "torchspeed/optim/lr_scheduler.h"

namespace torchspeed::python {

void bind_optim(pybind11::module_& m) {
  namespace py = pybind11;
  auto optim = m.def_submodule("optim", "torchspeed optimizer internals");
  optim.def("check_hyperparameter", &torchspeed::optim::check_hyperparameter, py::arg("optimizer"),
            py::arg("name"), py::arg("value"),
            "Raises ValueError when `value` is out of range for hyperparameter `name` (the same "
            "check the C++ optimizers run).");
  using torchspeed::optim::WarmupLROptions;
  auto options = [](int64_t warmup_steps, int64_t total_steps, const std::string& warmup,
                    const std::string& decay, double start_factor, double eta_min) {
    WarmupLROptions o(warmup_steps, total_steps);
    o.warmup(warmup).decay(decay).start_factor(start_factor).eta_min(eta_min);
    torchspeed::optim::validate(o);
    return o;
  };
  // One schedule, shared with the C++ WarmupLR: the validator, and the value at step t, a Python
  // int (host float) or a one-element tensor (device tensor, tensor ops only).
  optim.def(
      "warmup_lr",
      [options](const py::object& t, double base_lr, int64_t warmup_steps, int64_t total_steps,
                const std::string& warmup, const std::string& decay, double start_factor,
                double eta_min) -> py::object {
        const WarmupLROptions o =
            options(warmup_steps, total_steps, warmup, decay, start_factor, eta_min);
        if (THPVariable_Check(t.ptr())) {
          return py::cast(torchspeed::optim::warmup_lr(t.cast<at::Tensor>(), base_lr, o));
        }
        return py::cast(torchspeed::optim::warmup_lr(t.cast<int64_t>(), base_lr, o));
      },
      py::arg("t"), py::arg("base_lr"), py::arg("warmup_steps"), py::arg("total_steps"),
      py::arg("warmup"), py::arg("decay"), py::arg("start_factor"), py::arg("eta_min"));
  optim.def("scaled_lr", &torchspeed::optim::scaled_lr, py::arg("reference_lr"),
            py::arg("reference_batch_size"), py::arg("batch_size"), py::arg("rule") = "linear");
  optim.def("check_nesterov", &torchspeed::optim::check_nesterov, py::arg("optimizer"),
            py::arg("nesterov"), py::arg("momentum"), py::arg("dampening"));
}

}  // namespace torchspeed::python
