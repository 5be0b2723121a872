// torchspeed::optim::LAMB (torchspeed/optim/lamb.h): the step builder of lamb_step_.
#include "optim/fused_step_builder.h"

namespace torchspeed::optim {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the step builder's vocabulary

at::Tensor lamb_step(Optimizer& self, const Optimizer::LossClosure& closure,
                     const GradScaling& scaling) {
  return run_fused_step<LAMBOptions>(
      self, "LAMB", closure, scaling,
      [&](const LAMBOptions& o, const std::vector<at::Tensor>& bucket, const GroupScalars& scalars,
          Staged& staged, std::vector<Call>& calls) {
        BucketLists lists;
        std::vector<at::Tensor> exp_avgs, exp_avg_sqs;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<LAMBParamState>(
              self, staged, p, master, scalars.ema_decay.has_value(),
              [](const LAMBParamState& s) {
                return s.step().defined() && s.exp_avg().defined() && s.exp_avg_sq().defined();
              },
              [&](LAMBParamState& s) {
                if (!s.step().defined()) s.step(zero_step(p));
                if (!s.exp_avg().defined()) s.exp_avg(zeros_like_param(p));
                if (!s.exp_avg_sq().defined()) s.exp_avg_sq(zeros_like_param(p));
              });
          lists.add(p, s, master, scalars.ema_decay.has_value());
          exp_avgs.push_back(s.exp_avg());
          exp_avg_sqs.push_back(s.exp_avg_sq());
        }
        calls.push_back([=](bool validate_only) {
          LambStepArgs a;
          set_common(a, lists, scalars);
          a.exp_avgs = exp_avgs;
          a.exp_avg_sqs = exp_avg_sqs;
          a.lr = o.lr();
          std::tie(a.beta1, a.beta2) = o.betas();
          a.eps = o.eps();
          a.weight_decay = o.weight_decay();
          a.maximize = o.maximize();
          run_or_validate(a, validate_only);
        });
      });
}

}  // namespace

TORCHSPEED_DEFINE_OPTIMIZER(LAMB, LAMBParamState, LAMBOptions)

torch::Tensor LAMB::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return lamb_step(*this, closure, scaling);
}

}  // namespace torchspeed::optim
