// The step builder shared by the C++ fused optimizers (internal): construction and group checks,
// staging of new state, the per-group scalars, the lists every op call takes, the run-everything-
// or-nothing step (run_fused_step), the checked load, and TORCHSPEED_DEFINE_OPTIMIZER, which
// writes each optimizer's constructor, add_param_group, save and load. Each algorithm
// (adam.cpp, sgd.cpp, lion.cpp, lamb.cpp) adds only its own state lists and op arguments.
#pragma once

#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/optim_checks.h"
#include "optim/options_io.h"
#include "torchspeed/ops.h"

namespace torchspeed::optim::detail {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;
using OptTensor = std::optional<at::Tensor>;

// Every param the optimizer holds must be a dense float32/bfloat16/float16 tensor; checked at
// construction so a bad model fails early with the param's position.
void check_params(const char* name, const Optimizer& self);

// Validates every param that has a grad before anything (state included) is created or changed,
// so a bad step throws and leaves the optimizer and the model as they were.
void check_step_inputs(const char* name, const Optimizer& self);

// torch.nn.utils.clip_grad_norm_(group's params, max_grad_norm)'s coefficient, computed on the
// device by grad_stats over the group's own grads (divided by the AMP scale: the norm of the
// unscaled grads); the kernels multiply the grads by it.
OptTensor clip_coef(const std::optional<double>& max_grad_norm,
                    const torch::optim::OptimizerParamGroup& group, const at::Tensor& grad_scale);

// Splits the params with a grad into (wants a master) / (does not) buckets, non-empty only.
std::vector<std::vector<at::Tensor>> master_buckets(const std::vector<at::Tensor>& params,
                                                    const std::optional<bool>& master_weights);

// `t` as a one-element float32 tensor on `device`, or nullopt when undefined.
OptTensor as_scalar(const at::Tensor& t, const at::Device& device);

template <typename Options>
void restore_group_options(const char* name, Optimizer& self,
                           const std::vector<torch::optim::OptimizerParamGroup>& groups,
                           const Options& defaults) {
  TORCH_INTERNAL_ASSERT(self.param_groups().size() == groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    if (!groups[i].has_options()) continue;
    const auto* user = dynamic_cast<const Options*>(&groups[i].options());
    TORCH_CHECK(user != nullptr, "torchspeed.optim.", name, ": param_groups[", i,
                "] must carry torchspeed::optim::", name, "Options, got another options type");
    self.param_groups()[i].set_options(std::make_unique<Options>(merge_options(*user, defaults)));
  }
}

// Optimizer::add_param_group, then the group's own options restored as in the constructor.
template <typename Options>
void add_group(const char* name, Optimizer& self, const torch::optim::OptimizerParamGroup& group) {
  if (group.has_options()) {
    TORCH_CHECK(dynamic_cast<const Options*>(&group.options()) != nullptr, "torchspeed.optim.",
                name, ": the param group must carry torchspeed::optim::", name,
                "Options, got another options type");
  }
  const auto& defaults = static_cast<const Options&>(self.defaults());
  const Options merged = group.has_options()
                             ? merge_options(static_cast<const Options&>(group.options()), defaults)
                             : defaults;
  check_all_options(name, group_prefix(self.param_groups().size()), merged);
  for (size_t i = 0; i < group.params().size(); ++i) {
    const at::Tensor& p = group.params()[i];
    TORCH_CHECK(p.defined() && p.layout() == at::kStrided && is_supported_dtype(p.scalar_type()),
                "torchspeed.optim.", name, ": param_groups[", self.param_groups().size(),
                "].params[", i, "] must be a dense float32, bfloat16 or float16 tensor, got ",
                p.defined() ? c10::str(p.scalar_type(), " ", p.layout()) : std::string("None"));
  }
  self.Optimizer::add_param_group(group);
  if (group.has_options())
    self.param_groups().back().set_options(std::make_unique<Options>(merged));
}

// New or completed per-param state of one step, committed to self.state() only once every op
// call of the step has been validated: a step that throws leaves the state as it was.
using Staged = ska::flat_hash_map<void*, std::unique_ptr<OptimizerParamState>>;

// Moves the staged state into self.state().
void commit(Optimizer& self, Staged& staged);

// The state of `p` for this step: the optimizer's own when `complete` says it has everything (the
// master and EMA copies too, when wanted), else a copy (or a fresh one) in `staged` that `fill`
// completes. The fp32 master is rebuilt from the param when wanted and missing (e.g. loaded from
// an archive saved without masters); the EMA starts from the master, or the param.
template <class State, class Complete, class Fill>
State& state_of(Optimizer& self, Staged& staged, const at::Tensor& p, bool master, bool ema,
                Complete&& complete, Fill&& fill) {
  void* key = p.unsafeGetTensorImpl();
  if (auto it = staged.find(key); it != staged.end()) return static_cast<State&>(*it->second);
  auto found = self.state().find(key);
  if (found != self.state().end()) {
    auto& s = static_cast<State&>(*found->second);
    if (complete(s) && (!master || s.master().defined()) && (!ema || s.ema().defined())) return s;
  }
  auto next = found == self.state().end()
                  ? std::make_unique<State>()
                  : std::make_unique<State>(static_cast<State&>(*found->second));
  fill(*next);
  if (master && !next->master().defined()) next->master(like_param(p.detach(), p));
  if (ema && !next->ema().defined()) {
    next->ema(like_param(next->master().defined() ? next->master() : p.detach(), p));
  }
  auto& out = *next;
  staged[key] = std::move(next);
  return out;
}

// What every op call of one group gets besides its lists: the scalar tensors read on the device
// and the EMA decay.
struct GroupScalars {
  OptTensor lr_tensor, grad_scale, found_inf, clip_coef;
  std::optional<double> ema_decay;
};

template <typename Options>
GroupScalars group_scalars(const Options& o, const torch::optim::OptimizerParamGroup& group,
                           const GradScaling& scaling, const at::Device& device) {
  GroupScalars s;
  if (o.lr_tensor()) s.lr_tensor = as_scalar(*o.lr_tensor(), device);
  s.grad_scale = as_scalar(scaling.grad_scale, device);
  s.found_inf = as_scalar(scaling.found_inf, device);
  s.clip_coef = clip_coef(o.max_grad_norm(), group, scaling.grad_scale);
  s.ema_decay = o.ema_decay();
  return s;
}

template <class T, class = void>
struct HasStep : std::false_type {};
template <class T>
struct HasStep<T, std::void_t<decltype(std::declval<T&>().steps)>> : std::true_type {};

// The lists every op call takes, gathered param by param (the algorithm's own state lists are
// gathered beside them).
struct BucketLists {
  std::vector<at::Tensor> params, grads, masters, emas, steps;

  template <class State>
  void add(const at::Tensor& p, const State& s, bool master, bool ema) {
    params.push_back(p);
    grads.push_back(p.grad());
    if (master) masters.push_back(s.master());
    if (ema) emas.push_back(s.ema());
    if (s.step().defined()) steps.push_back(s.step());  // SGD: only beside a low-bit buffer
  }
};

// Sets the fields every op's arguments have: the common lists, the scalar tensors, the EMA decay.
template <class Args>
void set_common(Args& a, const BucketLists& l, const GroupScalars& s) {
  a.params = l.params;
  a.grads = l.grads;
  a.masters = l.masters;
  a.emas = l.emas;
  if constexpr (HasStep<Args>::value) a.steps = l.steps;
  a.lr_tensor = s.lr_tensor;
  a.grad_scale = s.grad_scale;
  a.found_inf = s.found_inf;
  a.clip_coef = s.clip_coef;
  a.ema_decay = s.ema_decay.value_or(0.0);
}

// One prepared op call: run(true) only validates its arguments, run(false) runs the op.
using Call = std::function<void(bool validate_only)>;

template <class Args>
void run_or_validate(const Args& a, bool validate_only) {
  if (validate_only) {
    ops::validate(a);
  } else {
    op_args::call(a);  // what the entry points torchspeed::adam_step_(a) & co. do
  }
}

// Everything a step does around its op calls: no grad, the closure, every option and input
// checked, each group's scalars, then prepare(options, bucket, scalars, staged, calls) for each
// (param group, master/no-master bucket). With several calls every one is validated before the
// first runs; new state is committed only when nothing can fail any more.
template <typename Options, typename Prepare>
at::Tensor run_fused_step(Optimizer& self, const char* name, const Optimizer::LossClosure& closure,
                          const GradScaling& scaling, Prepare&& prepare) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  check_all_groups<Options>(name, self, /*at_step=*/true);
  check_step_inputs(name, self);
  Staged staged;
  std::vector<Call> calls;
  for (auto& group : self.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    const auto buckets = master_buckets(group.params(), o.master_weights());
    if (buckets.empty()) continue;
    const GroupScalars scalars = group_scalars(o, group, scaling, buckets[0][0].device());
    for (const auto& bucket : buckets) prepare(o, bucket, scalars, staged, calls);
  }
  if (calls.size() == 1) {
    calls[0](false);  // the op validates everything before it writes
    commit(self, staged);
    return loss;
  }
  for (const auto& call : calls) call(true);
  commit(self, staged);
  for (const auto& call : calls) call(false);
  return loss;
}

// torch::optim::serialize, then every option and state entry checked and the state converted
// (float32 on the param's device, a 0-dim float32 step even from an int64 one; Adam's moments to
// their group's format, load_in_group_format, under the optimizer's own state options, which a
// load keeps); on any error the optimizer is put back as it was before the load.
template <typename State, typename Options>
void load_checked(const char* name, Optimizer& self, torch::serialize::InputArchive& archive) {
  Staged old_state;
  for (const auto& [key, state] : self.state()) old_state[key] = state->clone();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> old_options;
  for (const auto& group : self.param_groups()) old_options.push_back(group.options().clone());
  try {
    torch::optim::serialize<State, Options>(archive, self);
    auto& groups = self.param_groups();
    std::vector<int64_t> saved_blocks;  // the block of each loaded group's int8 codes
    for (size_t g = 0; g < groups.size(); ++g) {
      saved_blocks.push_back(saved_state_block(name, c10::str("saved param_groups[", g, "]."),
                                               static_cast<const Options&>(groups[g].options())));
    }
    for (size_t g = 0; g < groups.size() && g < old_options.size(); ++g) {
      keep_on_load(static_cast<Options&>(groups[g].options()),
                   static_cast<const Options&>(*old_options[g]));
    }
    check_all_groups<Options>(name, self);
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].params().size(); ++i) {
        const at::Tensor& p = groups[g].params()[i];
        auto it = self.state().find(p.unsafeGetTensorImpl());
        if (it == self.state().end()) continue;
        auto& s = static_cast<State&>(*it->second);
        const std::string where = c10::str("state of param_groups[", g, "].params[", i, "]");
        check_state(name, where, s, p);
        place_state(s, p);
        load_in_group_format(name, where, s, p, static_cast<const Options&>(groups[g].options()),
                             saved_blocks[g]);
      }
    }
  } catch (...) {
    self.state() = std::move(old_state);
    for (size_t g = 0; g < old_options.size(); ++g) {
      self.param_groups()[g].set_options(std::move(old_options[g]));
    }
    throw;
  }
}

}  // namespace torchspeed::optim::detail

// The constructor, add_param_group, save and load: the same for every optimizer.
#define TORCHSPEED_DEFINE_OPTIMIZER(Cls, State, Options)                                         \
  Cls::Cls(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, Options defaults) \
      : FusedOptimizer(param_groups, std::make_unique<Options>(defaults)) {                      \
    detail::restore_group_options(#Cls, *this, param_groups, defaults);                          \
    detail::check_all_options(#Cls, "", defaults);                                               \
    detail::check_all_groups<Options>(#Cls, *this);                                              \
    detail::check_params(#Cls, *this);                                                           \
  }                                                                                              \
  void Cls::add_param_group(const torch::optim::OptimizerParamGroup& param_group) {              \
    detail::add_group<Options>(#Cls, *this, param_group);                                        \
  }                                                                                              \
  void Cls::save(torch::serialize::OutputArchive& archive) const {                               \
    torch::optim::serialize<State, Options>(archive, *this);                                     \
  }                                                                                              \
  void Cls::load(torch::serialize::InputArchive& archive) {                                      \
    detail::load_checked<State, Options>(#Cls, *this, archive);                                  \
  }
