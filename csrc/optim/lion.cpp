// torchspeed::optim::Lion (torchspeed/optim/lion.h): the step builder of lion_step_ (float32
// moment) and lion_lowbit_step_ (state_dtype "bf16" / "int8").
#include <array>
#include <utility>

#include "optim/fused_step_builder.h"

namespace torchspeed::optim {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the step builder's vocabulary

// The lists of one op call: the common ones and the moment of one format.
struct FormatLists {
  BucketLists lists;
  std::vector<at::Tensor> exp_avgs, exp_avg_absmaxes;
};

at::Tensor lion_step(Optimizer& self, const Optimizer::LossClosure& closure,
                     const GradScaling& scaling) {
  return run_fused_step<LionOptions>(
      self, "Lion", closure, scaling,
      [&](const LionOptions& o, const std::vector<at::Tensor>& bucket, const GroupScalars& scalars,
          Staged& staged, std::vector<Call>& calls) {
        const bool ema = scalars.ema_decay.has_value();
        std::array<FormatLists, 3> by_format;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          // A param keeps the format of its stored moment (load converts it to the group's, as
          // Python's optimizer does); a new moment gets the group's format.
          auto& s = state_of<LionParamState>(
              self, staged, p, master, ema,
              [](const LionParamState& s) {
                return s.step().defined() && s.exp_avg().defined() &&
                       (stored_format(s) != MomentFormat::kInt8 || s.exp_avg_absmax().defined());
              },
              [&](LionParamState& s) {
                if (!s.step().defined()) s.step(zero_step(p));
                const MomentFormat stored = stored_format(s);
                const MomentFormat format =
                    stored == MomentFormat::kNone ? moment_format(o, p) : stored;
                if (!s.exp_avg().defined() ||
                    (format == MomentFormat::kInt8 && !s.exp_avg_absmax().defined())) {
                  set_moments(s, p, format, o.state_block());
                }
              });
          const MomentFormat format = stored_format(s);
          // fp32 moments go to lion_step_, bf16 and int8 ones to lion_lowbit_step_.
          FormatLists& l = by_format[static_cast<size_t>(format)];
          l.lists.add(p, s, master, ema);
          l.exp_avgs.push_back(s.exp_avg());
          if (format == MomentFormat::kInt8) l.exp_avg_absmaxes.push_back(s.exp_avg_absmax());
        }
        for (size_t k = 0; k < by_format.size(); ++k) {
          FormatLists& lists = by_format[k];
          if (lists.lists.params.empty()) continue;
          // The lists move into the call (a copy would cost a refcount pair per tensor).
          if (k == static_cast<size_t>(MomentFormat::kFp32)) {
            calls.push_back([=, l = std::move(lists)](bool validate_only) {
              LionStepArgs a;
              set_common(a, l.lists, scalars);
              a.exp_avgs = l.exp_avgs;
              a.lr = o.lr();
              std::tie(a.beta1, a.beta2) = o.betas();
              a.weight_decay = o.weight_decay();
              a.maximize = o.maximize();
              run_or_validate(a, validate_only);
            });
          } else {
            calls.push_back([=, l = std::move(lists)](bool validate_only) {
              LionLowbitStepArgs a;
              set_common(a, l.lists, scalars);
              a.exp_avgs = l.exp_avgs;
              a.exp_avg_absmaxes = l.exp_avg_absmaxes;
              a.state_block = o.state_block();
              a.lr = o.lr();
              std::tie(a.beta1, a.beta2) = o.betas();
              a.weight_decay = o.weight_decay();
              a.maximize = o.maximize();
              run_or_validate(a, validate_only);
            });
          }
        }
      });
}

}  // namespace

TORCHSPEED_DEFINE_OPTIMIZER(Lion, LionParamState, LionOptions)

torch::Tensor Lion::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return lion_step(*this, closure, scaling);
}

}  // namespace torchspeed::optim
