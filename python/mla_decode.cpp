// Python bindings of the public C++ API (include/mla/): LayerConfig, weights, Layer and its four calls.
//
// Tensors are any object with __dlpack__ (torch, CuPy, JAX, numpy: host or device memory, bf16 and
// float8_e4m3fn included), __cuda_array_interface__ or the buffer protocol, read as views without a
// copy. numpy has no bf16 or fp8 dtype: an argument that takes bf16 also accepts 2-byte integers
// (the raw bits) and one that takes fp8 e4m3 1-byte integers; f32, i32 and i64 must be exactly
// those. Every view is checked by the library as in
// C++ (mla::Error -> mla_decode.Error, a ValueError, naming the argument, expected and actual
// values) before anything is written. The calls release the GIL; CUDA calls are asynchronous on
// the layer's stream, so the caller keeps the tensors alive until it synchronizes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mla/checkpoint.hpp"
#include "mla/mla.hpp"

namespace py = pybind11;
using namespace mla;

namespace {

// What an argument may hold: the library's dtypes by element size (bf16 / fp8 args) or exactly.
struct Accepts {
  std::vector<DType> dtypes;  // tried in order: the first whose element size and kind fit
};

// kind: 'f' IEEE float, 'i' / 'u' integers, 'V' raw bytes, 'b' bfloat16 and 'e' float8 e4m3fn (DLPack).
bool kind_fits(DType dt, char kind, int64_t itemsize) {
  if (int64_t(dtype_size(dt)) != itemsize) return false;
  switch (dt) {
    case DType::f32: case DType::f64: case DType::f16: return kind == 'f';
    case DType::i32: case DType::i64: return kind == 'i';
    case DType::bf16: return kind == 'b' || kind == 'u' || kind == 'i' || kind == 'V';  // or raw 16-bit words
    case DType::fp8_e4m3: return kind == 'e' || kind == 'u' || kind == 'i' || kind == 'V';
    case DType::u8: return kind == 'u';
  }
  return false;
}

// DLPack's C ABI (dlpack.h, v0.8 - 1.x unversioned capsules): only what a consumer reads.
struct DLDevice { int32_t device_type, device_id; };  // 1 CPU, 2 CUDA, 3 CUDA host
struct DLDataType { uint8_t code, bits; uint16_t lanes; };  // code 0 int, 1 uint, 2 float, 4 bfloat, 10 float8_e4m3fn
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: row-major contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

std::string accepts_str(const Accepts& a) {
  std::string s;
  for (DType dt : a.dtypes) s += (s.empty() ? "" : " or ") + std::string(dtype_name(dt));
  return s;
}

// One tensor argument as a TensorView. `what` names it in errors; `writable`: an output.
TensorView view_of(const py::handle& obj, const Accepts& accepts, const char* what, bool writable,
                   const Layer* layer) {
  MLA_REQUIRE(!obj.is_none(), what, ": expected a tensor (", accepts_str(accepts), "), got None");
  int64_t itemsize = 0;
  char kind = 0;
  std::vector<int64_t> shape, byte_strides;
  void* data = nullptr;
  bool readonly = false;
  Device device = Device::cpu;
  int device_index = layer ? layer->options().cuda_device : 0;
  // DLPack first (it carries bf16 and fp8); numpy cannot export a read-only array through it, and
  // such an object falls through to the interfaces below. The capsule stays unconsumed: its
  // destructor releases the producer's reference, while the caller's object keeps the memory alive.
  py::object capsule;
  if (py::hasattr(obj, "__dlpack__")) {
    try {
      const bool cuda = layer && layer->device() == Device::cuda;
      const uintptr_t stream = cuda ? reinterpret_cast<uintptr_t>(layer->options().cuda_stream) : 0;
      // The consumer's stream (1: the legacy default one), so the producer orders its work before ours.
      capsule = cuda ? obj.attr("__dlpack__")(py::arg("stream") = stream ? stream : 1) : obj.attr("__dlpack__")();
    } catch (const py::error_already_set&) {
      capsule = py::object();
    }
  }
  if (capsule && PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    const auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    const DLTensor& t = managed->dl_tensor;
    MLA_REQUIRE(t.dtype.lanes == 1, what, ": DLPack dtype with ", t.dtype.lanes, " lanes");
    itemsize = t.dtype.bits / 8;
    kind = t.dtype.code == 0 ? 'i' : t.dtype.code == 1 ? 'u' : t.dtype.code == 2 ? 'f' : t.dtype.code == 4 ? 'b'
         : t.dtype.code == 10 ? 'e' : '?';
    shape.assign(t.shape, t.shape + t.ndim);
    if (t.strides)
      for (int d = 0; d < t.ndim; ++d) byte_strides.push_back(t.strides[d] * itemsize);
    data = static_cast<char*>(t.data) + t.byte_offset;
    MLA_REQUIRE(t.device.device_type == 1 || t.device.device_type == 2 || t.device.device_type == 3, what,
                ": DLPack device type ", t.device.device_type, " is neither CPU nor CUDA");
    device = t.device.device_type == 2 ? Device::cuda : Device::cpu;
    if (device == Device::cuda) device_index = t.device.device_id;
  } else if (py::hasattr(obj, "__cuda_array_interface__")) {
    const py::dict cai = obj.attr("__cuda_array_interface__");
    const std::string typestr = py::str(cai["typestr"]);
    MLA_REQUIRE(typestr.size() >= 3 && typestr[0] != '>', what, ": typestr '", typestr, "' is not little-endian");
    kind = typestr[1];
    itemsize = std::stoll(typestr.substr(2));
    for (auto d : cai["shape"]) shape.push_back(d.cast<int64_t>());
    const py::tuple ptr = cai["data"];
    data = reinterpret_cast<void*>(ptr[0].cast<uintptr_t>());
    readonly = ptr[1].cast<bool>();
    if (cai.contains("strides") && !cai["strides"].is_none())
      for (auto d : cai["strides"]) byte_strides.push_back(d.cast<int64_t>());
    device = Device::cuda;
  } else {
    py::buffer_info info;
    try {
      info = py::reinterpret_borrow<py::buffer>(obj).request(writable);
    } catch (const py::error_already_set&) {
      detail::fail(what, ": expected an array (buffer protocol or __cuda_array_interface__)",
                   writable ? ", writable" : "", ", got ", std::string(py::str(py::type::handle_of(obj))));
    }
    itemsize = info.itemsize;
    const std::string& fmt = info.format;
    const char c = fmt.empty() ? 0 : fmt.back();
    kind = (c == 'f' || c == 'd' || c == 'e') ? 'f'
           : (c == 'B' || c == 'H' || c == 'I' || c == 'L' || c == 'Q') ? 'u'
           : (c == 'b' || c == 'h' || c == 'i' || c == 'l' || c == 'q') ? 'i'
                                                                        : 'V';
    shape.assign(info.shape.begin(), info.shape.end());
    byte_strides.assign(info.strides.begin(), info.strides.end());
    data = info.ptr;
    readonly = info.readonly;
  }
  MLA_REQUIRE(!(writable && readonly), what, ": the output array is read-only");
  MLA_REQUIRE(int(shape.size()) >= 1 && int(shape.size()) <= kMaxRank, what, ": rank ", shape.size(),
              " is not in [1, ", kMaxRank, "]");
  std::optional<DType> dtype;
  for (DType dt : accepts.dtypes)
    if (kind_fits(dt, kind, itemsize)) {
      dtype = dt;
      break;
    }
  MLA_REQUIRE(dtype.has_value(), what, ": expected ", accepts_str(accepts), " elements, got kind '", kind,
              "' of ", itemsize, " bytes");
  // Row-major unless the producer gave strides (bytes there, elements here).
  TensorView v = TensorView::contiguous(data, *dtype, shape, device, device_index);
  for (int d = 0; d < v.rank && !byte_strides.empty(); ++d) {
    MLA_REQUIRE(byte_strides[d] % itemsize == 0, what, ": stride ", byte_strides[d], " bytes of dim ", d,
                " is not a multiple of the element size ", itemsize);
    v.stride[d] = byte_strides[d] / itemsize;
  }
  return v;
}

const Accepts kBf16{{DType::bf16}}, kF32{{DType::f32}}, kI32{{DType::i32}}, kI64{{DType::i64}};
const Accepts kQuery{{DType::fp8_e4m3, DType::bf16}};  // by element size: 1 -> fp8, 2 -> bf16
const Accepts kO{{DType::f32, DType::bf16}};

DType dtype_from(const std::string& s) {
  if (s == "fp8" || s == "fp8_e4m3") return DType::fp8_e4m3;
  if (s == "bf16") return DType::bf16;
  detail::fail("q_dtype: expected 'fp8' or 'bf16', got '", s, "'");
}

Backend backend_from(const std::string& s) {
  if (s == "auto") return Backend::automatic;
  if (s == "cpu") return Backend::cpu;
  if (s == "cuda") return Backend::cuda;
  detail::fail("backend: expected 'auto', 'cpu' or 'cuda', got '", s, "'");
}

// The step's metadata from its four arrays (host or device, as the layer's backend wants them),
// and a host copy of seq_lens (the CUDA backend plans splits from it when it has one): the
// StepMeta's seq_lens_host span points into host_lens, so it is made where it is used (step()),
// never carried across a copy or move of the Meta.
struct Meta {
  StepMeta views;
  std::vector<int32_t> host_lens;
  StepMeta step() const {
    StepMeta m = views;
    if (!host_lens.empty()) m.seq_lens_host = host_lens;
    return m;
  }
};
Meta meta_of(const Layer& layer, int qlen, const py::handle& seq_lens, const py::handle& kv_indptr,
             const py::handle& kv_indices, const py::handle& slot_mapping, const py::handle& seq_lens_host) {
  Meta m;
  m.views.qlen = qlen;
  m.views.seq_lens = view_of(seq_lens, kI32, "seq_lens", false, &layer);
  m.views.kv_indptr = view_of(kv_indptr, kI32, "kv_indptr", false, &layer);
  m.views.kv_indices = view_of(kv_indices, kI32, "kv_indices", false, &layer);
  m.views.slot_mapping =
      slot_mapping.is_none() ? TensorView{} : view_of(slot_mapping, kI64, "slot_mapping", false, &layer);
  if (!seq_lens_host.is_none()) m.host_lens = seq_lens_host.cast<std::vector<int32_t>>();
  return m;
}

KVCache cache_of(const Layer& layer, const py::handle& cache) {
  return KVCache{.pages = view_of(cache, kQuery, "cache", true, &layer)};
}

}  // namespace

PYBIND11_MODULE(mla_decode, m) {
  m.doc() = "MLA decode (pre / attend / post) over a paged fp8 or bf16 KV cache: the C++ library's Layer.";
  py::register_exception<Error>(m, "Error", PyExc_ValueError);

  py::enum_<GateLayout>(m, "GateLayout")
      .value("none", GateLayout::none)
      .value("merged", GateLayout::merged)
      .value("separate", GateLayout::separate);

  py::class_<LayerConfig>(m, "LayerConfig", "A layer's dimensions (include/mla/config.hpp).")
      .def(py::init<>())
      .def_static("preset", &LayerConfig::preset, py::arg("name"), "kimi-k3, deepseek-v3 or kimi-k2")
      .def_static("preset_names", &LayerConfig::preset_names)
      .def_readwrite("name", &LayerConfig::name)
      .def_readwrite("hidden", &LayerConfig::hidden)
      .def_readwrite("q_lora_rank", &LayerConfig::q_lora_rank)
      .def_readwrite("kv_lora_rank", &LayerConfig::kv_lora_rank)
      .def_readwrite("qk_nope_dim", &LayerConfig::qk_nope_dim)
      .def_readwrite("qk_rope_dim", &LayerConfig::qk_rope_dim)
      .def_readwrite("v_head_dim", &LayerConfig::v_head_dim)
      .def_readwrite("total_heads", &LayerConfig::total_heads)
      .def_readwrite("tp_size", &LayerConfig::tp_size)
      .def_readwrite("gate", &LayerConfig::gate)
      .def_readwrite("rms_eps", &LayerConfig::rms_eps)
      .def_property_readonly("heads", &LayerConfig::heads, "N, this rank's heads")
      .def_property_readonly("row_dim", &LayerConfig::row_dim, "L + R: a cache row's elements (576)")
      .def_property_readonly("gate_dim", &LayerConfig::gate_dim)
      .def_property_readonly("sm_scale", &LayerConfig::sm_scale, "(P+R)^-0.5 times YaRN's mscale^2")
      .def_property_readonly("has_rope", [](const LayerConfig& c) { return c.rope != RopeType::none; })
      .def("validate", &LayerConfig::validate)
      .def("__repr__", [](const LayerConfig& c) {
        return "LayerConfig(" + c.name + ", hidden=" + std::to_string(c.hidden) +
               ", heads=" + std::to_string(c.heads()) + ")";
      });

  py::class_<CheckpointWeights>(m, "CheckpointWeights", "One layer's checkpoint weights (bf16, this rank's heads).")
      .def_readwrite("q_scale", &CheckpointWeights::q_scale)
      .def_readwrite("k_scale", &CheckpointWeights::k_scale);
  py::class_<PreparedWeights>(m, "PreparedWeights", "Absorbed and MXFP4-packed weights a Layer takes.")
      .def_readonly("q_scale", &PreparedWeights::q_scale)
      .def_readonly("k_scale", &PreparedWeights::k_scale);
  m.def("random_checkpoint_weights", &random_checkpoint_weights, py::arg("cfg"), py::arg("seed") = 1,
        "Synthetic weights scaled like a trained layer's (include/mla/weights.hpp).");
  m.def("prepare_weights", &prepare_weights, py::arg("cfg"), py::arg("ckpt"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "load_layer",
      [](const std::string& dir, int layer, int tp, int rank) {
        CheckpointLayer l = load_layer(dir, layer, tp, rank);
        return py::make_tuple(l.config, l.weights);
      },
      py::arg("dir"), py::arg("layer"), py::arg("tp") = 1, py::arg("rank") = 0,
      "(LayerConfig, CheckpointWeights) of one layer of a Hugging Face checkpoint directory.");
  m.def("cuda_available", &cuda_available, "Built with CUDA and a GPU is present.");
  m.def(
      "page_table_from_block_table",
      [](const std::vector<int32_t>& block_table, int batch, int max_pages, const std::vector<int32_t>& local_seq_lens,
         int page_size) {
        PageTable t = page_table_from_block_table(block_table, batch, max_pages, local_seq_lens, page_size);
        return py::make_tuple(t.kv_indptr, t.kv_indices);
      },
      py::arg("block_table"), py::arg("batch"), py::arg("max_pages"), py::arg("local_seq_lens"), py::arg("page_size"),
      "(kv_indptr, kv_indices) as lists from a flattened [batch, max_pages] block table.");

  py::class_<Workspace, std::shared_ptr<Workspace>>(
      m, "Workspace",
      "step()'s scratch shared by a model's layers (include/mla/workspace.hpp): give the same one to every "
      "Layer that runs on one device and stream, one step at a time.")
      .def(py::init<>())
      .def_property_readonly("bytes", &Workspace::bytes, "allocated now: the largest need of its layers")
      .def_property_readonly("device", [](const Workspace& w) { return std::string(device_name(w.device())); });

  py::class_<Layer>(m, "Layer", "pre -> attend -> post of one MLA layer's decode step (include/mla/layer.hpp).")
      .def(py::init([](const LayerConfig& cfg, const PreparedWeights& w, const std::string& backend,
                       const std::string& q_dtype, int max_tokens, int num_splits, int q_head_pad, int num_threads,
                       int cuda_device, uintptr_t cuda_stream, std::shared_ptr<Workspace> workspace) {
             LayerOptions o;
             o.backend = backend_from(backend);
             o.q_dtype = dtype_from(q_dtype);
             o.max_tokens = max_tokens, o.num_splits = num_splits, o.q_head_pad = q_head_pad;
             o.num_threads = num_threads, o.cuda_device = cuda_device;
             o.cuda_stream = reinterpret_cast<void*>(cuda_stream);
             o.workspace = std::move(workspace);
             py::gil_scoped_release release;
             return Layer(cfg, w, o);
           }),
           py::arg("cfg"), py::arg("weights"), py::arg("backend") = "auto", py::arg("q_dtype") = "fp8",
           py::arg("max_tokens") = 256, py::arg("num_splits") = 0, py::arg("q_head_pad") = 0,
           py::arg("num_threads") = 0, py::arg("cuda_device") = 0, py::arg("cuda_stream") = 0,
           py::arg("workspace") = nullptr,
           "backend: 'auto' (CUDA where a GPU is present), 'cpu' or 'cuda'; cuda_stream: a cudaStream_t as an integer "
           "(torch: torch.cuda.current_stream().cuda_stream), 0 = the default stream; workspace: a Workspace shared "
           "with the model's other layers (None: the layer's own).")
      .def_property_readonly("config", &Layer::config)
      .def_property_readonly("backend", [](const Layer& l) { return std::string(backend_name(l.backend())); })
      .def_property_readonly("device", [](const Layer& l) { return std::string(device_name(l.device())); })
      .def_property_readonly("query_heads", &Layer::query_heads, "G: query heads attend sees")
      .def_property_readonly("last_attend_kernel", &Layer::last_attend_kernel,
                             "the attend kernel the last attend or step ran and its plan ('cpu avx512-bf16', "
                             "'rows, 2 fixed splits'); empty before the first on the GPU")
      .def(
          "step",
          [](Layer& l, const py::object& hidden, const py::object& seq_lens, const py::object& kv_indptr,
             const py::object& kv_indices, const py::object& slot_mapping, const py::object& cache,
             const py::object& out, int qlen, const py::object& seq_lens_host) {
            const Meta m = meta_of(l, qlen, seq_lens, kv_indptr, kv_indices, slot_mapping, seq_lens_host);
            const TensorView h = view_of(hidden, kBf16, "hidden", false, &l), o = view_of(out, kBf16, "out", true, &l);
            const KVCache kv = cache_of(l, cache);
            py::gil_scoped_release release;
            l.step(h, m.step(), kv, o);
          },
          py::arg("hidden"), py::arg("seq_lens"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("slot_mapping"),
          py::arg("cache"), py::arg("out"), py::arg("qlen") = 1, py::arg("seq_lens_host") = py::none(),
          "hidden [S, D] bf16 -> out [S, N*V] bf16; writes this step's rows into cache [pages, page_size, 576].")
      .def(
          "pre",
          [](Layer& l, const py::object& hidden, const py::object& seq_lens, const py::object& kv_indptr,
             const py::object& kv_indices, const py::object& slot_mapping, const py::object& cache, const py::object& q,
             const py::object& gate, int qlen, const py::object& seq_lens_host) {
            const Meta m = meta_of(l, qlen, seq_lens, kv_indptr, kv_indices, slot_mapping, seq_lens_host);
            const TensorView h = view_of(hidden, kBf16, "hidden", false, &l);
            const PreOutputs outs{.q = view_of(q, kQuery, "q", true, &l),
                                  .gate = gate.is_none() ? TensorView{} : view_of(gate, kBf16, "gate", true, &l)};
            const KVCache kv = cache_of(l, cache);
            py::gil_scoped_release release;
            l.pre(h, m.step(), kv, outs);
          },
          py::arg("hidden"), py::arg("seq_lens"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("slot_mapping"),
          py::arg("cache"), py::arg("q"), py::arg("gate") = py::none(), py::arg("qlen") = 1,
          py::arg("seq_lens_host") = py::none(),
          "q [S, Hq >= G, 576] (fp8: 1-byte, bf16: 2-byte elements), gate [S, N*V] bf16 (None without a gate).")
      .def(
          "attend",
          [](Layer& l, const py::object& q, const py::object& cache, const py::object& seq_lens,
             const py::object& kv_indptr, const py::object& kv_indices, const py::object& o, const py::object& lse,
             int qlen, const py::object& seq_lens_host) {
            const Meta m = meta_of(l, qlen, seq_lens, kv_indptr, kv_indices, py::none(), seq_lens_host);
            const TensorView qv = view_of(q, kQuery, "q", false, &l);
            const AttendOutputs outs{.o = view_of(o, kO, "o", true, &l), .lse = view_of(lse, kF32, "lse", true, &l)};
            const KVCache kv{.pages = view_of(cache, kQuery, "cache", false, &l)};
            py::gil_scoped_release release;
            l.attend(qv, kv, m.step(), outs);
          },
          py::arg("q"), py::arg("cache"), py::arg("seq_lens"), py::arg("kv_indptr"), py::arg("kv_indices"),
          py::arg("o"), py::arg("lse"), py::arg("qlen") = 1, py::arg("seq_lens_host") = py::none(),
          "o [S, G, 512] (f32 or bf16) and lse [S, G] f32 (natural log), or split partials [splits, S, G, ...].")
      .def(
          "post",
          [](Layer& l, const py::object& o, const py::object& lse, const py::object& gate, const py::object& seq_lens,
             const py::object& kv_indptr, const py::object& kv_indices, const py::object& out, int qlen) {
            const Meta m = meta_of(l, qlen, seq_lens, kv_indptr, kv_indices, py::none(), py::none());
            const AttendOutputs in{.o = view_of(o, kO, "o", false, &l), .lse = view_of(lse, kF32, "lse", false, &l)};
            const TensorView g = gate.is_none() ? TensorView{} : view_of(gate, kBf16, "gate", false, &l);
            const TensorView ov = view_of(out, kBf16, "out", true, &l);
            py::gil_scoped_release release;
            l.post(in, g, m.step(), ov);
          },
          py::arg("o"), py::arg("lse"), py::arg("gate"), py::arg("seq_lens"), py::arg("kv_indptr"),
          py::arg("kv_indices"), py::arg("out"), py::arg("qlen") = 1, "out [S, N*V] bf16 from attend's o and lse.");
}
