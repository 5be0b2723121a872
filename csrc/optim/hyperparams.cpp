// The optimizer hyperparameter validator shared by the C++ and Python optimizers.
#include "torchspeed/optim/hyperparams.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace torchspeed::optim {
namespace {

bool finite_in_float32(double v) {
  return std::isfinite(v) && std::abs(v) <= static_cast<double>(std::numeric_limits<float>::max());
}

}  // namespace

void check_hyperparameter(const std::string& optimizer, const std::string& name, double value) {
  const size_t dot = name.rfind('.');
  const std::string rule = dot == std::string::npos ? name : name.substr(dot + 1);
  const char* expected = nullptr;
  bool ok = false;
  if (rule == "lr" || rule == "eps" || rule == "weight_decay" || rule == "momentum") {
    ok = finite_in_float32(value) && value >= 0.0;
    expected = "a finite number >= 0";
  } else if (rule == "dampening") {
    ok = finite_in_float32(value);
    expected = "a finite number";
  } else if (rule == "betas[0]" || rule == "betas[1]") {
    ok = value >= 0.0 && value < 1.0;
    expected = "in [0, 1)";
  } else if (rule == "max_grad_norm") {
    ok = value >= 0.0;  // +inf is allowed: it never clips
    expected = ">= 0 (or None to turn clipping off)";
  } else if (rule == "ema_decay") {
    ok = value >= 0.0 && value <= 1.0;
    expected = "in [0, 1]";
  } else {
    TORCH_CHECK(false, "torchspeed.optim.", optimizer, ": unknown hyperparameter '", name, "'");
  }
  TORCH_CHECK_VALUE(ok, "torchspeed.optim.", optimizer, ": ", name, " must be ", expected, ", got ",
                    value);
}

void check_nesterov(const std::string& optimizer, bool nesterov, double momentum,
                    double dampening) {
  TORCH_CHECK_VALUE(!nesterov || (momentum > 0 && dampening == 0), "torchspeed.optim.", optimizer,
                    ": nesterov requires a momentum and zero dampening, got momentum ", momentum,
                    " and dampening ", dampening);
}

}  // namespace torchspeed::optim
