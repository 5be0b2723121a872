// pybind11 bindings of the profiler core as torchspeed._C.profile: the clock, ranges (a C++
// context manager, so a Python `with` costs two C++ calls), the rings, the StepProfiler, traces.
#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "torchspeed/profile/profile.h"

namespace py = pybind11;
namespace tp = torchspeed::profile;

namespace torchspeed::python {
namespace {

tp::Phase phase_from_int(int p) {
  if ((p >= 0 && p < tp::kNumPhases) || p == static_cast<int>(tp::Phase::None)) {
    return static_cast<tp::Phase>(p);
  }
  throw py::value_error("torchspeed.profile: phase id must be 0.." +
                        std::to_string(tp::kNumPhases - 1) + " or 255, got " + std::to_string(p));
}

// `with torchspeed.profile.range("name"):` — one object per (name, phase), reused; the open
// ranges live on the C++ per-thread stack, so nesting and recursion of the same object work.
struct PyRange {
  tp::NameId name;
  tp::Phase phase;
};

// Where this thread's phase ranges go besides the C++ stack: a Python StepProfiler's CUDA
// timeline (its enter/exit record CUDA events at phase boundaries), or nothing (the host clock
// needs only the C++ stack, so a `with` stays two C++ calls). Owned reference, per thread.
thread_local PyObject* t_timeline = nullptr;

void enter_range(tp::NameId name, tp::Phase phase) {
  if (t_timeline != nullptr && phase != tp::Phase::None) {
    py::handle(t_timeline).attr("enter")(name, static_cast<int>(phase));
  } else {
    tp::begin(name, phase);
  }
}

void exit_range(tp::NameId name, tp::Phase phase) {
  if (t_timeline != nullptr && phase != tp::Phase::None) {
    py::handle(t_timeline).attr("exit")(name);
  } else {
    tp::end(name);  // by name: interleaved async ranges close their own entry
  }
}

void set_timeline(py::object timeline) {
  PyObject* old = t_timeline;
  t_timeline = timeline.is_none() ? nullptr : timeline.release().ptr();
  Py_XDECREF(old);
}

// The cost of a C++ range in a tight loop (for bench/bench_profile.py): ns per range.
double range_loop_ns(int64_t n) {
  const int64_t t0 = tp::now_ns();
  for (int64_t i = 0; i < n; ++i) {
    TORCHSPEED_RANGE("torchspeed.bench.range");
  }
  return static_cast<double>(tp::now_ns() - t0) / static_cast<double>(n > 0 ? n : 1);
}

py::dict history_dict(const tp::StepProfiler& p) {
  const std::vector<tp::StepRecord> h = p.history();
  py::list begin, end, samples;
  std::vector<py::list> phases(tp::kNumPhases);
  for (const tp::StepRecord& r : h) {
    begin.append(r.begin_ns);
    end.append(r.end_ns);
    samples.append(r.samples);
    for (int i = 0; i < tp::kNumPhases; ++i) phases[i].append(r.phase_ns[i]);
  }
  py::dict out;
  out["begin_ns"] = begin;
  out["end_ns"] = end;
  out["samples"] = samples;
  py::dict ph;
  for (int i = 0; i < tp::kNumPhases; ++i)
    ph[tp::phase_name(static_cast<tp::Phase>(i))] = phases[i];
  out["phase_ns"] = ph;
  out["steps_dropped"] = p.steps_dropped();
  return out;
}

}  // namespace

void bind_profile(py::module_& parent) {
  py::module_ m = parent.def_submodule("profile", "torchspeed's profiler core (C++)");
  m.attr("NUM_PHASES") = tp::kNumPhases;
  m.attr("PHASE_NONE") = static_cast<int>(tp::Phase::None);
  m.def("enabled", &tp::enabled);
  m.def("set_enabled", &tp::set_enabled, py::arg("on"));
  m.def("set_nvtx", &tp::set_nvtx, py::arg("on"));
  m.def("nvtx_available", &tp::nvtx_available);
  m.def("ticks", &tp::ticks);
  m.def("ticks_to_ns", &tp::ticks_to_ns, py::arg("ticks"));
  m.def("now_ns", &tp::now_ns, "Nanoseconds on the one clock (CLOCK_MONOTONIC's time line).");
  m.def("ns_per_tick", &tp::ns_per_tick);
  m.def("clock_source", &tp::clock_source);
  m.def("intern", [](const std::string& s) { return tp::intern(s); }, py::arg("name"));
  m.def("name_of", &tp::name_of, py::arg("id"));
  m.def("phase_name", [](int p) { return std::string(tp::phase_name(phase_from_int(p))); });
  m.def("parse_phase", [](const std::string& s) {
    try {
      return static_cast<int>(tp::parse_phase(s));
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def(
      "begin", [](tp::NameId id, int p) { tp::begin(id, phase_from_int(p)); }, py::arg("name_id"),
      py::arg("phase") = static_cast<int>(tp::Phase::None));
  m.def("end", py::overload_cast<>(&tp::end),
        "Closes this thread's newest open range; False if none was open.");
  m.def("end", py::overload_cast<tp::NameId>(&tp::end), py::arg("name_id"),
        "Closes this thread's newest open range with this name; False if there is none.");
  m.def(
      "enter", [](tp::NameId id, int p) { enter_range(id, phase_from_int(p)); }, py::arg("name_id"),
      py::arg("phase"),
      "Opens a phase range on this thread (through its StepProfiler timeline, if one is set).");
  m.def(
      "exit", [](tp::NameId id, int p) { exit_range(id, phase_from_int(p)); }, py::arg("name_id"),
      py::arg("phase"), "Closes what enter() opened.");
  m.def("_set_timeline", &set_timeline, py::arg("timeline"),
        "This thread's phase ranges also go to timeline.enter/exit (None: C++ only).");
  m.def("_get_timeline",
        [] { return t_timeline ? py::reinterpret_borrow<py::object>(t_timeline) : py::none(); });
  m.def("ring_capacity", &tp::ring_capacity);
  m.def("set_ring_capacity", [](size_t n) {
    try {
      tp::set_ring_capacity(n);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("dropped_events", &tp::dropped_events);
  m.def("clear", &tp::clear);
  m.def(
      "snapshot",
      [] {
        py::list out;
        for (const tp::ThreadEvents& te : tp::snapshot()) {
          py::list events;
          for (const tp::Event& e : te.events) {
            events.append(py::make_tuple(tp::ticks_to_ns(e.begin), tp::ticks_to_ns(e.end), e.name,
                                         static_cast<int>(e.phase)));
          }
          out.append(py::make_tuple(te.os_tid, te.thread_name, events));
        }
        return out;
      },
      "[(os_tid, thread_name, [(begin_ns, end_ns, name_id, phase), ...]), ...] of every ring.");
  m.def("_range_loop_ns", &range_loop_ns, py::arg("n"), py::call_guard<py::gil_scoped_release>());

  py::class_<PyRange>(m, "Range")
      .def(py::init([](tp::NameId id, int p) { return PyRange{id, phase_from_int(p)}; }),
           py::arg("name_id"), py::arg("phase") = static_cast<int>(tp::Phase::None))
      .def("__enter__",
           [](py::object self) {
             const PyRange& r = self.cast<const PyRange&>();
             enter_range(r.name, r.phase);
             return self;
           })
      .def("__exit__",
           [](const PyRange& r, py::handle, py::handle, py::handle) {
             exit_range(r.name, r.phase);
             return false;
           })
      .def("__call__",
           [](py::object self, py::object fn) {
             return py::module_::import("torchspeed.profile.ranges").attr("_decorate")(self, fn);
           })
      .def("__repr__",
           [](const PyRange& r) {
             return "torchspeed.profile.range('" + tp::name_of(r.name) + "')";
           })
      .def_property_readonly("name", [](const PyRange& r) { return tp::name_of(r.name); })
      .def_property_readonly("phase", [](const PyRange& r) { return static_cast<int>(r.phase); });

  py::class_<tp::StepProfiler>(m, "StepProfiler")
      .def(py::init<size_t>(), py::arg("history_steps") = 16384)
      .def("start", &tp::StepProfiler::start)
      .def(
          "step", [](tp::StepProfiler& p, int64_t samples) { p.step(samples); },
          py::arg("samples") = 0)
      .def(
          "add",
          [](tp::StepProfiler& p, int64_t begin_ns, int64_t end_ns,
             const std::vector<int64_t>& phase_ns, int64_t samples) {
            if (phase_ns.size() != static_cast<size_t>(tp::kNumPhases)) {
              throw py::value_error("torchspeed.profile.StepProfiler.add: phase_ns must have " +
                                    std::to_string(tp::kNumPhases) + " entries, got " +
                                    std::to_string(phase_ns.size()));
            }
            tp::StepRecord r;
            r.begin_ns = begin_ns;
            r.end_ns = end_ns;
            r.samples = samples;
            for (int i = 0; i < tp::kNumPhases; ++i) r.phase_ns[i] = phase_ns[i];
            p.add(r);
          },
          py::arg("begin_ns"), py::arg("end_ns"), py::arg("phase_ns"), py::arg("samples") = 0)
      .def_property_readonly("steps", &tp::StepProfiler::steps)
      .def_property_readonly("steps_dropped", &tp::StepProfiler::steps_dropped)
      .def("history", &history_dict)
      .def("summary_table", &tp::StepProfiler::summary_table);

  m.def(
      "write_chrome_trace",
      [](const std::string& path, const tp::StepProfiler* p,
         const std::vector<std::pair<uint64_t, std::string>>& names) {
        tp::write_chrome_trace(path, p, names);  // a bad path: RuntimeError naming it
      },
      py::arg("path"), py::arg("profiler") = nullptr,
      py::arg("thread_names") = std::vector<std::pair<uint64_t, std::string>>{},
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace torchspeed::python
