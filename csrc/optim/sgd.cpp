// torchspeed::optim::SGD (torchspeed/optim/sgd.h): the step builder of sgd_step_ (float32 momentum
// buffers, or none) and sgd_lowbit_step_ (state_dtype "bf16" / "int8"; fresh and old buffers in
// separate calls).
#include <array>
#include <utility>
#include <vector>

#include "optim/fused_step_builder.h"

namespace torchspeed::optim {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the step builder's vocabulary

// The lists of one op call: the common ones and the buffers of one format.
struct FormatLists {
  BucketLists lists;
  std::vector<at::Tensor> buffers, absmaxes;
};

bool has_buffer(const Optimizer& self, const at::Tensor& p) {
  auto it = self.state().find(p.unsafeGetTensorImpl());
  return it != self.state().end() &&
         static_cast<const SGDParamState&>(*it->second).momentum_buffer().defined();
}

at::Tensor sgd_step(Optimizer& self, const Optimizer::LossClosure& closure,
                    const GradScaling& scaling) {
  // The buckets whose buffers this step creates (first_step): the found_inf their calls read, and
  // their params.
  std::vector<std::pair<at::Tensor, std::vector<at::Tensor>>> fresh;
  at::Tensor loss = run_fused_step<SGDOptions>(
      self, "SGD", closure, scaling,
      [&](const SGDOptions& o, const std::vector<at::Tensor>& by_master,
          const GroupScalars& scalars, Staged& staged, std::vector<Call>& calls) {
        const bool with_momentum = o.momentum() != 0;
        // Params without a momentum buffer yet start it from their grad (first_step = true).
        std::vector<std::vector<at::Tensor>> buckets;
        if (with_momentum) {
          std::vector<at::Tensor> fresh, old;
          for (const auto& p : by_master) (has_buffer(self, p) ? old : fresh).push_back(p);
          for (auto* b : {&fresh, &old}) {
            if (!b->empty()) buckets.push_back(std::move(*b));
          }
        } else {
          buckets.push_back(by_master);
        }
        for (const auto& bucket : buckets) {
          const bool first_step = with_momentum && !has_buffer(self, bucket[0]);
          if (first_step && scalars.found_inf.has_value()) {
            fresh.emplace_back(*scalars.found_inf, bucket);
          }
          std::array<FormatLists, 3> by_format;
          for (const auto& p : bucket) {
            const bool master = wants_master(o.master_weights(), p);
            // As Python's SGD: a low-bit buffer (kept in its stored format, or new in the group's)
            // comes with a float32 step; without momentum there is no buffer to make.
            auto& s = state_of<SGDParamState>(
                self, staged, p, master, scalars.ema_decay.has_value(),
                [&](const SGDParamState& s) {
                  const MomentFormat format = stored_format(s);
                  return !with_momentum ||
                         (s.momentum_buffer().defined() &&
                          (format == MomentFormat::kFp32 || s.step().defined()) &&
                          (format != MomentFormat::kInt8 || s.momentum_buffer_absmax().defined()));
                },
                [&](SGDParamState& s) {
                  if (!with_momentum) return;
                  const MomentFormat stored = stored_format(s);
                  const MomentFormat format =
                      stored == MomentFormat::kNone ? moment_format(o, p) : stored;
                  if (!s.momentum_buffer().defined() ||
                      (format == MomentFormat::kInt8 && !s.momentum_buffer_absmax().defined())) {
                    set_moments(s, p, format, o.state_block());
                  }
                  if (format != MomentFormat::kFp32 && !s.step().defined()) s.step(zero_step(p));
                });
            // fp32 buffers (and no buffer) go to sgd_step_, bf16 and int8 ones to
            // sgd_lowbit_step_.
            const MomentFormat format = with_momentum ? stored_format(s) : MomentFormat::kFp32;
            FormatLists& l = by_format[static_cast<size_t>(format)];
            l.lists.add(p, s, master, scalars.ema_decay.has_value());
            if (with_momentum) l.buffers.push_back(s.momentum_buffer());
            if (format == MomentFormat::kInt8) l.absmaxes.push_back(s.momentum_buffer_absmax());
          }
          const bool nesterov = o.nesterov() && with_momentum;
          for (size_t k = 0; k < by_format.size(); ++k) {
            FormatLists& lists = by_format[k];
            if (lists.lists.params.empty()) continue;
            if (k == static_cast<size_t>(MomentFormat::kFp32)) {
              calls.push_back([=, l = std::move(lists)](bool validate_only) {
                SgdStepArgs a;
                set_common(a, l.lists, scalars);
                a.momentum_buffers = l.buffers;
                a.lr = o.lr();
                a.momentum = o.momentum();
                a.dampening = o.dampening();
                a.weight_decay = o.weight_decay();
                a.nesterov = nesterov;
                a.maximize = o.maximize();
                a.first_step = first_step;
                run_or_validate(a, validate_only);
              });
            } else {
              calls.push_back([=, l = std::move(lists)](bool validate_only) {
                SgdLowbitStepArgs a;
                set_common(a, l.lists, scalars);
                a.momentum_buffers = l.buffers;
                a.momentum_buffer_absmaxes = l.absmaxes;
                a.state_block = o.state_block();
                a.lr = o.lr();
                a.momentum = o.momentum();
                a.dampening = o.dampening();
                a.weight_decay = o.weight_decay();
                a.nesterov = nesterov;
                a.maximize = o.maximize();
                a.first_step = first_step;
                run_or_validate(a, validate_only);
              });
            }
          }
        }
      });
  // As Python's SGD: a first step that GradScaler skipped leaves its params without a buffer
  // (fp32 or low-bit), so that the buffer starts from the first grad applied, as torch's does.
  // Only the first steps of new params pay this check (a host sync on CUDA).
  for (const auto& [found_inf, params] : fresh) {
    if (found_inf.item<float>() == 0.f) continue;
    for (const auto& p : params) {
      auto it = self.state().find(p.unsafeGetTensorImpl());
      if (it != self.state().end()) {
        static_cast<SGDParamState&>(*it->second).momentum_buffer(at::Tensor());
      }
    }
  }
  return loss;
}

}  // namespace

TORCHSPEED_DEFINE_OPTIMIZER(SGD, SGDParamState, SGDOptions)

torch::Tensor SGD::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return sgd_step(*this, closure, scaling);
}

}  // namespace torchspeed::optim
