// pybind11 bindings of the optimizer area: the hyperparameter validator the Python optimizers
// share with the C++ ones, and the fused ops' own argument validators (so a multi-call step can
// check every call before the first one writes anything).
#include <optional>
#include <vector>

#include "ops/optim_checks.h"
#include "python/bindings.h"
#include "torchspeed/optim/hyperparams.h"

namespace torchspeed::python {
namespace {

using Tensors = std::vector<at::Tensor>;
using OptTensor = std::optional<at::Tensor>;

}  // namespace

void bind_optim(pybind11::module_& m) {
  namespace py = pybind11;
  auto optim = m.def_submodule("optim", "torchspeed optimizer internals");
  optim.def("check_hyperparameter", &torchspeed::optim::check_hyperparameter, py::arg("optimizer"),
            py::arg("name"), py::arg("value"),
            "Raises ValueError when `value` is out of range for hyperparameter `name` (the same "
            "check the C++ optimizers run).");
  optim.def("check_nesterov", &torchspeed::optim::check_nesterov, py::arg("optimizer"),
            py::arg("nesterov"), py::arg("momentum"), py::arg("dampening"));
  // The validators the CPU, CUDA and Meta kernels run first, with the ops' argument order.
  optim.def("validate_adam_step",
            [](const Tensors& params, const Tensors& grads, const Tensors& exp_avgs,
               const Tensors& exp_avg_sqs, const Tensors& max_exp_avg_sqs, const Tensors& masters,
               const Tensors& steps, const Tensors& masks, const Tensors& emas, bool amsgrad,
               const OptTensor& lr_tensor, const OptTensor& grad_scale, const OptTensor& found_inf,
               const OptTensor& clip_coef) {
              ops::validate_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                      masters, steps, masks, emas, amsgrad, lr_tensor, grad_scale,
                                      found_inf, clip_coef);
            });
  optim.def(
      "validate_sgd_step",
      [](const Tensors& params, const Tensors& grads, const Tensors& momentum_buffers,
         const Tensors& masters, const Tensors& masks, const Tensors& emas, double momentum,
         double dampening, bool nesterov, const OptTensor& lr_tensor, const OptTensor& grad_scale,
         const OptTensor& found_inf, const OptTensor& clip_coef) {
        ops::validate_sgd_step(params, grads, momentum_buffers, masters, masks, emas, momentum,
                               dampening, nesterov, lr_tensor, grad_scale, found_inf, clip_coef);
      });
  optim.def("validate_lion_step",
            [](const Tensors& params, const Tensors& grads, const Tensors& exp_avgs,
               const Tensors& masters, const Tensors& steps, const Tensors& masks,
               const Tensors& emas, const OptTensor& lr_tensor, const OptTensor& grad_scale,
               const OptTensor& found_inf, const OptTensor& clip_coef) {
              ops::validate_lion_step(params, grads, exp_avgs, masters, steps, masks, emas,
                                      lr_tensor, grad_scale, found_inf, clip_coef);
            });
  optim.def(
      "validate_lamb_step",
      [](const Tensors& params, const Tensors& grads, const Tensors& exp_avgs,
         const Tensors& exp_avg_sqs, const Tensors& masters, const Tensors& steps,
         const Tensors& masks, const Tensors& emas, const OptTensor& lr_tensor,
         const OptTensor& grad_scale, const OptTensor& found_inf, const OptTensor& clip_coef) {
        ops::validate_lamb_step(params, grads, exp_avgs, exp_avg_sqs, masters, steps, masks, emas,
                                lr_tensor, grad_scale, found_inf, clip_coef);
      });
}

}  // namespace torchspeed::python
