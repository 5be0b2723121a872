// torchspeed::optim::SGD (torchspeed/optim/sgd.h): the step builder of sgd_step_ (fresh and old
// momentum buffers in separate calls).
#include "optim/fused_step_builder.h"

namespace torchspeed::optim {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the step builder's vocabulary

bool has_buffer(const Optimizer& self, const at::Tensor& p) {
  auto it = self.state().find(p.unsafeGetTensorImpl());
  return it != self.state().end() &&
         static_cast<const SGDParamState&>(*it->second).momentum_buffer().defined();
}

at::Tensor sgd_step(Optimizer& self, const Optimizer::LossClosure& closure,
                    const GradScaling& scaling) {
  return run_fused_step<SGDOptions>(
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
          BucketLists lists;
          std::vector<at::Tensor> buffers;
          for (const auto& p : bucket) {
            const bool master = wants_master(o.master_weights(), p);
            auto& s = state_of<SGDParamState>(
                self, staged, p, master, scalars.ema_decay.has_value(),
                [&](const SGDParamState& s) {
                  return !with_momentum || s.momentum_buffer().defined();
                },
                [&](SGDParamState& s) {
                  if (with_momentum && !s.momentum_buffer().defined()) {
                    s.momentum_buffer(zeros_like_param(p));
                  }
                });
            lists.add(p, s, master, scalars.ema_decay.has_value());
            if (with_momentum) buffers.push_back(s.momentum_buffer());
          }
          const bool nesterov = o.nesterov() && with_momentum;
          calls.push_back([=](bool validate_only) {
            SgdStepArgs a;
            set_common(a, lists, scalars);
            a.momentum_buffers = buffers;
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
      });
}

}  // namespace

TORCHSPEED_DEFINE_OPTIMIZER(SGD, SGDParamState, SGDOptions)

torch::Tensor SGD::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return sgd_step(*this, closure, scaling);
}

}  // namespace torchspeed::optim
