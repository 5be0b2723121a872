// pybind11 bindings of the dist area: the C++ AccumulatingDDP (torchspeed._C.dist) that
// torchspeed.dist.AccumulatingDDP wraps. The process group arrives as torch's own ProcessGroup
// object: this module is built against torch's pybind11 (the same internals and the
// c10::intrusive_ptr holder declared by torch/csrc/utils/pybind.h), so the cast is torch's.
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <tuple>

#include "python/bindings.h"
#include "torchspeed/dist/ddp.h"
#include "torchspeed/dist/zero.h"

namespace torchspeed::python {

void bind_dist(pybind11::module_& m) {
  namespace py = pybind11;
  using torchspeed::dist::AccumulatingDDP;
  using torchspeed::dist::DDPOptions;
  using torchspeed::dist::DDPStats;
  auto d = m.def_submodule("dist", "torchspeed data-parallel internals");
  // The Python exception type (a RuntimeError) with the missing ranks as `.ranks`; kept for the
  // process's lifetime (a handle, so no Python object is destroyed at exit).
  static const py::handle out_of_data =
      py::exception<torchspeed::dist::RanksOutOfData>(d, "RanksOutOfData", PyExc_RuntimeError)
          .release();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const torchspeed::dist::RanksOutOfData& e) {
      py::object err = py::reinterpret_borrow<py::object>(out_of_data)(e.what());
      err.attr("ranks") = py::cast(e.ranks());
      PyErr_SetObject(out_of_data.ptr(), err.ptr());
    }
  });

  py::class_<DDPStats>(d, "DDPStats")
#define TORCHSPEED_DDP_STAT(name) .def_readonly(#name, &DDPStats::name)
      TORCHSPEED_DDP_STAT(world_size) TORCHSPEED_DDP_STAT(buckets) TORCHSPEED_DDP_STAT(bucket_bytes)
          TORCHSPEED_DDP_STAT(micro_steps) TORCHSPEED_DDP_STAT(sync_steps)
              TORCHSPEED_DDP_STAT(bucket_collectives) TORCHSPEED_DDP_STAT(control_collectives)
                  TORCHSPEED_DDP_STAT(bytes_reduced) TORCHSPEED_DDP_STAT(comm_ns)
                      TORCHSPEED_DDP_STAT(exposed_ns) TORCHSPEED_DDP_STAT(last_bucket_collectives)
                          TORCHSPEED_DDP_STAT(last_bytes_reduced) TORCHSPEED_DDP_STAT(last_comm_ns)
                              TORCHSPEED_DDP_STAT(last_exposed_ns) TORCHSPEED_DDP_STAT(last_overlap)
                                  TORCHSPEED_DDP_STAT(last_buckets_overlapped)
                                      TORCHSPEED_DDP_STAT(grad_shard_bytes)
                                          TORCHSPEED_DDP_STAT(nonfinite_steps);
#undef TORCHSPEED_DDP_STAT

  // Collectives block: every call that may run one releases the GIL.
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<AccumulatingDDP>(d, "AccumulatingDDP")
      .def(py::init([](std::vector<at::Tensor> params, std::vector<at::Tensor> buffers,
                       c10::intrusive_ptr<c10d::ProcessGroup> group, int64_t accumulation_steps,
                       double bucket_cap_mb, double first_bucket_cap_mb,
                       const std::string& compression, bool find_unused_parameters,
                       bool broadcast_buffers, std::vector<std::string> param_names,
                       std::vector<std::string> buffer_names, int64_t zero) {
             py::gil_scoped_release no_gil;  // construction broadcasts from rank 0
             return std::make_unique<AccumulatingDDP>(
                 std::move(params), std::move(buffers), std::move(group),
                 DDPOptions()
                     .accumulation_steps(accumulation_steps)
                     .bucket_cap_mb(bucket_cap_mb)
                     .first_bucket_cap_mb(first_bucket_cap_mb)
                     .compression(compression)
                     .find_unused_parameters(find_unused_parameters)
                     .broadcast_buffers(broadcast_buffers)
                     .zero(zero),
                 std::move(param_names), std::move(buffer_names));
           }),
           py::arg("params"), py::arg("buffers"), py::arg("process_group"),
           py::arg("accumulation_steps") = 1, py::arg("bucket_cap_mb") = 25.0,
           py::arg("first_bucket_cap_mb") = 1.0, py::arg("compression") = "none",
           py::arg("find_unused_parameters") = false, py::arg("broadcast_buffers") = true,
           py::arg("param_names") = std::vector<std::string>{},
           py::arg("buffer_names") = std::vector<std::string>{}, py::arg("zero") = 0)
      .def("begin_micro_step", &AccumulatingDDP::begin_micro_step, py::arg("allow_sync") = true,
           release())
      .def_property_readonly("sync_now", &AccumulatingDDP::sync_now)
      .def_property_readonly("micro_step", &AccumulatingDDP::micro_step)
      .def("zero_grad", &AccumulatingDDP::zero_grad, release())
      .def("clip_grad_norm_", &AccumulatingDDP::clip_grad_norm_, py::arg("max_norm"), release())
      .def("join_begin", &AccumulatingDDP::join_begin)
      .def("join", &AccumulatingDDP::join, release())
      .def("all_reduce_count", &AccumulatingDDP::all_reduce_count, py::arg("value"), release())
      .def("broadcast_from_rank0", &AccumulatingDDP::broadcast_from_rank0, release())
      .def_property_readonly("rank", &AccumulatingDDP::rank)
      .def_property_readonly("world_size", &AccumulatingDDP::world_size)
      .def("stats", &AccumulatingDDP::stats)
      .def("buckets", &AccumulatingDDP::buckets)
      .def("grad_shards", &AccumulatingDDP::grad_shards)
      .def_property_readonly("last_nonfinite", &AccumulatingDDP::last_nonfinite)
      .def_property_readonly("zero_collectives", &AccumulatingDDP::zero_collectives)
      .def("param_slots", &AccumulatingDDP::param_slots)
      .def("slot_params", &AccumulatingDDP::slot_params);

  // ZeRO-1's layout and step collectives; torchspeed.dist.ZeroOptimizer steps the pieces with a
  // Python optimizer per bucket between begin_step and finish_step.
  using torchspeed::dist::ZeroShards;
  // Its destructor waits for gathers still in flight (a step that raised between launch_gather
  // and finish_step); a Gloo thread finishing one may need the GIL (the work's thread-local state
  // holds Python objects), so the GIL is released first (a deadlock otherwise).
  py::class_<ZeroShards>(d, "ZeroShards", py::release_gil_before_calling_cpp_dtor())
      .def(py::init<AccumulatingDDP&>(), py::arg("ddp"), py::keep_alive<1, 2>())
      .def_property_readonly("num_buckets", &ZeroShards::num_buckets)
      .def("pieces", &ZeroShards::pieces, py::arg("bucket"))
      .def(
          "layout",
          [](const ZeroShards& z, int64_t b) {
            std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> out;
            for (const auto& p : z.layout(b)) {
              out.emplace_back(p.slot, p.shard_offset, p.param_offset, p.numel);
            }
            return out;
          },
          py::arg("bucket"))
      .def("shard_numel", &ZeroShards::shard_numel, py::arg("bucket"))
      .def_property_readonly("nonfinite_flag",
                             [](const ZeroShards& z) -> std::optional<at::Tensor> {
                               if (!z.nonfinite_flag().defined()) return std::nullopt;
                               return z.nonfinite_flag();
                             })
      .def(
          "begin_step",
          [](ZeroShards& z, std::optional<at::Tensor> grad_scale,
             std::optional<at::Tensor> found_inf) {
            return z.begin_step(grad_scale.value_or(at::Tensor()),
                                found_inf.value_or(at::Tensor()));
          },
          py::arg("grad_scale") = py::none(), py::arg("found_inf") = py::none(), release())
      .def("launch_gather", &ZeroShards::launch_gather, py::arg("bucket"), release())
      .def("finish_step", &ZeroShards::finish_step, release())
      .def_property_readonly("collectives", &ZeroShards::collectives)
      .def_property_readonly("gather_method", &ZeroShards::gather_method)
      .def("stats", [](const ZeroShards& z) {
        const auto s = z.stats();
        py::dict out;
        out["zero_steps"] = s.zero_steps;
        out["zero_skipped_steps"] = s.zero_skipped_steps;
        out["bytes_all_gathered"] = s.bytes_all_gathered;
        out["last_bytes_all_gathered"] = s.last_bytes_all_gathered;
        out["shard_param_bytes"] = s.shard_param_bytes;
        return out;
      });
}

}  // namespace torchspeed::python
