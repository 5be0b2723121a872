// Option and state I/O of the C++ fused optimizers (options_io.h): equality, archive read/write
// and checks of every field, generated from the field lists in the public headers, and the public
// options and state classes' member functions.
#include "optim/options_io.h"

#include <torch/serialize/archive.h>

#include <string_view>
#include <type_traits>

#include "ops/optim_checks.h"
#include "torchspeed/optim/hyperparams.h"

namespace torchspeed::optim {
namespace detail {
namespace {

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

// A fresh options object, to tell the fields a group left at their defaults.
template <class Options>
Options fresh_options(const Options&) {
  return Options();
}
SGDOptions fresh_options(const SGDOptions& user) { return SGDOptions(user.lr()); }

// An undefined state tensor of a loaded state is left undefined; a defined one may sit on another
// device, have another dtype or memory layout, or (step) another shape.
void place_on(at::Tensor& t, const at::Tensor& p, bool is_step) {
  if (!t.defined()) return;
  if (is_step) {
    t = t.to(p.device(), at::kFloat).reshape({});
  } else if (t.device() != p.device() || t.scalar_type() != at::kFloat ||
             !ops::laid_out_like(t, p)) {
    t = like_param(t.to(p.device()).reshape(p.sizes()), p);
  }
}

}  // namespace

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

bool wants_master(const std::optional<bool>& master_weights, const at::Tensor& p) {
  return (p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf) &&
         master_weights.value_or(true);
}

at::Tensor like_param(const at::Tensor& src, const at::Tensor& p) {
  return ops::copy_laid_out_like(src, p, at::kFloat);
}

at::Tensor zeros_like_param(const at::Tensor& p) {
  return at::zeros_like(p, p.options().dtype(at::kFloat));
}

at::Tensor zero_step(const at::Tensor& p) { return at::zeros({}, p.options().dtype(at::kFloat)); }

std::string group_prefix(size_t g) { return c10::str("param_groups[", g, "]."); }

// ---- options: generated from each class's field list --------------------------------------------

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

// ---- state: generated from each class's tensor list ---------------------------------------------

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

}  // namespace detail

// The class members below expand the field macros, which name the helpers above.
using namespace detail;  // NOLINT(google-build-using-namespace)

// ---- the public classes: options and state ------------------------------------------------------

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

}  // namespace torchspeed::optim
