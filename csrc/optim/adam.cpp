// torchspeed::optim::Adam and AdamW (torchspeed/optim/adam.h): the step builder of adam_step_
// (float32 moments) and adam_lowbit_step_ (state_dtype "bf16" / "int8").
#include <array>
#include <utility>

#include "optim/fused_step_builder.h"

namespace torchspeed::optim {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the step builder's vocabulary

bool decoupled(const AdamOptions& o) { return o.decoupled_weight_decay(); }
bool decoupled(const AdamWOptions&) { return true; }

// The lists of one op call: the common ones and the moments of one format.
struct FormatLists {
  BucketLists lists;
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs, max_sqs, exp_avg_absmaxes, exp_avg_sq_absmaxes;
};

template <typename Options>
at::Tensor adam_family_step(Optimizer& self, const char* name,
                            const Optimizer::LossClosure& closure, const GradScaling& scaling) {
  return run_fused_step<Options>(
      self, name, closure, scaling,
      [&](const Options& o, const std::vector<at::Tensor>& bucket, const GroupScalars& scalars,
          Staged& staged, std::vector<Call>& calls) {
        const bool amsgrad = o.amsgrad();
        const bool ema = scalars.ema_decay.has_value();
        std::array<FormatLists, 3> by_format;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          // A param keeps the format of its stored moments (load converts them to the group's, as
          // Python's optimizer does); new moments get the group's format.
          const auto format_of = [&](const AdamParamState& s) {
            const MomentFormat stored = stored_format(s);
            return stored == MomentFormat::kNone ? moment_format(o, p) : stored;
          };
          auto& s = state_of<AdamParamState>(
              self, staged, p, master, ema,
              [&](const AdamParamState& s) {
                const MomentFormat format = stored_format(s);
                return s.step().defined() && s.exp_avg().defined() && s.exp_avg_sq().defined() &&
                       (!amsgrad || format != MomentFormat::kFp32 ||
                        s.max_exp_avg_sq().defined()) &&
                       (format != MomentFormat::kInt8 ||
                        (s.exp_avg_absmax().defined() && s.exp_avg_sq_absmax().defined()));
              },
              [&](AdamParamState& s) {
                if (!s.step().defined()) s.step(zero_step(p));
                const MomentFormat format = format_of(s);
                if (format == MomentFormat::kFp32) {
                  if (!s.exp_avg().defined()) s.exp_avg(zeros_like_param(p));
                  if (!s.exp_avg_sq().defined()) s.exp_avg_sq(zeros_like_param(p));
                  if (amsgrad && !s.max_exp_avg_sq().defined()) {
                    s.max_exp_avg_sq(zeros_like_param(p));
                  }
                } else if (!s.exp_avg().defined() || !s.exp_avg_sq().defined() ||
                           (format == MomentFormat::kInt8 &&
                            (!s.exp_avg_absmax().defined() || !s.exp_avg_sq_absmax().defined()))) {
                  set_moments(s, p, format, o.state_block());
                }
              });
          const MomentFormat format = stored_format(s);
          // fp32 moments go to adam_step_, bf16 and int8 ones to adam_lowbit_step_.
          FormatLists& l = by_format[static_cast<size_t>(format)];
          l.lists.add(p, s, master, ema);
          l.exp_avgs.push_back(s.exp_avg());
          l.exp_avg_sqs.push_back(s.exp_avg_sq());
          if (amsgrad && format == MomentFormat::kFp32) l.max_sqs.push_back(s.max_exp_avg_sq());
          if (format == MomentFormat::kInt8) {
            l.exp_avg_absmaxes.push_back(s.exp_avg_absmax());
            l.exp_avg_sq_absmaxes.push_back(s.exp_avg_sq_absmax());
          }
        }
        for (size_t k = 0; k < by_format.size(); ++k) {
          FormatLists& lists = by_format[k];
          if (lists.lists.params.empty()) continue;
          // The lists move into the call (a copy would cost a refcount pair per tensor).
          if (k == static_cast<size_t>(MomentFormat::kFp32)) {
            calls.push_back([=, l = std::move(lists)](bool validate_only) {
              AdamStepArgs a;
              set_common(a, l.lists, scalars);
              a.exp_avgs = l.exp_avgs;
              a.exp_avg_sqs = l.exp_avg_sqs;
              a.max_exp_avg_sqs = l.max_sqs;
              a.lr = o.lr();
              std::tie(a.beta1, a.beta2) = o.betas();
              a.eps = o.eps();
              a.weight_decay = o.weight_decay();
              a.amsgrad = amsgrad;
              a.maximize = o.maximize();
              a.decoupled_weight_decay = decoupled(o);
              run_or_validate(a, validate_only);
            });
          } else {
            calls.push_back([=, l = std::move(lists)](bool validate_only) {
              AdamLowbitStepArgs a;
              set_common(a, l.lists, scalars);
              a.exp_avgs = l.exp_avgs;
              a.exp_avg_sqs = l.exp_avg_sqs;
              a.exp_avg_absmaxes = l.exp_avg_absmaxes;
              a.exp_avg_sq_absmaxes = l.exp_avg_sq_absmaxes;
              a.state_block = o.state_block();
              a.lr = o.lr();
              std::tie(a.beta1, a.beta2) = o.betas();
              a.eps = o.eps();
              a.weight_decay = o.weight_decay();
              a.maximize = o.maximize();
              a.decoupled_weight_decay = decoupled(o);
              run_or_validate(a, validate_only);
            });
          }
        }
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
