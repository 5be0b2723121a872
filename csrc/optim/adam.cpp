// torchspeed::optim::Adam and AdamW (torchspeed/optim/adam.h): the step builder of adam_step_.
#include "optim/fused_step_builder.h"

namespace torchspeed::optim {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the step builder's vocabulary

bool decoupled(const AdamOptions& o) { return o.decoupled_weight_decay(); }
bool decoupled(const AdamWOptions&) { return true; }

template <typename Options>
at::Tensor adam_family_step(Optimizer& self, const char* name,
                            const Optimizer::LossClosure& closure, const GradScaling& scaling) {
  return run_fused_step<Options>(
      self, name, closure, scaling,
      [&](const Options& o, const std::vector<at::Tensor>& bucket, const GroupScalars& scalars,
          Staged& staged, std::vector<Call>& calls) {
        const bool amsgrad = o.amsgrad();
        BucketLists lists;
        std::vector<at::Tensor> exp_avgs, exp_avg_sqs, max_sqs;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<AdamParamState>(
              self, staged, p, master, scalars.ema_decay.has_value(),
              [&](const AdamParamState& s) {
                return s.step().defined() && s.exp_avg().defined() && s.exp_avg_sq().defined() &&
                       (!amsgrad || s.max_exp_avg_sq().defined());
              },
              [&](AdamParamState& s) {
                if (!s.step().defined()) s.step(zero_step(p));
                if (!s.exp_avg().defined()) s.exp_avg(zeros_like_param(p));
                if (!s.exp_avg_sq().defined()) s.exp_avg_sq(zeros_like_param(p));
                if (amsgrad && !s.max_exp_avg_sq().defined()) {
                  s.max_exp_avg_sq(zeros_like_param(p));
                }
              });
          lists.add(p, s, master, scalars.ema_decay.has_value());
          exp_avgs.push_back(s.exp_avg());
          exp_avg_sqs.push_back(s.exp_avg_sq());
          if (amsgrad) max_sqs.push_back(s.max_exp_avg_sq());
        }
        calls.push_back([=](bool validate_only) {
          AdamStepArgs a;
          set_common(a, lists, scalars);
          a.exp_avgs = exp_avgs;
          a.exp_avg_sqs = exp_avg_sqs;
          a.max_exp_avg_sqs = max_sqs;
          a.lr = o.lr();
          std::tie(a.beta1, a.beta2) = o.betas();
          a.eps = o.eps();
          a.weight_decay = o.weight_decay();
          a.amsgrad = amsgrad;
          a.maximize = o.maximize();
          a.decoupled_weight_decay = decoupled(o);
          run_or_validate(a, validate_only);
        });
      });
}

}  // namespace

TORCHSPEED_DEFINE_OPTIMIZER(Adam, AdamParamState, AdamOptions)
TORCHSPEED_DEFINE_OPTIMIZER(AdamW, AdamWParamState, AdamWOptions)

torch::Tensor Adam::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return adam_family_step<AdamOptions>(*this, "Adam", closure, scaling);
}
torch::Tensor AdamW::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return adam_family_step<AdamWOptions>(*this, "AdamW", closure, scaling);
}

}  // namespace torchspeed::optim
