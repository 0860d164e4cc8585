// SPDX-License-Identifier: Apache-2.0
// _ringloader: the C++ client (client/client.h) as a Python extension. The `ringloader` package
// wraps it; this layer only converts: dicts to StreamOptions, Batch views to numpy arrays whose
// memory is the ring slot itself, client::Error to ringloader.errors classes. Reconnects, exact
// resume, copy-outs and fork safety all stay in the C++ client.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "client/client.h"
#include "client/internal.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "ringloader_version.h"

namespace py = pybind11;

namespace ringloader::python {
namespace {

using client::Batch;
using client::DType;
using client::Error;
using client::ErrorCode;
using client::Position;
using client::StreamOptions;
using client::TensorView;

// How long one wait inside Stream.next() lasts before Python's signal handlers get a turn:
// Ctrl-C in a notebook is answered within this (plus one RPC).
constexpr std::chrono::milliseconds kSignalPoll{200};

[[noreturn]] void Fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

// ---- daemon stats: a protobuf message as plain Python values ----

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

py::dict DictOfMessage(const Message& message);

// Strings as Python str; bytes that are not UTF-8 (a file name on a Linux file system may be
// anything) decoded with surrogateescape, as os.fsdecode does, so os.fsencode gives them back.
py::str Text(const std::string& s) {
  PyObject* text = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()),
                                        "surrogateescape");
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

// Field `f` of `m` (element `i` of a repeated field, or -1 for a singular one).
py::object FieldValue(const Message& m, const FieldDescriptor* f, int i) {
  const Reflection* r = m.GetReflection();
  const bool rep = i >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return py::int_(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return py::int_(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return py::int_(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return py::int_(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return py::float_(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return py::float_(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return py::bool_(rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f));
    case FieldDescriptor::CPPTYPE_ENUM:
      return Text(rep ? r->GetRepeatedEnum(m, f, i)->name() : r->GetEnum(m, f)->name());
    case FieldDescriptor::CPPTYPE_STRING:
      return Text(rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f));
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return DictOfMessage(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f));
  }
  return py::none();
}

// Every field, set or not (a counter at 0 is there as 0); maps as dicts, repeated as lists.
py::dict DictOfMessage(const Message& m) {
  py::dict out;
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const Reflection* r = m.GetReflection();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    if (f->is_map()) {
      py::dict map;
      const FieldDescriptor* key = f->message_type()->map_key();
      const FieldDescriptor* value = f->message_type()->map_value();
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        const Message& entry = r->GetRepeatedMessage(m, f, i);
        map[FieldValue(entry, key, -1)] = FieldValue(entry, value, -1);
      }
      out[Text(f->name())] = std::move(map);
    } else if (f->is_repeated()) {
      py::list list;
      for (int i = 0; i < r->FieldSize(m, f); ++i) list.append(FieldValue(m, f, i));
      out[Text(f->name())] = std::move(list);
    } else {
      out[Text(f->name())] = FieldValue(m, f, -1);
    }
  }
  return out;
}

// ---- options ----

// An integer option: anything with __index__ (int, numpy's integers) but bool, within T's range;
// otherwise InvalidArgument naming the option, the range and the value.
template <typename T>
T IntegerOf(const char* key, const py::object& value) {
  constexpr auto kMin = std::numeric_limits<T>::min();
  constexpr auto kMax = std::numeric_limits<T>::max();
  const auto bad = [&]() {
    Fail(ErrorCode::kInvalidArgument,
         std::string(key) + ": must be an integer in [" + std::to_string(kMin) + ", " +
             std::to_string(kMax) + "], got " + std::string(py::repr(value)));
  };
  if (PyBool_Check(value.ptr())) bad();
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    bad();
  }
  const py::object number = py::reinterpret_steal<py::object>(index);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(number.ptr(), &overflow);
  if (overflow < 0 || (overflow == 0 && (v < static_cast<long long>(kMin)))) bad();
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(number.ptr());
    if (PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      bad();
    }
    if (u > static_cast<unsigned long long>(kMax)) bad();
    return static_cast<T>(u);
  }
  if (v >= 0 && static_cast<unsigned long long>(v) > static_cast<unsigned long long>(kMax)) bad();
  return static_cast<T>(v);
}

template <typename T>
T Take(py::dict& d, const char* key, T fallback) {
  if (!d.contains(key)) return fallback;
  py::object value = d[key];
  PyDict_DelItemString(d.ptr(), key);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return IntegerOf<T>(key, value);
  } else {
    try {
      return value.cast<T>();
    } catch (const py::cast_error&) {
      Fail(ErrorCode::kInvalidArgument,
           std::string(key) + ": has the wrong type (" +
               std::string(py::str(value.get_type().attr("__name__"))) + ")");
    }
  }
}

template <typename E>
E TakeEnum(py::dict& d, const char* key, E fallback,
           std::initializer_list<std::pair<const char*, E>> names) {
  if (!d.contains(key)) return fallback;
  const std::string text = Take<std::string>(d, key, "");
  std::string allowed;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    allowed += (allowed.empty() ? "'" : ", '") + std::string(name) + "'";
  }
  Fail(ErrorCode::kInvalidArgument,
       std::string(key) + ": must be one of " + allowed + ", got '" + text + "'");
}

Position PositionOf(const py::dict& d) {
  Position p;
  p.epoch = IntegerOf<uint64_t>("start.epoch", d["epoch"]);
  p.sequence = IntegerOf<uint64_t>("start.sequence", d["sequence"]);
  p.cursor = IntegerOf<uint64_t>("start.cursor", d["cursor"]);
  return p;
}

client::EpochProgress ProgressOf(const py::dict& d) {
  client::EpochProgress p;
  p.prefix = IntegerOf<uint64_t>("start_progress.prefix", d["prefix"]);
  for (py::handle v : d["beyond"].cast<py::list>()) {
    p.beyond.push_back(IntegerOf<uint64_t>("start_progress.beyond", py::reinterpret_borrow<py::object>(v)));
  }
  return p;
}

py::dict DictOf(const client::EpochProgress& p) {
  py::dict d;
  d["prefix"] = p.prefix;
  d["beyond"] = p.beyond;
  return d;
}

client::SavedWorld SavedWorldOf(const py::dict& d) {
  client::SavedWorld w;
  w.world_size = IntegerOf<uint32_t>("saved_world.world_size", d["world_size"]);
  w.drop_last = d["drop_last"].cast<bool>();
  for (py::handle v : d["cursors"].cast<py::list>()) {
    w.cursors.push_back(IntegerOf<uint64_t>("saved_world.cursors", py::reinterpret_borrow<py::object>(v)));
  }
  return w;
}

py::object DictOf(const client::SavedWorld& w) {
  if (w.world_size == 0) return py::none();
  py::dict d;
  d["world_size"] = w.world_size;
  d["drop_last"] = w.drop_last;
  d["cursors"] = w.cursors;
  return d;
}

py::dict DictOf(const Position& p) {
  py::dict d;
  d["epoch"] = p.epoch;
  d["sequence"] = p.sequence;
  d["cursor"] = p.cursor;
  return d;
}

// StreamOptions from the keys the Python package uses; an unknown key is an error (a typo must
// not be ignored).
StreamOptions OptionsOf(const py::dict& in) {
  auto d = py::reinterpret_steal<py::dict>(PyDict_Copy(in.ptr()));  // a copy we may consume
  if (!d) throw py::error_already_set();
  StreamOptions o;
  o.dataset = Take<std::string>(d, "dataset", "");
  o.batch_size = Take<uint32_t>(d, "batch_size", o.batch_size);
  o.seed = Take<uint64_t>(d, "seed", o.seed);
  o.rank = Take<uint32_t>(d, "rank", o.rank);
  o.world_size = Take<uint32_t>(d, "world_size", o.world_size);
  o.image_size = Take<uint32_t>(d, "image_size", o.image_size);
  o.augment = TakeEnum(d, "augment", o.augment,
                       {{"train", client::Augment::kTrain}, {"eval", client::Augment::kEval}});
  o.dtype = TakeEnum(d, "dtype", o.dtype, {{"uint8", DType::kUint8}, {"float32", DType::kFloat32}});
  o.layout = TakeEnum(d, "layout", o.layout,
                      {{"NHWC", client::Layout::kNHWC}, {"NCHW", client::Layout::kNCHW}});
  o.resize = TakeEnum(d, "resize", o.resize,
                      {{"fast", client::Resize::kFast}, {"exact", client::Resize::kExact}});
  o.shuffle = Take<bool>(d, "shuffle", o.shuffle);
  o.drop_last = Take<bool>(d, "drop_last", o.drop_last);
  o.end_epoch = Take<uint64_t>(d, "end_epoch", o.end_epoch);
  o.mean = Take<std::vector<float>>(d, "mean", {});
  o.std = Take<std::vector<float>>(d, "std", {});
  o.ring_slots = Take<uint32_t>(d, "ring_slots", o.ring_slots);
  o.client_name = Take<std::string>(d, "client_name", "");
  const double deadline_s = Take<double>(d, "reconnect_deadline", 60.0);
  if (!(deadline_s >= 0 && deadline_s < 1e7)) {
    Fail(ErrorCode::kInvalidArgument, "reconnect_deadline: must be seconds in [0, 1e7)");
  }
  o.reconnect_deadline = std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000));
  o.verify_checksums = Take<bool>(d, "verify_checksums", o.verify_checksums);
  o.writable_batches = Take<bool>(d, "writable_batches", o.writable_batches);
  o.dataset_fingerprint = Take<uint64_t>(d, "dataset_fingerprint", 0);
  o.restart_epoch_if_dataset_changed = Take<bool>(d, "restart_epoch_if_dataset_changed", false);
  if (d.contains("start")) {
    o.start = PositionOf(d["start"].cast<py::dict>());
    PyDict_DelItemString(d.ptr(), "start");
  }
  if (d.contains("start_progress")) {
    if (!d["start_progress"].is_none()) {
      o.start_progress = ProgressOf(d["start_progress"].cast<py::dict>());
    }
    PyDict_DelItemString(d.ptr(), "start_progress");
  }
  if (d.contains("saved_world")) {
    if (!d["saved_world"].is_none()) {
      o.saved_world = SavedWorldOf(d["saved_world"].cast<py::dict>());
    }
    PyDict_DelItemString(d.ptr(), "saved_world");
  }
  if (!d.empty()) {
    Fail(ErrorCode::kInvalidArgument,
         "unknown stream option '" + std::string(py::str(d.begin()->first)) + "'");
  }
  return o;
}

py::dict DictOf(const StreamOptions& o) {
  py::dict d;
  d["dataset"] = o.dataset;
  d["batch_size"] = o.batch_size;
  d["seed"] = o.seed;
  d["rank"] = o.rank;
  d["world_size"] = o.world_size;
  d["image_size"] = o.image_size;
  d["augment"] = o.augment == client::Augment::kEval ? "eval" : "train";
  d["dtype"] = client::DTypeName(o.dtype);
  d["layout"] = o.layout == client::Layout::kNCHW ? "NCHW" : "NHWC";
  d["resize"] = o.resize == client::Resize::kExact ? "exact" : "fast";
  d["shuffle"] = o.shuffle;
  d["drop_last"] = o.drop_last;
  d["end_epoch"] = o.end_epoch;
  d["mean"] = o.mean;
  d["std"] = o.std;
  d["ring_slots"] = o.ring_slots;
  d["dataset_fingerprint"] = o.dataset_fingerprint;
  d["start"] = DictOf(o.start);
  d["start_progress"] = DictOf(o.start_progress);
  d["saved_world"] = DictOf(o.saved_world);
  return d;
}

// ---- batches ----

// The Batch, shared by its Python object and every array viewing it: the slot is released when
// the last of them goes.
struct BatchBox {
  explicit BatchBox(Batch b) : batch(std::move(b)) {}
  Batch batch;
};

class PyBatch {
 public:
  PyBatch(Batch batch, bool writable)
      : box_(std::make_shared<BatchBox>(std::move(batch))), writable_(writable) {
    const Batch& b = box_->batch;
    size_ = b.size();
    position_ = b.position();
    next_ = b.next();
    last_in_epoch_ = b.last_in_epoch();
    for (const TensorView& t : b.tensors()) names_.push_back(t.name());
  }

  // A numpy array over one tensor of the slot; its base keeps the batch alive.
  py::array Array(const std::string& name) const {
    if (!box_) Fail(ErrorCode::kFailedPrecondition, "the batch was released");
    const TensorView& t = box_->batch.tensor(name);  // kNotFound names the tensors it has
    py::dtype dtype(client::DTypeName(t.dtype()));  // numpy spells them the same way
    auto* owner = new std::shared_ptr<BatchBox>(box_);
    py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<BatchBox>*>(p); });
    py::array array(dtype, t.shape(), {}, t.raw(), base);
    if (!writable_) array.attr("setflags")(py::arg("write") = false);
    return array;
  }

  // The batch's tensor names, in payload order (known without touching the slot again).
  const std::vector<std::string>& Names() const { return names_; }

  py::list Paths() const {
    if (!box_) Fail(ErrorCode::kFailedPrecondition, "the batch was released");
    py::list paths;
    for (uint32_t i = 0; i < size_; ++i) {
      paths.append(Text(std::string(box_->batch.relative_path(i))));
    }
    return paths;
  }

  // Gives the slot back now. Arrays still alive keep their bytes: the batch is copied out of the
  // ring first (at the same addresses), so nothing ever reads a later batch through them.
  void Release() {
    if (!box_) return;
    if (box_.use_count() > 1) box_->batch.Detach();
    box_.reset();
  }

  bool released() const { return !box_; }
  uint32_t size() const { return size_; }
  py::dict position() const { return DictOf(position_); }
  py::dict next() const { return DictOf(next_); }
  bool last_in_epoch() const { return last_in_epoch_; }

 private:
  std::shared_ptr<BatchBox> box_;  // shared with arrays; null once released
  const bool writable_;
  uint32_t size_ = 0;
  Position position_, next_;
  bool last_in_epoch_ = false;
  std::vector<std::string> names_;
};

// ---- streams ----

// A stream as Python sees it. Close() may come from another thread, or from a signal handler
// that runs inside Next()'s wait: the C++ stream is shared with a Next() in progress, which
// finds the stream closed when it next holds the GIL and raises instead of delivering, so the
// stream is never used after it is freed and no batch of a closed stream reaches Python.
// Every member is touched only with the GIL held.
class PyStream {
 public:
  explicit PyStream(std::unique_ptr<client::Stream> stream) : stream_(std::move(stream)) {}
  PyStream(PyStream&&) = default;
  ~PyStream() { Drop(std::move(stream_)); }

  // The next batch, or None at the end of the stream. Waits with the GIL released, in slices
  // of kSignalPoll so Ctrl-C raises KeyboardInterrupt at once; `timeout_s` bounds the whole
  // wait (rl.DeadlineExceeded; the stream goes on).
  std::optional<PyBatch> Next(std::optional<double> timeout_s) {
    const std::shared_ptr<client::Stream> stream = Get();  // ours for the whole call
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      std::chrono::milliseconds slice = kSignalPoll;
      if (timeout_s) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::duration<double>(*timeout_s) - (std::chrono::steady_clock::now() - start));
        if (left.count() <= 0) {
          Fail(ErrorCode::kDeadlineExceeded,
               "no batch within " + py::str(py::float_(*timeout_s)).cast<std::string>() + " s");
        }
        slice = std::min(slice, left);
      }
      std::optional<Batch> batch;
      bool waited_out = false;
      {
        py::gil_scoped_release unlocked;
        try {
          batch = stream->Next(slice);
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kDeadlineExceeded) throw;
          waited_out = true;
        }
      }
      CheckStillOpen(stream, batch);
      if (!waited_out) {
        if (!batch) return std::nullopt;
        return PyBatch(*std::move(batch), stream->options().writable_batches);
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      CheckStillOpen(stream, batch);  // a signal handler may have closed it
    }
  }

  // Closes the stream on the daemon now, or (when a Next() on another thread or under a signal
  // handler holds it) as soon as that Next() sees it closed, within kSignalPoll.
  void Close() { Drop(std::move(stream_)); }
  bool closed() const { return !stream_; }
  py::dict position() { return DictOf(Get()->position()); }
  std::string State() { return Get()->State(); }
  py::dict options() { return DictOf(Get()->options()); }
  uint64_t reconnects() { return Get()->reconnects(); }
  uint64_t copies() { return Get()->copies(); }
  double trainer_wait_seconds() {
    return std::chrono::duration<double>(Get()->trainer_wait()).count();
  }
  double trainer_step_seconds() {
    return std::chrono::duration<double>(Get()->trainer_step()).count();
  }
  double input_bound() { return Get()->input_bound(); }
  uint64_t dataset_fingerprint() { return Get()->dataset_fingerprint(); }
  py::dict start_progress() { return DictOf(Get()->start_progress()); }
  uint64_t dataset_size() { return Get()->dataset_size(); }
  uint64_t samples_per_epoch() { return Get()->samples_per_epoch(); }
  uint64_t batches_per_epoch() { return Get()->batches_per_epoch(); }

 private:
  const std::shared_ptr<client::Stream>& Get() const {
    if (!stream_) Fail(ErrorCode::kFailedPrecondition, "the stream is closed");
    return stream_;
  }

  // After a wait: if Close() came meanwhile, the batch goes back and the caller hears why.
  void CheckStillOpen(const std::shared_ptr<client::Stream>& stream, std::optional<Batch>& batch) {
    if (stream_ == stream) return;
    {
      py::gil_scoped_release unlocked;
      batch.reset();  // gives its slot back
    }
    Fail(ErrorCode::kFailedPrecondition,
         "the stream was closed while next() waited for a batch (by another thread or a signal "
         "handler): nothing was taken, so state_dict() resumes with the batch it waited for");
  }

  // Lets go of a stream; the last owner closes it on the daemon (an RPC: without the GIL).
  static void Drop(std::shared_ptr<client::Stream> stream) {
    if (!stream) return;
    py::gil_scoped_release unlocked;
    stream.reset();
  }

  std::shared_ptr<client::Stream> stream_;  // null once closed
};

// ---- errors ----

// client::Error -> the ringloader.errors class for its code, with the library's message.
void TranslateErrors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    py::object errors = py::module_::import("ringloader.errors");
    py::object cls = errors.attr("error_class")(client::ErrorCodeName(e.code()));
    PyErr_SetObject(cls.ptr(), py::str(e.what()).ptr());
  }
}

}  // namespace
}  // namespace ringloader::python

PYBIND11_MODULE(_ringloader, m) {
  using namespace ringloader::python;
  namespace client = ringloader::client;
  m.doc() = "ringloader's C++ client (use the ringloader package, not this module)";
  m.attr("__version__") = RINGLOADER_VERSION;
  py::register_exception_translator(TranslateErrors);

  py::class_<PyBatch>(m, "Batch")
      .def("array", &PyBatch::Array, py::arg("name"))
      .def("paths", &PyBatch::Paths)
      .def_property_readonly("names", &PyBatch::Names)
      .def("release", &PyBatch::Release)
      .def_property_readonly("released", &PyBatch::released)
      .def_property_readonly("size", &PyBatch::size)
      .def_property_readonly("position", &PyBatch::position)
      .def_property_readonly("next", &PyBatch::next)
      .def_property_readonly("last_in_epoch", &PyBatch::last_in_epoch);

  py::class_<PyStream>(m, "Stream")
      .def("next", &PyStream::Next, py::arg("timeout") = py::none())
      .def("close", &PyStream::Close)
      .def_property_readonly("closed", &PyStream::closed)
      .def_property_readonly("position", &PyStream::position)
      .def("state", &PyStream::State)
      .def_property_readonly("options", &PyStream::options)
      .def_property_readonly("reconnects", &PyStream::reconnects)
      .def_property_readonly("copies", &PyStream::copies)
      .def_property_readonly("trainer_wait_seconds", &PyStream::trainer_wait_seconds)
      .def_property_readonly("trainer_step_seconds", &PyStream::trainer_step_seconds)
      .def_property_readonly("input_bound", &PyStream::input_bound)
      .def_property_readonly("dataset_fingerprint", &PyStream::dataset_fingerprint)
      .def_property_readonly("start_progress", &PyStream::start_progress)
      .def_property_readonly("dataset_size", &PyStream::dataset_size)
      .def_property_readonly("samples_per_epoch", &PyStream::samples_per_epoch)
      .def_property_readonly("batches_per_epoch", &PyStream::batches_per_epoch);

  py::class_<client::Client, std::shared_ptr<client::Client>>(m, "Client")
      .def(py::init<std::string>(), py::arg("endpoint"))
      .def_property_readonly("endpoint", &client::Client::endpoint)
      .def(
          "open",
          [](client::Client& c, py::dict options) {
            client::StreamOptions o = OptionsOf(options);
            std::unique_ptr<client::Stream> stream;
            try {
              py::gil_scoped_release unlocked;
              // Ctrl-C while the daemon is absent: the open stops within kSignalPoll and the
              // signal's exception (KeyboardInterrupt) is raised, as in Stream.next().
              stream = c.Open(o, [] {
                py::gil_scoped_acquire locked;
                return PyErr_CheckSignals() != 0;
              });
            } catch (const Error& e) {
              if (e.code() == ErrorCode::kCancelled && PyErr_Occurred()) {
                throw py::error_already_set();
              }
              throw;
            }
            return PyStream(std::move(stream));
          },
          py::arg("options"), py::keep_alive<0, 1>());

  m.def("default_endpoint", &client::DefaultEndpoint);
  m.def(
      "health",
      [](const std::string& endpoint, double timeout_s) {
        py::gil_scoped_release unlocked;
        return client::HealthStatus(
            endpoint, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
      },
      py::arg("endpoint"), py::arg("timeout") = 2.0);
  m.def(
      "daemon_stats",
      [](const std::string& endpoint, double timeout_s) {
        ringloader::v1::GetStatsResponse stats;
        {
          py::gil_scoped_release unlocked;
          stats = client::FetchDaemonStats(
              endpoint, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
        }
        return DictOfMessage(stats);
      },
      py::arg("endpoint"), py::arg("timeout") = 10.0);
  m.def("validate_options", [](py::dict options) { client::ValidateOptions(OptionsOf(options)); });
  m.def("parse_state", [](const std::string& state) {
    const client::ResumeState parsed = client::ParseState(state);
    py::dict d = DictOf(parsed.options);
    d["world_cursors"] = parsed.world_cursors;
    return d;
  });
  m.def("continue_state", [](const std::string& state, py::dict options) {
    const client::Continuation c =
        client::ContinueState(client::ParseState(state), OptionsOf(options));
    py::dict d;
    d["start"] = DictOf(c.options.start);
    d["start_progress"] = DictOf(c.options.start_progress);
    d["saved_world"] = DictOf(c.options.saved_world);
    d["dataset_fingerprint"] = c.options.dataset_fingerprint;
    d["warning"] = c.warning;
    return d;
  });
  m.def("combine_states", &client::CombineStates);
  m.def("format_state", [](py::dict options) {
    client::StreamOptions o = OptionsOf(options);
    return client::FormatState(o, o.start);  // o.start_progress: of o.start.epoch
  });
}
