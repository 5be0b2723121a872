// torchspeed::optim::LAMB (torchspeed/optim/lamb.h): the step builder of lamb_step_.
#include <unordered_map>

#include "optim/fused_step_builder.h"
#include "torchspeed/profile/profile.h"

namespace torchspeed::optim {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the step builder's vocabulary

// One half of a sharded step (LAMB::sharded_step_phase1 / 2); null for the whole step.
struct Sharded {
  int64_t phase = 1;
  std::vector<at::Tensor> params;  // phase 1: out, the params stepped; phase 2: in
  std::vector<at::Tensor> norms;   // phase 1: out, one [n, 2] per call; phase 2: the summed rows
};

at::Tensor lamb_step(Optimizer& self, const Optimizer::LossClosure& closure,
                     const GradScaling& scaling, Sharded* sharded = nullptr) {
  // Phase 2: each param's row in the summed norms.
  std::unordered_map<const c10::TensorImpl*, int64_t> rows;
  if (sharded != nullptr && sharded->phase == 2) {
    for (size_t i = 0; i < sharded->params.size(); ++i) {
      rows[sharded->params[i].unsafeGetTensorImpl()] = static_cast<int64_t>(i);
    }
  }
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
        OptTensor norms;
        if (sharded != nullptr && sharded->phase == 1) {
          norms = at::zeros({static_cast<int64_t>(bucket.size()), 2},
                            bucket[0].options().dtype(at::kDouble));
          sharded->params.insert(sharded->params.end(), bucket.begin(), bucket.end());
          sharded->norms.push_back(*norms);
        } else if (sharded != nullptr) {
          std::vector<int64_t> index;
          for (const auto& p : bucket) {
            const auto it = rows.find(p.unsafeGetTensorImpl());
            TORCH_CHECK_VALUE(it != rows.end(),
                              "torchspeed.optim.LAMB.sharded_step_phase2: "
                              "params must be the params phase 1 returned, got one without a row "
                              "of shape ",
                              p.sizes());
            index.push_back(it->second);
          }
          norms = sharded->norms[0]
                      .index_select(0, at::tensor(index, at::kLong).to(sharded->norms[0].device()))
                      .to(bucket[0].device())
                      .contiguous();
        }
        const int64_t phase = sharded == nullptr ? 0 : sharded->phase;
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
          a.norms = norms;
          a.phase = phase;
          run_or_validate(a, validate_only);
        });
      });
}

}  // namespace

TORCHSPEED_DEFINE_OPTIMIZER(LAMB, LAMBParamState, LAMBOptions)

torch::Tensor LAMB::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return lamb_step(*this, closure, scaling);
}

std::pair<std::vector<torch::Tensor>, torch::Tensor> LAMB::sharded_step_phase1(
    const GradScaling& scaling) {
  TORCHSPEED_PHASE("torchspeed.optim.step", ::torchspeed::profile::Phase::Optimizer);
  Sharded s;
  lamb_step(*this, nullptr, scaling, &s);
  at::Tensor norms = s.norms.empty() ? at::zeros({0, 2}, at::kDouble) : at::cat(s.norms);
  return {std::move(s.params), std::move(norms)};
}

void LAMB::sharded_step_phase2(const std::vector<torch::Tensor>& params, const torch::Tensor& norms,
                               const GradScaling& scaling) {
  TORCHSPEED_PHASE("torchspeed.optim.step", ::torchspeed::profile::Phase::Optimizer);
  TORCH_CHECK_VALUE(
      norms.defined() && norms.scalar_type() == at::kDouble && norms.dim() == 2 &&
          norms.size(0) == static_cast<int64_t>(params.size()) && norms.size(1) == 2,
      "torchspeed.optim.LAMB.sharded_step_phase2: norms must be float64 [", params.size(),
      ", 2] (a row per param of phase 1), got ",
      norms.defined() ? c10::str(norms.scalar_type(), " ", norms.sizes()) : std::string("None"));
  Sharded s;
  s.phase = 2;
  s.params = params;
  s.norms = {norms};
  lamb_step(*this, nullptr, scaling, &s);
}

}  // namespace torchspeed::optim
