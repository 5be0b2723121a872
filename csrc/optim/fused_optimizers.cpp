// torchspeed::optim::{Adam, AdamW, SGD, Lion, LAMB}: torch::optim::Optimizer subclasses whose step
// calls the fused torchspeed::*_step_ ops through the dispatcher (CPU or CUDA by the params'
// device).
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <functional>
#include <string>
#include <string_view>

#include "ops/optim_checks.h"
#include "torchspeed/ops.h"
#include "torchspeed/optim/adam.h"
#include "torchspeed/optim/hyperparams.h"
#include "torchspeed/optim/lion.h"
#include "torchspeed/optim/sgd.h"

namespace torchspeed::optim {

// The fields of each options and state class, listed once. Every per-field function (==, save,
// load, param-group merge) is generated from these lists: PLAIN(type, name) is an ordinary
// field, OPT(type, name) a std::optional one, and TENSOR(name) a state tensor.
// clang-format off
#define TORCHSPEED_ADAM_FIELDS(PLAIN, OPT)                                                  \
  PLAIN(double, lr) PLAIN(betas_t, betas) PLAIN(double, eps) PLAIN(double, weight_decay)    \
  PLAIN(bool, amsgrad) PLAIN(bool, maximize) PLAIN(bool, decoupled_weight_decay)            \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_ADAMW_FIELDS(PLAIN, OPT)                                                 \
  PLAIN(double, lr) PLAIN(betas_t, betas) PLAIN(double, eps) PLAIN(double, weight_decay)    \
  PLAIN(bool, amsgrad) PLAIN(bool, maximize)                                                \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_SGD_FIELDS(PLAIN, OPT)                                                   \
  PLAIN(double, lr) PLAIN(double, momentum) PLAIN(double, dampening)                        \
  PLAIN(double, weight_decay) PLAIN(bool, nesterov) PLAIN(bool, maximize)                   \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_LION_FIELDS(PLAIN, OPT)                                                  \
  PLAIN(double, lr) PLAIN(betas_t, betas) PLAIN(double, weight_decay) PLAIN(bool, maximize) \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_LAMB_FIELDS(PLAIN, OPT)                                                  \
  PLAIN(double, lr) PLAIN(betas_t, betas) PLAIN(double, eps) PLAIN(double, weight_decay)    \
  PLAIN(bool, maximize)                                                                     \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_ADAM_STATE(TENSOR) \
  TENSOR(step) TENSOR(exp_avg) TENSOR(exp_avg_sq) TENSOR(max_exp_avg_sq) TENSOR(master)
#define TORCHSPEED_SGD_STATE(TENSOR) TENSOR(momentum_buffer) TENSOR(master)
#define TORCHSPEED_LION_STATE(TENSOR) TENSOR(step) TENSOR(exp_avg) TENSOR(master)
#define TORCHSPEED_LAMB_STATE(TENSOR) TENSOR(step) TENSOR(exp_avg) TENSOR(exp_avg_sq) TENSOR(master)
// clang-format on

namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;
using OptTensor = std::optional<at::Tensor>;

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

bool wants_master(const std::optional<bool>& master_weights, const at::Tensor& p) {
  return (p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf) &&
         master_weights.value_or(true);
}

// Every numeric option through the validator the Python optimizers share
// (torchspeed/optim/hyperparams.h). `where` is "" for the defaults, "param_groups[i]." for a group.
void check_common(const char* name, const std::string& where, double lr, double weight_decay,
                  const std::optional<double>& max_grad_norm) {
  check_hyperparameter(name, where + "lr", lr);
  check_hyperparameter(name, where + "weight_decay", weight_decay);
  if (max_grad_norm) check_hyperparameter(name, where + "max_grad_norm", *max_grad_norm);
}

void check_betas(const char* name, const std::string& where, const std::tuple<double, double>& b) {
  check_hyperparameter(name, where + "betas[0]", std::get<0>(b));
  check_hyperparameter(name, where + "betas[1]", std::get<1>(b));
}

template <typename Options>
void check_adam_family(const char* name, const std::string& where, const Options& o) {
  check_common(name, where, o.lr(), o.weight_decay(), o.max_grad_norm());
  check_hyperparameter(name, where + "eps", o.eps());
  check_betas(name, where, o.betas());
}
void check_options(const char* name, const std::string& where, const AdamOptions& o) {
  check_adam_family(name, where, o);
}
void check_options(const char* name, const std::string& where, const AdamWOptions& o) {
  check_adam_family(name, where, o);
}
void check_options(const char* name, const std::string& where, const SGDOptions& o) {
  check_common(name, where, o.lr(), o.weight_decay(), o.max_grad_norm());
  check_hyperparameter(name, where + "momentum", o.momentum());
  check_hyperparameter(name, where + "dampening", o.dampening());
  // As torch: the defaults need momentum for nesterov; in a group without momentum it is plain SGD.
  check_nesterov(name, o.nesterov() && (where.empty() || o.momentum() != 0), o.momentum(),
                 o.dampening());
}
void check_options(const char* name, const std::string& where, const LionOptions& o) {
  check_common(name, where, o.lr(), o.weight_decay(), o.max_grad_norm());
  check_betas(name, where, o.betas());
}
void check_options(const char* name, const std::string& where, const LAMBOptions& o) {
  check_common(name, where, o.lr(), o.weight_decay(), o.max_grad_norm());
  check_hyperparameter(name, where + "eps", o.eps());
  check_betas(name, where, o.betas());
}

std::string group_prefix(size_t g) { return c10::str("param_groups[", g, "]."); }

template <typename Options>
void check_all_groups(const char* name, const Optimizer& self) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    check_options(name, group_prefix(g), static_cast<const Options&>(groups[g].options()));
  }
}

// Every param the optimizer holds must be a dense float32/bfloat16/float16 tensor; checked at
// construction so a bad model fails early with the param's position.
void check_params(const char* name, const Optimizer& self) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      TORCH_CHECK(p.defined() && p.layout() == at::kStrided && is_supported_dtype(p.scalar_type()),
                  "torchspeed.optim.", name, ": param_groups[", g, "].params[", i,
                  "] must be a dense float32, bfloat16 or float16 tensor, got ",
                  p.defined() ? c10::str(p.scalar_type(), " ", p.layout()) : std::string("None"));
    }
  }
}

// Validates every param that has a grad before anything (state included) is created or changed,
// so a bad step throws and leaves the optimizer and the model as they were.
void check_step_inputs(const char* name, const Optimizer& self) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      const auto where = c10::str("param_groups[", g, "].params[", i, "]");
      TORCH_CHECK(p.layout() == at::kStrided && is_supported_dtype(p.scalar_type()),
                  "torchspeed.optim.", name, ": ", where,
                  " must be a dense float32, bfloat16 or float16 tensor, got ", p.scalar_type(),
                  " ", p.layout());
      TORCH_CHECK(p.is_contiguous(), "torchspeed.optim.", name, ": ", where,
                  " must be contiguous, got strides ", p.strides());
      TORCH_CHECK(grad.layout() == at::kStrided, "torchspeed.optim.", name, ": the grad of ", where,
                  " must be dense; sparse gradients are not supported, got ", grad.layout());
      TORCH_CHECK(is_supported_dtype(grad.scalar_type()), "torchspeed.optim.", name,
                  ": the grad of ", where, " must be float32, bfloat16 or float16, got ",
                  grad.scalar_type());
      TORCH_CHECK(grad.device() == p.device() && grad.sizes() == p.sizes(), "torchspeed.optim.",
                  name, ": the grad of ", where, " must have the param's shape ", p.sizes(),
                  " and device ", p.device(), ", got ", grad.sizes(), " on ", grad.device());
    }
  }
}

// torch.nn.utils.clip_grad_norm_(group's params, max_grad_norm)'s coefficient, computed on the
// device by grad_stats over the group's own grads; the kernels multiply the grads by it.
OptTensor clip_coef(const std::optional<double>& max_grad_norm,
                    const torch::optim::OptimizerParamGroup& group) {
  if (!max_grad_norm) return std::nullopt;
  std::vector<at::Tensor> grads;
  for (const auto& p : group.params()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return std::nullopt;
  const at::Tensor norm = torchspeed::grad_stats(grads).total_norm;
  return at::clamp_max(*max_grad_norm / (norm + 1e-6), 1.0).reshape({1});
}

at::Tensor fp32_zeros_like(const at::Tensor& p) {
  return at::zeros(p.sizes(), p.options().dtype(at::kFloat));
}

// Splits the params with a grad into (wants a master) / (does not) buckets, non-empty only.
std::vector<std::vector<at::Tensor>> master_buckets(const std::vector<at::Tensor>& params,
                                                    const std::optional<bool>& master_weights) {
  std::vector<at::Tensor> with, without;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    (wants_master(master_weights, p) ? with : without).push_back(p);
  }
  std::vector<std::vector<at::Tensor>> out;
  for (auto* b : {&with, &without}) {
    if (!b->empty()) out.push_back(std::move(*b));
  }
  return out;
}

// State loaded from an archive may sit on another device or (step) have another shape.
void place_on(at::Tensor& t, const at::Tensor& p, bool scalar = false) {
  if (!t.defined()) return;
  if (t.device() != p.device() || t.scalar_type() != at::kFloat) {
    t = t.to(p.device(), at::kFloat).contiguous();
  }
  if (scalar && t.dim() != 0) t = t.reshape({});
}

// State loaded from an archive: every tensor on the param's device in float32, `step` 0-dim.
#define TORCHSPEED_PLACE_TENSOR(name) place_on(s.name(), p, std::string_view(#name) == "step");
#define TORCHSPEED_PLACE_STATE(State, TENSORS) \
  void place_state(State& s, const at::Tensor& p) { TENSORS(TORCHSPEED_PLACE_TENSOR) }
TORCHSPEED_PLACE_STATE(AdamParamState, TORCHSPEED_ADAM_STATE)
TORCHSPEED_PLACE_STATE(SGDParamState, TORCHSPEED_SGD_STATE)
TORCHSPEED_PLACE_STATE(LionParamState, TORCHSPEED_LION_STATE)
TORCHSPEED_PLACE_STATE(LAMBParamState, TORCHSPEED_LAMB_STATE)
#undef TORCHSPEED_PLACE_STATE
#undef TORCHSPEED_PLACE_TENSOR

// New or completed per-param state of one step, committed to self.state() only once every op
// call of the step has been validated: a step that throws leaves the state as it was.
using Staged = ska::flat_hash_map<void*, std::unique_ptr<OptimizerParamState>>;

// The state of `p` for this step: the optimizer's own when `complete` says it has everything,
// else a copy (or a fresh one) in `staged` that `fill` completes. The fp32 master is rebuilt
// from the param when wanted and missing (e.g. loaded from an archive saved without masters).
template <class State, class Complete, class Fill>
State& state_of(Optimizer& self, Staged& staged, const at::Tensor& p, bool master,
                Complete&& complete, Fill&& fill) {
  void* key = p.unsafeGetTensorImpl();
  if (auto it = staged.find(key); it != staged.end()) return static_cast<State&>(*it->second);
  auto found = self.state().find(key);
  if (found != self.state().end()) {
    auto& s = static_cast<State&>(*found->second);
    if (complete(s) && (!master || s.master().defined())) return s;
  }
  auto next = found == self.state().end()
                  ? std::make_unique<State>()
                  : std::make_unique<State>(static_cast<State&>(*found->second));
  fill(*next);
  if (master && !next->master().defined()) next->master(p.detach().to(at::kFloat).clone());
  auto& out = *next;
  staged[key] = std::move(next);
  return out;
}

void commit(Optimizer& self, Staged& staged) {
  for (auto& [key, state] : staged) self.state()[key] = std::move(state);
  staged.clear();
}

// One prepared op call: run(true) only validates its arguments, run(false) runs the op.
using Call = std::function<void(bool validate_only)>;

template <class Args>
void run_or_validate(const Args& a, bool validate_only) {
  if (validate_only) {
    ops::validate(a);
  } else {
    op_args::call(a);
  }
}

at::Tensor zero_step(const at::Tensor& p) { return at::zeros({}, p.options().dtype(at::kFloat)); }

// Everything a step does around its op calls: no grad, the closure, every option and input
// checked, each group's clip coefficient, then prepare(options, bucket, clip_coef, staged) for
// each (param group, master/no-master bucket). With several calls every one is validated before
// the first runs; new state is committed only when nothing can fail any more.
template <typename Options, typename Prepare>
at::Tensor fused_step(Optimizer& self, const char* name, const Optimizer::LossClosure& closure,
                      Prepare&& prepare) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  check_all_groups<Options>(name, self);
  check_step_inputs(name, self);
  Staged staged;
  std::vector<Call> calls;
  for (auto& group : self.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    const auto buckets = master_buckets(group.params(), o.master_weights());
    if (buckets.empty()) continue;
    const OptTensor coef = clip_coef(o.max_grad_norm(), group);
    for (const auto& bucket : buckets) prepare(o, bucket, coef, staged, calls);
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

at::Tensor contiguous_grad(const at::Tensor& p) {
  const at::Tensor& g = p.grad();
  return g.is_contiguous() ? g : g.contiguous();
}

// ---- Adam / AdamW -------------------------------------------------------------------------------
bool decoupled(const AdamOptions& o) { return o.decoupled_weight_decay(); }
bool decoupled(const AdamWOptions&) { return true; }

template <typename Options>
at::Tensor adam_family_step(Optimizer& self, const char* name,
                            const Optimizer::LossClosure& closure) {
  return fused_step<Options>(
      self, name, closure,
      [&](const Options& o, const std::vector<at::Tensor>& bucket, const OptTensor& coef,
          Staged& staged, std::vector<Call>& calls) {
        const bool amsgrad = o.amsgrad();
        std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, max_sqs, masters, steps;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<AdamParamState>(
              self, staged, p, master,
              [&](const AdamParamState& s) {
                return s.step().defined() && s.exp_avg().defined() && s.exp_avg_sq().defined() &&
                       (!amsgrad || s.max_exp_avg_sq().defined());
              },
              [&](AdamParamState& s) {
                if (!s.step().defined()) s.step(zero_step(p));
                if (!s.exp_avg().defined()) s.exp_avg(fp32_zeros_like(p));
                if (!s.exp_avg_sq().defined()) s.exp_avg_sq(fp32_zeros_like(p));
                if (amsgrad && !s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(fp32_zeros_like(p));
              });
          grads.push_back(contiguous_grad(p));
          exp_avgs.push_back(s.exp_avg());
          exp_avg_sqs.push_back(s.exp_avg_sq());
          if (amsgrad) max_sqs.push_back(s.max_exp_avg_sq());
          if (master) masters.push_back(s.master());
          steps.push_back(s.step());
        }
        calls.push_back([=](bool validate_only) {
          AdamStepArgs a;
          a.params = bucket;
          a.grads = grads;
          a.exp_avgs = exp_avgs;
          a.exp_avg_sqs = exp_avg_sqs;
          a.max_exp_avg_sqs = max_sqs;
          a.masters = masters;
          a.steps = steps;
          a.lr = o.lr();
          std::tie(a.beta1, a.beta2) = o.betas();
          a.eps = o.eps();
          a.weight_decay = o.weight_decay();
          a.amsgrad = amsgrad;
          a.maximize = o.maximize();
          a.decoupled_weight_decay = decoupled(o);
          a.clip_coef = coef;
          run_or_validate(a, validate_only);
        });
      });
}

// ---- SGD ----------------------------------------------------------------------------------------
bool has_buffer(const Optimizer& self, const at::Tensor& p) {
  auto it = self.state().find(p.unsafeGetTensorImpl());
  return it != self.state().end() &&
         static_cast<const SGDParamState&>(*it->second).momentum_buffer().defined();
}

// torch::optim::Optimizer::add_param_group merges a group's own options with the defaults only
// for torch's option types and otherwise replaces them by the defaults. This restores them with
// torch's rule: a field left at its constructor default inherits the optimizer's default.
#define TORCHSPEED_INHERIT_FIELD(type, name) \
  if (user.name() == fresh.name()) merged.name(defaults.name());
#define TORCHSPEED_DEFINE_MERGE(Options, FIELDS)                        \
  Options merge_options(const Options& user, const Options& defaults) { \
    const Options fresh;                                                \
    Options merged = user;                                              \
    FIELDS(TORCHSPEED_INHERIT_FIELD, TORCHSPEED_INHERIT_FIELD)          \
    return merged;                                                      \
  }
TORCHSPEED_DEFINE_MERGE(AdamOptions, TORCHSPEED_ADAM_FIELDS)
TORCHSPEED_DEFINE_MERGE(AdamWOptions, TORCHSPEED_ADAMW_FIELDS)
TORCHSPEED_DEFINE_MERGE(LionOptions, TORCHSPEED_LION_FIELDS)
TORCHSPEED_DEFINE_MERGE(LAMBOptions, TORCHSPEED_LAMB_FIELDS)

SGDOptions merge_options(const SGDOptions& user, const SGDOptions& defaults) {
  const SGDOptions fresh(user.lr());
  SGDOptions merged = user;
  TORCHSPEED_SGD_FIELDS(TORCHSPEED_INHERIT_FIELD, TORCHSPEED_INHERIT_FIELD)
  merged.lr(user.lr());  // SGDOptions has no default lr: a group's lr is always its own.
  return merged;
}
#undef TORCHSPEED_DEFINE_MERGE
#undef TORCHSPEED_INHERIT_FIELD

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
  check_options(name, group_prefix(self.param_groups().size()), merged);
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

// Every state tensor but `step` must have its param's number of elements.
#define TORCHSPEED_CHECK_TENSOR(name)                                                             \
  if (std::string_view(#name) != "step" && s.name().defined()) {                                  \
    TORCH_CHECK_VALUE(s.name().numel() == p.numel(), "torchspeed.optim.", optimizer, ": ", where, \
                      "." #name " must have ", p.numel(), " elements like its param, got ",       \
                      s.name().numel());                                                          \
  }
#define TORCHSPEED_CHECK_STATE(State, TENSORS)                                           \
  void check_state(const char* optimizer, const std::string& where, const State& s,      \
                   const at::Tensor& p) {                                                \
    TENSORS(TORCHSPEED_CHECK_TENSOR)                                                     \
    TORCH_CHECK_VALUE(!s.step().defined() || s.step().numel() == 1, "torchspeed.optim.", \
                      optimizer, ": ", where, ".step must have one element, got ",       \
                      s.step().sizes());                                                 \
  }
TORCHSPEED_CHECK_STATE(AdamParamState, TORCHSPEED_ADAM_STATE)
TORCHSPEED_CHECK_STATE(LionParamState, TORCHSPEED_LION_STATE)
TORCHSPEED_CHECK_STATE(LAMBParamState, TORCHSPEED_LAMB_STATE)
#undef TORCHSPEED_CHECK_STATE
void check_state(const char* optimizer, const std::string& where, const SGDParamState& s,
                 const at::Tensor& p) {
  TORCHSPEED_SGD_STATE(TORCHSPEED_CHECK_TENSOR)
}
#undef TORCHSPEED_CHECK_TENSOR

// torch::optim::serialize, then every option and state entry checked and the state converted
// (float32 on the param's device, a 0-dim float32 step even from an int64 one); on any error the
// optimizer is put back as it was before the load.
template <typename State, typename Options>
void load_checked(const char* name, Optimizer& self, torch::serialize::InputArchive& archive) {
  Staged old_state;
  for (const auto& [key, state] : self.state()) old_state[key] = state->clone();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> old_options;
  for (const auto& group : self.param_groups()) old_options.push_back(group.options().clone());
  try {
    torch::optim::serialize<State, Options>(archive, self);
    check_all_groups<Options>(name, self);
    const auto& groups = self.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].params().size(); ++i) {
        const at::Tensor& p = groups[g].params()[i];
        auto it = self.state().find(p.unsafeGetTensorImpl());
        if (it == self.state().end()) continue;
        auto& s = static_cast<State&>(*it->second);
        check_state(name, c10::str("state of param_groups[", g, "].params[", i, "]"), s, p);
        place_state(s, p);
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

}  // namespace

// ---- options and state: constructors, accessors, (de)serialization ------------------------------

#define TORCHSPEED_EQ_FIELD(type, name) &&lhs.name() == rhs.name()
#define TORCHSPEED_SAVE_FIELD(type, name) _TORCH_OPTIM_SERIALIZE_TORCH_ARG(name)
#define TORCHSPEED_LOAD_FIELD(type, name) _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(type, name)
#define TORCHSPEED_LOAD_OPT_FIELD(type, name) \
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(type, name)
#define TORCHSPEED_DEFINE_OPTIONS(Options, FIELDS)                          \
  Options::Options(double lr) : lr_(lr) {}                                  \
  double Options::get_lr() const { return lr(); }                           \
  void Options::set_lr(const double lr) { this->lr(lr); }                   \
  bool operator==(const Options& lhs, const Options& rhs) {                 \
    return true FIELDS(TORCHSPEED_EQ_FIELD, TORCHSPEED_EQ_FIELD);           \
  }                                                                         \
  void Options::serialize(torch::serialize::OutputArchive& archive) const { \
    FIELDS(TORCHSPEED_SAVE_FIELD, TORCHSPEED_SAVE_FIELD)                    \
  }                                                                         \
  void Options::serialize(torch::serialize::InputArchive& archive) {        \
    FIELDS(TORCHSPEED_LOAD_FIELD, TORCHSPEED_LOAD_OPT_FIELD)                \
  }
TORCHSPEED_DEFINE_OPTIONS(AdamOptions, TORCHSPEED_ADAM_FIELDS)
TORCHSPEED_DEFINE_OPTIONS(AdamWOptions, TORCHSPEED_ADAMW_FIELDS)
TORCHSPEED_DEFINE_OPTIONS(SGDOptions, TORCHSPEED_SGD_FIELDS)
TORCHSPEED_DEFINE_OPTIONS(LionOptions, TORCHSPEED_LION_FIELDS)
TORCHSPEED_DEFINE_OPTIONS(LAMBOptions, TORCHSPEED_LAMB_FIELDS)

// State tensors: an undefined tensor (e.g. no master) is not written, and stays undefined on load.
#define TORCHSPEED_SAVE_TENSOR(name) _TORCH_OPTIM_SERIALIZE_TORCH_ARG(name)
#define TORCHSPEED_LOAD_TENSOR(name) _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, name)
#define TORCHSPEED_DEFINE_STATE(State, TENSORS)                           \
  void State::serialize(torch::serialize::OutputArchive& archive) const { \
    TENSORS(TORCHSPEED_SAVE_TENSOR)                                       \
  }                                                                       \
  void State::serialize(torch::serialize::InputArchive& archive) { TENSORS(TORCHSPEED_LOAD_TENSOR) }
TORCHSPEED_DEFINE_STATE(AdamParamState, TORCHSPEED_ADAM_STATE)
TORCHSPEED_DEFINE_STATE(SGDParamState, TORCHSPEED_SGD_STATE)
TORCHSPEED_DEFINE_STATE(LionParamState, TORCHSPEED_LION_STATE)
TORCHSPEED_DEFINE_STATE(LAMBParamState, TORCHSPEED_LAMB_STATE)

// ---- optimizers ---------------------------------------------------------------------------------

Adam::Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdamOptions defaults)
    : Optimizer(param_groups, std::make_unique<AdamOptions>(defaults)) {
  restore_group_options("Adam", *this, param_groups, defaults);
  check_options("Adam", "", defaults);
  check_all_groups<AdamOptions>("Adam", *this);
  check_params("Adam", *this);
}

torch::Tensor Adam::step(LossClosure closure) {
  return adam_family_step<AdamOptions>(*this, "Adam", closure);
}

AdamW::AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
             AdamWOptions defaults)
    : Optimizer(param_groups, std::make_unique<AdamWOptions>(defaults)) {
  restore_group_options("AdamW", *this, param_groups, defaults);
  check_options("AdamW", "", defaults);
  check_all_groups<AdamWOptions>("AdamW", *this);
  check_params("AdamW", *this);
}

torch::Tensor AdamW::step(LossClosure closure) {
  return adam_family_step<AdamWOptions>(*this, "AdamW", closure);
}

SGD::SGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, SGDOptions defaults)
    : Optimizer(param_groups, std::make_unique<SGDOptions>(defaults)) {
  restore_group_options("SGD", *this, param_groups, defaults);
  check_options("SGD", "", defaults);
  check_all_groups<SGDOptions>("SGD", *this);
  check_params("SGD", *this);
}

torch::Tensor SGD::step(LossClosure closure) {
  return fused_step<SGDOptions>(
      *this, "SGD", closure,
      [&](const SGDOptions& o, const std::vector<at::Tensor>& by_master, const OptTensor& coef,
          Staged& staged, std::vector<Call>& calls) {
        const bool with_momentum = o.momentum() != 0;
        // Params without a momentum buffer yet start it from their grad (first_step = true).
        std::vector<std::vector<at::Tensor>> buckets;
        if (with_momentum) {
          std::vector<at::Tensor> fresh, old;
          for (const auto& p : by_master) (has_buffer(*this, p) ? old : fresh).push_back(p);
          for (auto* b : {&fresh, &old}) {
            if (!b->empty()) buckets.push_back(std::move(*b));
          }
        } else {
          buckets.push_back(by_master);
        }
        for (const auto& bucket : buckets) {
          const bool first_step = with_momentum && !has_buffer(*this, bucket[0]);
          std::vector<at::Tensor> grads, buffers, masters;
          for (const auto& p : bucket) {
            const bool master = wants_master(o.master_weights(), p);
            auto& s = state_of<SGDParamState>(
                *this, staged, p, master,
                [&](const SGDParamState& s) {
                  return !with_momentum || s.momentum_buffer().defined();
                },
                [&](SGDParamState& s) {
                  if (with_momentum && !s.momentum_buffer().defined()) {
                    s.momentum_buffer(fp32_zeros_like(p));
                  }
                });
            grads.push_back(contiguous_grad(p));
            if (with_momentum) buffers.push_back(s.momentum_buffer());
            if (master) masters.push_back(s.master());
          }
          const bool nesterov = o.nesterov() && with_momentum;
          calls.push_back([=](bool validate_only) {
            SgdStepArgs a;
            a.params = bucket;
            a.grads = grads;
            a.momentum_buffers = buffers;
            a.masters = masters;
            a.lr = o.lr();
            a.momentum = o.momentum();
            a.dampening = o.dampening();
            a.weight_decay = o.weight_decay();
            a.nesterov = nesterov;
            a.maximize = o.maximize();
            a.first_step = first_step;
            a.clip_coef = coef;
            run_or_validate(a, validate_only);
          });
        }
      });
}

Lion::Lion(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, LionOptions defaults)
    : Optimizer(param_groups, std::make_unique<LionOptions>(defaults)) {
  restore_group_options("Lion", *this, param_groups, defaults);
  check_options("Lion", "", defaults);
  check_all_groups<LionOptions>("Lion", *this);
  check_params("Lion", *this);
}

torch::Tensor Lion::step(LossClosure closure) {
  return fused_step<LionOptions>(
      *this, "Lion", closure,
      [&](const LionOptions& o, const std::vector<at::Tensor>& bucket, const OptTensor& coef,
          Staged& staged, std::vector<Call>& calls) {
        std::vector<at::Tensor> grads, exp_avgs, masters, steps;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<LionParamState>(
              *this, staged, p, master,
              [](const LionParamState& s) { return s.step().defined() && s.exp_avg().defined(); },
              [&](LionParamState& s) {
                if (!s.step().defined()) s.step(zero_step(p));
                if (!s.exp_avg().defined()) s.exp_avg(fp32_zeros_like(p));
              });
          grads.push_back(contiguous_grad(p));
          exp_avgs.push_back(s.exp_avg());
          if (master) masters.push_back(s.master());
          steps.push_back(s.step());
        }
        calls.push_back([=](bool validate_only) {
          LionStepArgs a;
          a.params = bucket;
          a.grads = grads;
          a.exp_avgs = exp_avgs;
          a.masters = masters;
          a.steps = steps;
          a.lr = o.lr();
          std::tie(a.beta1, a.beta2) = o.betas();
          a.weight_decay = o.weight_decay();
          a.maximize = o.maximize();
          a.clip_coef = coef;
          run_or_validate(a, validate_only);
        });
      });
}

LAMB::LAMB(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, LAMBOptions defaults)
    : Optimizer(param_groups, std::make_unique<LAMBOptions>(defaults)) {
  restore_group_options("LAMB", *this, param_groups, defaults);
  check_options("LAMB", "", defaults);
  check_all_groups<LAMBOptions>("LAMB", *this);
  check_params("LAMB", *this);
}

torch::Tensor LAMB::step(LossClosure closure) {
  return fused_step<LAMBOptions>(
      *this, "LAMB", closure,
      [&](const LAMBOptions& o, const std::vector<at::Tensor>& bucket, const OptTensor& coef,
          Staged& staged, std::vector<Call>& calls) {
        std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, masters, steps;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<LAMBParamState>(
              *this, staged, p, master,
              [](const LAMBParamState& s) {
                return s.step().defined() && s.exp_avg().defined() && s.exp_avg_sq().defined();
              },
              [&](LAMBParamState& s) {
                if (!s.step().defined()) s.step(zero_step(p));
                if (!s.exp_avg().defined()) s.exp_avg(fp32_zeros_like(p));
                if (!s.exp_avg_sq().defined()) s.exp_avg_sq(fp32_zeros_like(p));
              });
          grads.push_back(contiguous_grad(p));
          exp_avgs.push_back(s.exp_avg());
          exp_avg_sqs.push_back(s.exp_avg_sq());
          if (master) masters.push_back(s.master());
          steps.push_back(s.step());
        }
        calls.push_back([=](bool validate_only) {
          LambStepArgs a;
          a.params = bucket;
          a.grads = grads;
          a.exp_avgs = exp_avgs;
          a.exp_avg_sqs = exp_avg_sqs;
          a.masters = masters;
          a.steps = steps;
          a.lr = o.lr();
          std::tie(a.beta1, a.beta2) = o.betas();
          a.eps = o.eps();
          a.weight_decay = o.weight_decay();
          a.maximize = o.maximize();
          a.clip_coef = coef;
          run_or_validate(a, validate_only);
        });
      });
}

// add_param_group, save and load: the same for every optimizer.
#define TORCHSPEED_DEFINE_GROUPS_AND_IO(Cls, State, Options)                        \
  void Cls::add_param_group(const torch::optim::OptimizerParamGroup& param_group) { \
    add_group<Options>(#Cls, *this, param_group);                                   \
  }                                                                                 \
  void Cls::save(torch::serialize::OutputArchive& archive) const {                  \
    torch::optim::serialize<State, Options>(archive, *this);                        \
  }                                                                                 \
  void Cls::load(torch::serialize::InputArchive& archive) {                         \
    load_checked<State, Options>(#Cls, *this, archive);                             \
  }
TORCHSPEED_DEFINE_GROUPS_AND_IO(Adam, AdamParamState, AdamOptions)
TORCHSPEED_DEFINE_GROUPS_AND_IO(AdamW, AdamWParamState, AdamWOptions)
TORCHSPEED_DEFINE_GROUPS_AND_IO(SGD, SGDParamState, SGDOptions)
TORCHSPEED_DEFINE_GROUPS_AND_IO(Lion, LionParamState, LionOptions)
TORCHSPEED_DEFINE_GROUPS_AND_IO(LAMB, LAMBParamState, LAMBOptions)
#undef TORCHSPEED_DEFINE_GROUPS_AND_IO

}  // namespace torchspeed::optim
