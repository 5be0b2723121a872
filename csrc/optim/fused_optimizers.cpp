// torchspeed::optim::{Adam, AdamW, SGD, Lion, LAMB}: torch::optim::Optimizer subclasses whose step
// calls the fused ops through the dispatcher (the entry points' op_args::call; CPU or CUDA by the
// params' device). Every per-field function of the options and state classes is generated here
// from the field lists in the public headers (TORCHSPEED_ADAM_OPTIONS, TORCHSPEED_ADAM_STATE, ...).
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <functional>
#include <string>
#include <string_view>
#include <type_traits>

#include "ops/optim_checks.h"
#include "torchspeed/ops.h"
#include "torchspeed/optim/adam.h"
#include "torchspeed/optim/hyperparams.h"
#include "torchspeed/optim/lion.h"
#include "torchspeed/optim/sgd.h"

namespace torchspeed::optim {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;
using OptTensor = std::optional<at::Tensor>;

// ---- one field: equality, archive, checks -------------------------------------------------------

template <class T>
bool same_value(const T& a, const T& b) {
  return a == b;
}
bool same_value(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || a.is_same(b));
}
bool same_value(const OptTensor& a, const OptTensor& b) {
  return a.has_value() == b.has_value() && (!a || same_value(*a, *b));
}

template <class T>
c10::IValue to_ivalue(const T& v) {
  return c10::IValue(v);
}
template <class T>
c10::IValue to_ivalue(const std::optional<T>& v) {
  return v ? c10::IValue(*v) : c10::IValue();
}

template <class T>
struct FromIValue {
  static T get(const c10::IValue& v) { return v.to<T>(); }
};
template <class T>
struct FromIValue<std::optional<T>> {
  static std::optional<T> get(const c10::IValue& v) {
    return v.isNone() ? std::nullopt : std::optional<T>(v.to<T>());
  }
};

// One option through the validator the Python optimizers share (torchspeed/optim/hyperparams.h);
// `where` is "" for the defaults, "param_groups[i]." for a group.
void check_field(const char* name, const std::string& where, const char* field, double v, bool) {
  check_hyperparameter(name, where + field, v);
}
void check_field(const char*, const std::string&, const char*, bool, bool) {}
void check_field(const char*, const std::string&, const char*, const std::optional<bool>&, bool) {}
void check_field(const char* name, const std::string& where, const char* field,
                 const std::optional<double>& v, bool) {
  if (v) check_hyperparameter(name, where + field, *v);
}
void check_field(const char* name, const std::string& where, const char*, const betas_t& b, bool) {
  check_hyperparameter(name, where + "betas[0]", std::get<0>(b));
  check_hyperparameter(name, where + "betas[1]", std::get<1>(b));
}
// The lr tensor: one element of a floating dtype; its value is checked as lr's, except on the step
// path of a device tensor (reading it there would synchronise), as in Python.
void check_field(const char* name, const std::string& where, const char*, const OptTensor& t,
                 bool at_step) {
  if (!t) return;
  TORCH_CHECK_VALUE(t->defined() && t->numel() == 1 && t->is_floating_point(), "torchspeed.optim.",
                    name, ": ", where,
                    "lr_tensor must be a one-element floating-point tensor, got ",
                    t->defined() ? c10::str(t->scalar_type(), " ", t->sizes()) : "undefined");
  if (!at_step || t->device().is_cpu()) check_hyperparameter(name, where + "lr", t->item<double>());
}

// ---- options: generated from each class's field list --------------------------------------------

// A fresh options object, to tell the fields a group left at their defaults.
template <class Options>
Options fresh_options(const Options&) {
  return Options();
}
SGDOptions fresh_options(const SGDOptions& user) { return SGDOptions(user.lr()); }

#define TORCHSPEED_OPTION_EQ(type, name, init) &&same_value(lhs.name(), rhs.name())
#define TORCHSPEED_OPTION_SAVE(type, name, init) archive.write(#name, to_ivalue(name()));
// An option missing from an archive (one saved by an older version) keeps its default.
#define TORCHSPEED_OPTION_LOAD(type, name, init)                    \
  {                                                                 \
    c10::IValue v;                                                  \
    if (archive.try_read(#name, v)) name(FromIValue<type>::get(v)); \
  }
#define TORCHSPEED_OPTION_INHERIT(type, name, init) \
  if (same_value(user.name(), fresh.name())) merged.name(defaults.name());
#define TORCHSPEED_OPTION_CHECK(type, name, init) \
  check_field(optimizer, where, #name, o.name(), at_step);

// torch::optim::Optimizer::add_param_group merges a group's own options with the defaults only for
// torch's option types and otherwise replaces them by the defaults; merge_options restores them
// with torch's rule: a field left at its constructor default inherits the optimizer's default
// (SGD has no default lr: a group's lr is always its own).
#define TORCHSPEED_DEFINE_OPTION_FUNCTIONS(Options, LIST)                               \
  void check_options(const char* optimizer, const std::string& where, const Options& o, \
                     bool at_step){                                                     \
      LIST(TORCHSPEED_OPTION_CHECK)} Options merge_options(const Options& user,         \
                                                           const Options& defaults) {   \
    const Options fresh = fresh_options(user);                                          \
    Options merged = user;                                                              \
    LIST(TORCHSPEED_OPTION_INHERIT)                                                     \
    if constexpr (std::is_same_v<Options, SGDOptions>) merged.lr(user.lr());            \
    return merged;                                                                      \
  }
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(AdamOptions, TORCHSPEED_ADAM_OPTIONS)
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(AdamWOptions, TORCHSPEED_ADAMW_OPTIONS)
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(SGDOptions, TORCHSPEED_SGD_OPTIONS)
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(LionOptions, TORCHSPEED_LION_OPTIONS)
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(LAMBOptions, TORCHSPEED_LAMB_OPTIONS)
#undef TORCHSPEED_DEFINE_OPTION_FUNCTIONS

// Every field, then SGD's cross-field rule: as torch, the defaults need momentum for nesterov; in
// a group without momentum it is plain SGD.
template <class Options>
void check_all_options(const char* name, const std::string& where, const Options& o,
                       bool at_step = false) {
  check_options(name, where, o, at_step);
  if constexpr (std::is_same_v<Options, SGDOptions>) {
    check_nesterov(name, o.nesterov() && (where.empty() || o.momentum() != 0), o.momentum(),
                   o.dampening());
  }
}

std::string group_prefix(size_t g) { return c10::str("param_groups[", g, "]."); }

template <typename Options>
void check_all_groups(const char* name, const Optimizer& self, bool at_step = false) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    check_all_options(name, group_prefix(g), static_cast<const Options&>(groups[g].options()),
                      at_step);
  }
}

// ---- state: generated from each class's tensor list ---------------------------------------------

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

bool wants_master(const std::optional<bool>& master_weights, const at::Tensor& p) {
  return (p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf) &&
         master_weights.value_or(true);
}

// A float32 copy of `src` laid out in memory like the param `p`: the kernels see every per-param
// tensor as flat memory, so a channels_last param gets channels_last state.
at::Tensor like_param(const at::Tensor& src, const at::Tensor& p) {
  return ops::copy_laid_out_like(src, p, at::kFloat);
}

at::Tensor zeros_like_param(const at::Tensor& p) {
  return at::zeros_like(p, p.options().dtype(at::kFloat));
}

at::Tensor zero_step(const at::Tensor& p) { return at::zeros({}, p.options().dtype(at::kFloat)); }

// State loaded from an archive may sit on another device, have another dtype or memory layout, or
// (step) another shape.
void place_on(at::Tensor& t, const at::Tensor& p, bool is_step) {
  if (!t.defined()) return;
  if (is_step) {
    t = t.to(p.device(), at::kFloat).reshape({});
  } else if (t.device() != p.device() || t.scalar_type() != at::kFloat ||
             !ops::laid_out_like(t, p)) {
    t = like_param(t.to(p.device()).reshape(p.sizes()), p);
  }
}

#define TORCHSPEED_STATE_SAVE(name) \
  if (name().defined()) archive.write(#name, name());
#define TORCHSPEED_STATE_LOAD(name)          \
  {                                          \
    at::Tensor t;                            \
    if (archive.try_read(#name, t)) name(t); \
  }
#define TORCHSPEED_STATE_PLACE(name) place_on(s.name(), p, std::string_view(#name) == "step");
// Every state tensor must have its param's number of elements; `step` one.
#define TORCHSPEED_STATE_CHECK(name)                                                         \
  if (s.name().defined()) {                                                                  \
    const bool is_step = std::string_view(#name) == "step";                                  \
    const int64_t want = is_step ? 1 : p.numel();                                            \
    TORCH_CHECK_VALUE(s.name().numel() == want, "torchspeed.optim.", optimizer, ": ", where, \
                      "." #name " must have ", want, is_step ? " element" : " elements",     \
                      is_step ? "" : " like its param", ", got shape ", s.name().sizes());   \
  }
#define TORCHSPEED_DEFINE_STATE_FUNCTIONS(State, LIST)                              \
  void place_state(State& s, const at::Tensor& p) { LIST(TORCHSPEED_STATE_PLACE) }  \
  void check_state(const char* optimizer, const std::string& where, const State& s, \
                   const at::Tensor& p) {                                           \
    LIST(TORCHSPEED_STATE_CHECK)                                                    \
  }
TORCHSPEED_DEFINE_STATE_FUNCTIONS(AdamParamState, TORCHSPEED_ADAM_STATE)
TORCHSPEED_DEFINE_STATE_FUNCTIONS(SGDParamState, TORCHSPEED_SGD_STATE)
TORCHSPEED_DEFINE_STATE_FUNCTIONS(LionParamState, TORCHSPEED_LION_STATE)
TORCHSPEED_DEFINE_STATE_FUNCTIONS(LAMBParamState, TORCHSPEED_LAMB_STATE)
#undef TORCHSPEED_DEFINE_STATE_FUNCTIONS

// ---- construction, groups -----------------------------------------------------------------------

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
      TORCH_CHECK(p.is_non_overlapping_and_dense(), "torchspeed.optim.", name, ": ", where,
                  " must be contiguous in some memory format (dense and non-overlapping, e.g. "
                  "channels_last), got sizes ",
                  p.sizes(), " and strides ", p.strides());
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

// ---- one step -----------------------------------------------------------------------------------

// torch.nn.utils.clip_grad_norm_(group's params, max_grad_norm)'s coefficient, computed on the
// device by grad_stats over the group's own grads (divided by the AMP scale: the norm of the
// unscaled grads); the kernels multiply the grads by it.
OptTensor clip_coef(const std::optional<double>& max_grad_norm,
                    const torch::optim::OptimizerParamGroup& group, const at::Tensor& grad_scale) {
  if (!max_grad_norm) return std::nullopt;
  std::vector<at::Tensor> grads;
  for (const auto& p : group.params()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return std::nullopt;
  at::Tensor norm = torchspeed::grad_stats(grads).total_norm;
  if (grad_scale.defined()) norm = norm / grad_scale.to(norm.device());
  return at::clamp_max(*max_grad_norm / (norm + 1e-6), 1.0).reshape({1});
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

// New or completed per-param state of one step, committed to self.state() only once every op
// call of the step has been validated: a step that throws leaves the state as it was.
using Staged = ska::flat_hash_map<void*, std::unique_ptr<OptimizerParamState>>;

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

void commit(Optimizer& self, Staged& staged) {
  for (auto& [key, state] : staged) self.state()[key] = std::move(state);
  staged.clear();
}

// What every op call of one group gets besides its lists: the scalar tensors read on the device
// and the EMA decay.
struct GroupScalars {
  OptTensor lr_tensor, grad_scale, found_inf, clip_coef;
  std::optional<double> ema_decay;
};

OptTensor as_scalar(const at::Tensor& t, const at::Device& device) {
  if (!t.defined()) return std::nullopt;
  return t.detach().to(device, at::kFloat).reshape({1});
}

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
    if constexpr (!std::is_same_v<State, SGDParamState>) steps.push_back(s.step());
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

// ---- Adam / AdamW -------------------------------------------------------------------------------

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

// ---- SGD ----------------------------------------------------------------------------------------

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

// ---- Lion, LAMB ---------------------------------------------------------------------------------

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

// ---- loading ------------------------------------------------------------------------------------

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

// ---- the public classes: options, state and optimizers ------------------------------------------

#define TORCHSPEED_DEFINE_OPTIONS_CLASS(Options, LIST)                      \
  Options::Options(double lr) : lr_(lr) {}                                  \
  double Options::get_lr() const { return lr(); }                           \
  void Options::set_lr(const double lr) { this->lr(lr); }                   \
  bool operator==(const Options& lhs, const Options& rhs) {                 \
    return true LIST(TORCHSPEED_OPTION_EQ);                                 \
  }                                                                         \
  void Options::serialize(torch::serialize::OutputArchive& archive) const { \
    LIST(TORCHSPEED_OPTION_SAVE)                                            \
  }                                                                         \
  void Options::serialize(torch::serialize::InputArchive& archive) { LIST(TORCHSPEED_OPTION_LOAD) }
TORCHSPEED_DEFINE_OPTIONS_CLASS(AdamOptions, TORCHSPEED_ADAM_OPTIONS)
TORCHSPEED_DEFINE_OPTIONS_CLASS(AdamWOptions, TORCHSPEED_ADAMW_OPTIONS)
TORCHSPEED_DEFINE_OPTIONS_CLASS(SGDOptions, TORCHSPEED_SGD_OPTIONS)
TORCHSPEED_DEFINE_OPTIONS_CLASS(LionOptions, TORCHSPEED_LION_OPTIONS)
TORCHSPEED_DEFINE_OPTIONS_CLASS(LAMBOptions, TORCHSPEED_LAMB_OPTIONS)
#undef TORCHSPEED_DEFINE_OPTIONS_CLASS

// An undefined state tensor (e.g. no master) is not written, and stays undefined on load.
#define TORCHSPEED_DEFINE_STATE_CLASS(State, LIST)                        \
  void State::serialize(torch::serialize::OutputArchive& archive) const { \
    LIST(TORCHSPEED_STATE_SAVE)                                           \
  }                                                                       \
  void State::serialize(torch::serialize::InputArchive& archive) { LIST(TORCHSPEED_STATE_LOAD) }
TORCHSPEED_DEFINE_STATE_CLASS(AdamParamState, TORCHSPEED_ADAM_STATE)
TORCHSPEED_DEFINE_STATE_CLASS(SGDParamState, TORCHSPEED_SGD_STATE)
TORCHSPEED_DEFINE_STATE_CLASS(LionParamState, TORCHSPEED_LION_STATE)
TORCHSPEED_DEFINE_STATE_CLASS(LAMBParamState, TORCHSPEED_LAMB_STATE)
#undef TORCHSPEED_DEFINE_STATE_CLASS

// The constructor, add_param_group, save and load: the same for every optimizer.
#define TORCHSPEED_DEFINE_OPTIMIZER(Cls, State, Options)                                         \
  Cls::Cls(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, Options defaults) \
      : FusedOptimizer(param_groups, std::make_unique<Options>(defaults)) {                      \
    restore_group_options(#Cls, *this, param_groups, defaults);                                  \
    check_all_options(#Cls, "", defaults);                                                       \
    check_all_groups<Options>(#Cls, *this);                                                      \
    check_params(#Cls, *this);                                                                   \
  }                                                                                              \
  void Cls::add_param_group(const torch::optim::OptimizerParamGroup& param_group) {              \
    add_group<Options>(#Cls, *this, param_group);                                                \
  }                                                                                              \
  void Cls::save(torch::serialize::OutputArchive& archive) const {                               \
    torch::optim::serialize<State, Options>(archive, *this);                                     \
  }                                                                                              \
  void Cls::load(torch::serialize::InputArchive& archive) {                                      \
    load_checked<State, Options>(#Cls, *this, archive);                                          \
  }
TORCHSPEED_DEFINE_OPTIMIZER(Adam, AdamParamState, AdamOptions)
TORCHSPEED_DEFINE_OPTIMIZER(AdamW, AdamWParamState, AdamWOptions)
TORCHSPEED_DEFINE_OPTIMIZER(SGD, SGDParamState, SGDOptions)
TORCHSPEED_DEFINE_OPTIMIZER(Lion, LionParamState, LionOptions)
TORCHSPEED_DEFINE_OPTIMIZER(LAMB, LAMBParamState, LAMBOptions)
#undef TORCHSPEED_DEFINE_OPTIMIZER

torch::Tensor Adam::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return adam_family_step<AdamOptions>(*this, "Adam", closure, scaling);
}
torch::Tensor AdamW::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return adam_family_step<AdamWOptions>(*this, "AdamW", closure, scaling);
}
torch::Tensor SGD::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return sgd_step(*this, closure, scaling);
}
torch::Tensor Lion::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return lion_step(*this, closure, scaling);
}
torch::Tensor LAMB::fused_step(const LossClosure& closure, const GradScaling& scaling) {
  return lamb_step(*this, closure, scaling);
}

}  // namespace torchspeed::optim
