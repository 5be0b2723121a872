// pybind11 bindings of torchspeed.data (torchspeed._C.data): sources, Loader, and the image
// pipeline's pieces (draws, decode, resample) that the Python tests compare against PIL.
#include <torch/extension.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>

#include "core/utf8.h"
#include "data/image.h"
#include "data/mapped_file.h"
#include "data/sources.h"
#include "data/tar_reader.h"
#include "python/bindings.h"
#include "torchspeed/data/loader.h"

namespace py = pybind11;

namespace torchspeed::python {
namespace {

using data::CropMode;
using data::ImageTransformOptions;

// decode_scaling from Python: a name, or True ("accurate") / False ("off").
data::DecodeScaling decode_scaling_from(const py::object& v) {
  if (py::isinstance<py::bool_>(v)) {
    return v.cast<bool>() ? data::DecodeScaling::kAccurate : data::DecodeScaling::kOff;
  }
  return data::parse_decode_scaling(py::isinstance<py::str>(v)
                                        ? v.cast<std::string>()
                                        : py::str(py::repr(v)).cast<std::string>());
}

// Runs f and turns std::exception from the torch-free core into a Python exception with the text.
template <typename F>
auto core_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    throw py::value_error(escape_invalid_utf8(e.what()));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(escape_invalid_utf8(e.what()));
  }
}

std::string as_bytes(const py::bytes& b) { return std::string(b); }

// Strings of a batch as Python str: text fields were checked as UTF-8 per sample; sample keys come
// from tar member names (any bytes), decoded like os.fsdecode (surrogateescape) so none can fail.
py::list str_list(const std::vector<std::string>& v) {
  py::list out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    PyObject* o =
        PyUnicode_DecodeUTF8(v[i].data(), static_cast<Py_ssize_t>(v[i].size()), "surrogateescape");
    if (o == nullptr) throw py::error_already_set();
    out[i] = py::reinterpret_steal<py::object>(o);
  }
  return out;
}

// A should_stop hook for long GIL-free C++ work started from Python: every ~20 ms it takes the GIL
// and runs PyErr_CheckSignals, so Ctrl-C (or a signal handler that raises) stops the work. The
// pending Python exception stays set for the caller to raise (see run_cancellable).
std::function<bool()> python_interrupt_check() {
  auto last =
      std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  return [last]() {
    const auto now = std::chrono::steady_clock::now();
    if (now - *last < std::chrono::milliseconds(20)) return false;
    *last = now;
    py::gil_scoped_acquire gil;
    return PyErr_CheckSignals() != 0;
  };
}

// Collects TORCH_WARN messages raised on this thread while the GIL is released, to re-issue them
// as Python warnings once it is held again.
struct CollectWarnings : c10::WarningHandler {
  std::vector<std::string> messages;
  void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
};

// Runs f (which may throw data::Cancelled after python_interrupt_check fired) without the GIL;
// then raises the pending KeyboardInterrupt, or issues the collected warnings.
template <typename F>
auto run_cancellable(F&& f) -> decltype(f()) {
  using R = decltype(f());
  CollectWarnings warnings;
  std::optional<R> result;
  bool cancelled = false;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    py::gil_scoped_release release;
    // Cancelled is a std::runtime_error: catch it before core_call translates those.
    result.emplace(core_call([&]() -> R {
      try {
        return f();
      } catch (const data::Cancelled&) {
        cancelled = true;
        return R{};
      }
    }));
  }
  if (cancelled) {
    if (PyErr_Occurred() != nullptr) throw py::error_already_set();
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
  for (const auto& m : warnings.messages) {
    if (PyErr_WarnEx(PyExc_UserWarning, m.c_str(), 1) != 0) throw py::error_already_set();
  }
  return std::move(*result);
}

py::dict stats_dict(const data::LoaderStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["skipped"] = s.skipped;
  d["elapsed_s"] = s.elapsed_s;
  d["samples_per_s"] = s.samples_per_s;
  d["read_s"] = s.read_s;
  d["decode_s"] = s.decode_s;
  d["transform_s"] = s.transform_s;
  d["collate_s"] = s.collate_s;
  d["copy_s"] = s.copy_s;
  d["consumer_wait_s"] = s.consumer_wait_s;
  d["mean_ready_batches"] = s.mean_ready_batches;
  d["ready_batches"] = s.ready_batches;
  d["slots"] = s.slots;
  d["last_error"] = s.last_error;
  return d;
}

}  // namespace

void bind_data(py::module_& m) {
  py::module_ d = m.def_submodule("data", "torchspeed.data native pieces (use torchspeed.data)");
  d.attr("with_jpeg") = data::jpeg_supported();

  py::class_<ImageTransformOptions>(d, "ImageTransformOptions")
      .def(py::init<>())
      .def_property(
          "crop",
          [](const ImageTransformOptions& o) { return std::string(data::crop_mode_name(o.mode)); },
          [](ImageTransformOptions& o, const std::string& s) {
            o.mode = core_call([&] { return data::parse_crop_mode(s); });
          })
      .def_readwrite("height", &ImageTransformOptions::height)
      .def_readwrite("width", &ImageTransformOptions::width)
      .def_readwrite("resize_size", &ImageTransformOptions::resize_size)
      .def_readwrite("scale", &ImageTransformOptions::scale)
      .def_readwrite("ratio", &ImageTransformOptions::ratio)
      .def_readwrite("flip_prob", &ImageTransformOptions::flip_prob)
      .def_property(
          "decode_scaling",
          [](const ImageTransformOptions& o) {
            return data::decode_scaling_name(o.decode_scaling);
          },
          [](ImageTransformOptions& o, const py::object& v) {
            o.decode_scaling = core_call([&] { return decode_scaling_from(v); });
          })
      .def_readwrite("max_image_pixels", &ImageTransformOptions::max_image_pixels)
      .def_readwrite("to_float", &ImageTransformOptions::to_float)
      .def_readwrite("normalize", &ImageTransformOptions::normalize)
      .def_readwrite("mean", &ImageTransformOptions::mean)
      .def_readwrite("std", &ImageTransformOptions::std)
      .def_readwrite("channels_last", &ImageTransformOptions::channels_last)
      .def("validate", [](const ImageTransformOptions& o) {
        core_call([&] { data::validate_transform_options(o); });
      });

  py::class_<data::Source, std::shared_ptr<data::Source>>(d, "Source")
      .def("__len__", [](const data::Source& s) { return s.size(); })
      .def("field_names",
           [](const data::Source& s) {
             std::vector<std::string> names;
             for (const auto& f : s.fields()) names.push_back(f.name);
             return names;
           })
      .def("describe", [](const data::Source& s, int64_t i) {
        TORCH_CHECK(i >= 0 && i < s.size(),
                    "torchspeed.data.Source.describe: index must be in [0, ", s.size(), "), got ",
                    i);
        return s.describe(i);
      });

  d.def(
      "webdataset_source",
      [](const std::vector<std::string>& urls, const std::vector<std::string>& fields,
         const ImageTransformOptions& image) {
        data::WebDatasetOptions o;
        o.urls = urls;
        o.fields = fields;
        o.image = image;
        o.should_stop = python_interrupt_check();
        // Indexing reads every shard's headers: no GIL, but Ctrl-C stops it.
        return run_cancellable([&] { return data::webdataset_source(o); });
      },
      py::arg("urls"), py::arg("fields"), py::arg("image"));
  d.def("npy_source", &data::npy_source, py::arg("name_and_path"));
  d.def("tensor_source", &data::tensor_source, py::arg("name_and_tensor"));

  py::class_<data::LoaderOptions>(d, "LoaderOptions")
      .def(py::init<>())
      .def_readwrite("batch_size", &data::LoaderOptions::batch_size)
      .def_readwrite("shuffle", &data::LoaderOptions::shuffle)
      .def_readwrite("drop_last", &data::LoaderOptions::drop_last)
      .def_readwrite("num_workers", &data::LoaderOptions::num_workers)
      .def_readwrite("prefetch_factor", &data::LoaderOptions::prefetch_factor)
      .def_readwrite("pin_memory", &data::LoaderOptions::pin_memory)
      .def_readwrite("timeout_s", &data::LoaderOptions::timeout_s)
      .def_readwrite("seed", &data::LoaderOptions::seed)
      .def_readwrite("on_error", &data::LoaderOptions::on_error)
      .def_readwrite("rank", &data::LoaderOptions::rank)
      .def_readwrite("world_size", &data::LoaderOptions::world_size)
      .def_readwrite("drop_uneven", &data::LoaderOptions::drop_uneven)
      .def_readwrite("device", &data::LoaderOptions::device);

  py::class_<data::Loader>(d, "Loader")
      .def(py::init([](std::shared_ptr<data::Source> src, const data::LoaderOptions& o) {
             return std::make_unique<data::Loader>(std::move(src), o);
           }),
           py::arg("source"), py::arg("options"))
      .def("start_epoch", &data::Loader::start_epoch, py::call_guard<py::gil_scoped_release>())
      .def("next",
           [](data::Loader& self) -> py::object {
             // Waits without the GIL; Ctrl-C (or a raising signal handler) stops the wait.
             const auto should_stop = python_interrupt_check();
             std::optional<data::Batch> batch =
                 run_cancellable([&] { return self.next(should_stop); });
             if (!batch) return py::none();
             data::Batch& b = *batch;
             py::dict out;
             for (auto& [k, t] : b.tensors) out[py::str(k)] = py::cast(t);
             for (auto& [k, v] : b.strings) out[py::str(k)] = str_list(v);
             return py::make_tuple(out, b.index, b.sample_indices);
           })
      .def("set_epoch", &data::Loader::set_epoch, py::call_guard<py::gil_scoped_release>())
      .def("set_indices", &data::Loader::set_indices)
      .def("clear_indices", &data::Loader::clear_indices)
      .def_property_readonly("epoch", &data::Loader::epoch)
      .def("num_batches", &data::Loader::num_batches)
      .def("dataset_size", &data::Loader::dataset_size)
      .def("state_dict", &data::Loader::state_dict)
      .def("load_state_dict", &data::Loader::load_state_dict,
           py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const data::Loader& l) { return stats_dict(l.stats()); })
      .def("reset_stats", &data::Loader::reset_stats)
      .def("shutdown", &data::Loader::shutdown, py::call_guard<py::gil_scoped_release>());

  // ---- pieces of the image pipeline, for tests and references
  d.def(
      "draw_image_params",
      [](const ImageTransformOptions& o, int width, int height, bool is_jpeg, uint64_t seed,
         uint64_t epoch, uint64_t index) {
        const data::ImageDraw dr =
            data::draw_image_params(o, width, height, is_jpeg, seed, epoch, index);
        py::dict r;
        r["top"] = dr.crop_top;
        r["left"] = dr.crop_left;
        r["height"] = dr.crop_height;
        r["width"] = dr.crop_width;
        r["flip"] = dr.flip;
        r["scale_denom"] = dr.scale_denom;
        r["resize_width"] = dr.resize_width;
        r["resize_height"] = dr.resize_height;
        return r;
      },
      py::arg("options"), py::arg("width"), py::arg("height"), py::arg("is_jpeg"), py::arg("seed"),
      py::arg("epoch"), py::arg("index"),
      "The crop/flip/decode-scale draws the loader makes for sample `index` of `epoch`.");
  d.def(
      "decode_image",
      [](const py::bytes& buf, int scale_denom, int64_t max_image_pixels) {
        TORCH_CHECK(max_image_pixels >= 0,
                    "torchspeed.data.decode_image: max_image_pixels must be >= 0 (0 = no limit), ",
                    "got ", max_image_pixels);
        const std::string s = as_bytes(buf);
        data::RgbImage img;
        core_call([&] {
          data::decode_image(reinterpret_cast<const uint8_t*>(s.data()), s.size(), scale_denom,
                             &img, max_image_pixels);
        });
        at::Tensor t = at::empty({img.height, img.width, 3}, at::kByte);
        std::memcpy(t.data_ptr(), img.pixels.data(), img.pixels.size());
        return t;
      },
      py::arg("data"), py::arg("scale_denom") = 1,
      py::arg("max_image_pixels") = data::kDefaultMaxImagePixels,
      "Decode JPEG/PNG bytes (format sniffed from the bytes) to an HWC uint8 tensor.");
  d.def(
      "process_image",
      [](const py::bytes& buf, ImageTransformOptions o, uint64_t seed, uint64_t epoch,
         uint64_t index) {
        if (o.normalize) o.to_float = true;
        core_call([&] { data::validate_transform_options(o); });
        const std::string s = as_bytes(buf);
        std::vector<int64_t> shape = o.channels_last ? std::vector<int64_t>{o.height, o.width, 3}
                                                     : std::vector<int64_t>{3, o.height, o.width};
        at::Tensor t = at::empty(shape, o.to_float ? at::kFloat : at::kByte);
        core_call([&] {
          data::process_image(reinterpret_cast<const uint8_t*>(s.data()), s.size(), o, seed, epoch,
                              index, t.data_ptr());
        });
        return t;
      },
      py::arg("data"), py::arg("options"), py::arg("seed"), py::arg("epoch"), py::arg("index"),
      "The loader's whole per-image pipeline for one sample.");
  d.def(
      "resample_bilinear",
      [](const at::Tensor& img, std::vector<float> box, int out_w, int out_h) {
        TORCH_CHECK(img.dim() == 3 && img.size(2) == 3 && img.scalar_type() == at::kByte,
                    "torchspeed.data.resample_bilinear: img must be HWC uint8 RGB, got ",
                    img.sizes(), " ", img.scalar_type());
        TORCH_CHECK(box.size() == 4, "torchspeed.data.resample_bilinear: box must have 4 values");
        at::Tensor src = img.contiguous();
        at::Tensor out = at::empty({out_h, out_w, 3}, at::kByte);
        core_call([&] {
          data::resample_bilinear(src.data_ptr<uint8_t>(), static_cast<int>(src.size(1)),
                                  static_cast<int>(src.size(0)), box.data(), out_w, out_h, 0, 0,
                                  out_w, out_h, out.data_ptr<uint8_t>());
        });
        return out;
      },
      py::arg("img"), py::arg("box"), py::arg("width"), py::arg("height"),
      "Pillow-compatible BILINEAR resize of the float box of an HWC uint8 image.");
  d.def(
      "write_shard_index",
      [](const std::string& shard) {
        const auto should_stop = python_interrupt_check();
        return run_cancellable([&] { return data::write_shard_index(shard, should_stop); });
      },
      py::arg("shard"), "Index a tar shard and write '<shard>.idx'; returns the sample count.");
  d.def(
      "shard_keys",
      [](const std::string& shard) {
        const auto should_stop = python_interrupt_check();
        return run_cancellable([&] {
          data::ReadOnlyFile f(shard);
          const data::ShardIndex idx = data::index_shard_file(f, should_stop);
          std::vector<std::pair<std::string, std::vector<std::string>>> out;
          for (const auto& s : idx.samples) {
            std::vector<std::string> exts;
            for (const auto& fl : s.fields) exts.push_back(fl.ext);
            out.emplace_back(s.key, exts);
          }
          return out;
        });
      },
      py::arg("shard"), "(key, [extensions]) of every sample in a tar shard, in order.");
}

}  // namespace torchspeed::python
