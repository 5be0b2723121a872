// One argument struct per op, written once as an X-macro list in schema order, from which come:
//   - the struct C++ callers fill and pass to the op's entry point (torchspeed::adam_step_(args)),
//   - the flat signature the dispatcher calls (the kernels registered per dispatch key take the
//     struct: TORCHSPEED_OP_IMPL(m, AdamStepArgs, adam_step_cpu)),
//   - the argument names, which tests/cpp/test_ops_args.cpp compares with the registered schema.
// The dispatcher itself checks the types and their order when a kernel is registered.
//
//   #define MY_OP_ARGS(X) X(at::TensorList, tensors, {}) X(double, alpha, 1.0)
//   TORCHSPEED_OP_ARGS(MyOpArgs, "my_op_", void, MY_OP_ARGS)
//
// A list entry is X(type, name, default). Lists (at::TensorList) do not own their tensors: keep
// the vectors alive while the struct is used.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>

namespace torchspeed::op_args {

/// The type of a dispatcher parameter for a struct field of type T.
template <class T>
struct Param {
  using type = T;
};
template <>
struct Param<std::optional<at::Tensor>> {
  using type = const std::optional<at::Tensor>&;
};
template <>
struct Param<at::Tensor> {
  using type = const at::Tensor&;
};

template <class... T>
struct TypeList {};
template <class L>
struct DropFirst;
template <class H, class... T>
struct DropFirst<TypeList<H, T...>> {
  using type = TypeList<T...>;
};

/// The flat function type R(params...) of an args struct's fields.
template <class R, class L>
struct FlatSignature;
template <class R, class... T>
struct FlatSignature<R, TypeList<T...>> {
  using type = R(typename Param<T>::type...);
};

/// Adapts `Fn(const Args&)` to the flat signature the dispatcher calls.
template <class Args, typename Args::Return (*Fn)(const Args&), class L = typename Args::Fields>
struct FlatKernel;
template <class Args, typename Args::Return (*Fn)(const Args&), class... T>
struct FlatKernel<Args, Fn, TypeList<T...>> {
  static typename Args::Return call(typename Param<T>::type... a) { return Fn(Args{a...}); }
};

/// Calls the op `Args::kName` through the dispatcher (the CPU, CUDA or Meta kernel by the tensors'
/// device), with the struct's fields as its arguments.
template <class Args>
typename Args::Return call(const Args& args) {
  using Sig = typename FlatSignature<typename Args::Return, typename Args::Fields>::type;
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow((std::string("torchspeed::") + Args::kName).c_str(), "")
          .template typed<Sig>();
  return std::apply([&](const auto&, const auto&... fields) { return op.call(fields...); },
                    args.fields());
}

}  // namespace torchspeed::op_args

#define TORCHSPEED_OP_ARG_FIELD(type, name, init) type name = init;
#define TORCHSPEED_OP_ARG_TYPE(type, name, init) , type
#define TORCHSPEED_OP_ARG_REF(type, name, init) , name
#define TORCHSPEED_OP_ARG_NAME(type, name, init) #name,

/// Defines struct `Struct` for the op `name` (as in the schema, without the namespace) returning
/// `ret`, with the fields of the X-macro list `LIST`.
#define TORCHSPEED_OP_ARGS(Struct, name, ret, LIST)                                \
  struct Struct {                                                                  \
    using Return = ret;                                                            \
    static constexpr const char* kName = name;                                     \
    static constexpr const char* kFieldNames[] = {LIST(TORCHSPEED_OP_ARG_NAME)};   \
    using Fields = typename ::torchspeed::op_args::DropFirst<                      \
        ::torchspeed::op_args::TypeList<void LIST(TORCHSPEED_OP_ARG_TYPE)>>::type; \
    LIST(TORCHSPEED_OP_ARG_FIELD)                                                  \
    /* (kPad, field...): references to every field, after a placeholder */         \
    auto fields() const { return std::tie(kPad LIST(TORCHSPEED_OP_ARG_REF)); }     \
    static constexpr int kPad = 0;                                                 \
  }

/// Registers `fn` (taking `const Struct&`) as the kernel of Struct's op in TORCH_LIBRARY_IMPL `m`.
#define TORCHSPEED_OP_IMPL(m, Struct, fn) \
  (m).impl(Struct::kName, &::torchspeed::op_args::FlatKernel<Struct, &(fn)>::call)
