// torchspeed::optim::Lion (torchspeed/optim/lion.h): the step builder of lion_step_.
#include "optim/fused_step_builder.h"

namespace torchspeed::optim {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the step builder's vocabulary

at::Tensor lion_step(Optimizer& self, const Optimizer::LossClosure& closure,
                     const GradScaling& scaling) {
  return run_fused_step<LionOptions>(
      self, "Lion", closure, scaling,
      [&](const LionOptions& o, const std::vector<at::Tensor>& bucket, const GroupScalars& scalars,
          Staged& staged, std::vector<Call>& calls) {
        BucketLists lists;
        std::vector<at::Tensor> exp_avgs;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<LionParamState>(
              self, staged, p, master, scalars.ema_decay.has_value(),
              [](const LionParamState& s) { return s.step().defined() && s.exp_avg().defined(); },
              [&](LionParamState& s) {
                if (!s.step().defined()) s.step(zero_step(p));
                if (!s.exp_avg().defined()) s.exp_avg(zeros_like_param(p));
              });
          lists.add(p, s, master, scalars.ema_decay.has_value());
          exp_avgs.push_back(s.exp_avg());
        }
        calls.push_back([=](bool validate_only) {
          LionStepArgs a;
          set_common(a, lists, scalars);
          a.exp_avgs = exp_avgs;
          a.lr = o.lr();
          std::tie(a.beta1, a.beta2) = o.betas();
          a.weight_decay = o.weight_decay();
          a.maximize = o.maximize();
          run_or_validate(a, validate_only);
        });
      });
}

}  // namespace

TORCHSPEED_DEFINE_OPTIMIZER(Lion, LionParamState, LionOptions)

torch::Tensor Lion::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return lion_step(*this, closure, scaling);
}

}  // namespace torchspeed::optim
