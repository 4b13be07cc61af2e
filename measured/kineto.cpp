#include "measured/kineto.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <unordered_map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "model/op_label.hpp"

namespace twin::measured {

std::string read_maybe_gzipped(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    throw MeasuredError(fmt::format("'{}' is a directory, not a file", path));
  }
  // gzread passes a file that is not gzip-compressed through unchanged.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) throw MeasuredError(fmt::format("cannot open '{}'", path));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const int got = gzread(file.get(), buffer, sizeof buffer);
    if (got < 0) {
      int code = 0;
      throw MeasuredError(fmt::format("'{}': cannot decompress: {}", path, gzerror(file.get(), &code)));
    }
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
  }
  int code = 0;
  const char* message = gzerror(file.get(), &code);
  if (code != Z_OK) throw MeasuredError(fmt::format("'{}': cannot decompress: {}", path, message));
  return text;
}

bool looks_like_chrome_trace(const std::string& text) {
  const std::size_t open = text.find_first_not_of(" \t\r\n");
  return open != std::string::npos && (text[open] == '{' || text[open] == '[') &&
         text.find("\"traceEvents\"") != std::string::npos;
}

namespace {

using nlohmann::json;

struct Reader {
  const std::string& path;

  [[noreturn]] void fail(std::size_t index, const json& event, const std::string& why) const {
    throw MeasuredError(fmt::format("'{}': traceEvents[{}] ({} '{}'): {}", path, index,
                                    event.value("cat", std::string("event")), event.value("name", std::string("?")),
                                    why));
  }
  // A field that must be a finite number (>= 0 for a duration); microseconds in the file, seconds out.
  double seconds(std::size_t index, const json& event, const char* key, bool non_negative) const {
    const auto it = event.find(key);
    if (it == event.end() || !it->is_number() || !std::isfinite(it->get<double>())) {
      fail(index, event, fmt::format("\"{}\" must be a number of microseconds", key));
    }
    const double value = it->get<double>();
    if (non_negative && value < 0) fail(index, event, fmt::format("\"{}\" must be >= 0, got {}", key, value));
    return value * 1e-6;
  }
};

std::int64_t integer_arg(const json& event, const char* key, std::int64_t otherwise) {
  const auto args = event.find("args");
  if (args == event.end() || !args->is_object()) return otherwise;
  const auto it = args->find(key);
  return it != args->end() && it->is_number_integer() ? it->get<std::int64_t>() : otherwise;
}

std::int64_t thread_id(const json& event) {
  const auto it = event.find("tid");
  if (it != event.end() && it->is_number_integer()) return it->get<std::int64_t>();
  return 0;
}

// The shape of a matrix-multiply operator from its "Input Dims" (PyTorch's record_shapes): aten::mm [[m,k],[k,n]],
// aten::addmm [[bias],[m,k],[k,n]], aten::bmm [[b,m,k],[b,k,n]], aten::baddbmm [[b,m,n],[b,m,k],[b,k,n]],
// aten::linear [[..., k], [n, k], (bias)], aten::matmul [[..., m, k], [..., k, n]].
std::optional<MatmulShape> matmul_shape(const std::string& name, const json& event) {
  const auto args = event.find("args");
  if (args == event.end() || !args->is_object() || !args->contains("Input Dims")) return std::nullopt;
  const json& dims = args->at("Input Dims");
  auto dims_of = [&dims](std::size_t i) -> std::vector<std::int64_t> {
    if (!dims.is_array() || i >= dims.size() || !dims[i].is_array()) return {};
    std::vector<std::int64_t> out;
    for (const json& d : dims[i]) {
      if (!d.is_number_integer()) return {};
      out.push_back(d.get<std::int64_t>());
    }
    return out;
  };
  auto product = [](const std::vector<std::int64_t>& v, std::size_t count) {
    std::int64_t p = 1;
    for (std::size_t i = 0; i < count && i < v.size(); ++i) p *= v[i];
    return p;
  };
  MatmulShape s;
  if (name == "aten::mm" || name == "aten::addmm") {
    const auto a = dims_of(name == "aten::mm" ? 0 : 1), b = dims_of(name == "aten::mm" ? 1 : 2);
    if (a.size() != 2 || b.size() != 2) return std::nullopt;
    s = {a[0], b[1], a[1], 1};
  } else if (name == "aten::bmm" || name == "aten::baddbmm") {
    const auto a = dims_of(name == "aten::bmm" ? 0 : 1), b = dims_of(name == "aten::bmm" ? 1 : 2);
    if (a.size() != 3 || b.size() != 3) return std::nullopt;
    s = {a[1], b[2], a[2], a[0]};
  } else if (name == "aten::linear") {
    const auto x = dims_of(0), w = dims_of(1);
    if (x.empty() || w.size() != 2) return std::nullopt;
    s = {product(x, x.size() - 1), w[0], w[1], 1};
  } else if (name == "aten::matmul") {
    const auto a = dims_of(0), b = dims_of(1);
    if (a.size() < 2 || b.size() < 2) return std::nullopt;
    s = {a[a.size() - 2], b[b.size() - 1], a[a.size() - 1], product(a, a.size() - 2)};
  } else {
    return std::nullopt;
  }
  if (s.m <= 0 || s.n <= 0 || s.k <= 0 || s.batch <= 0) return std::nullopt;
  return s;
}

struct CpuOp {
  std::size_t index;  // in traceEvents
  std::string name;
  std::int64_t tid;
  double start_s, end_s;
  std::optional<MatmulShape> shape;
  double bytes = 0;
};

// Bytes an operator moves, from its "Input Dims": every input read once and an output the size of the largest.
double traffic_bytes(const json& event) {
  const auto args = event.find("args");
  if (args == event.end() || !args->is_object() || !args->contains("Input Dims")) return 0;
  double total = 0, largest = 0;
  for (const json& dims : args->at("Input Dims")) {
    if (!dims.is_array() || dims.empty()) continue;
    double elements = 1;
    for (const json& d : dims) elements *= d.is_number() ? d.get<double>() : 0;
    total += elements;
    largest = std::max(largest, elements);
  }
  return 4 * (total + largest);
}

// A trace's rank when distributedInfo has none: "rank-3", "rank_3", "rank3" in the file name.
int rank_from_file_name(const std::string& path) {
  static const std::regex pattern(R"(rank[-_]?(\d+))", std::regex::icase);
  std::smatch match;
  const std::string name = std::filesystem::path(path).filename().string();
  if (std::regex_search(name, match, pattern)) return std::stoi(match[1]);
  return -1;
}

// The innermost operator of `ops` (one thread's, sorted by start) around time `t`, or nullptr.
const CpuOp* enclosing(const std::vector<const CpuOp*>& ops, double t) {
  auto it =
      std::upper_bound(ops.begin(), ops.end(), t, [](double time, const CpuOp* op) { return time < op->start_s; });
  while (it != ops.begin()) {
    --it;
    if ((*it)->end_s >= t) return *it;
    // Operators on one thread nest: one that ended before t may sit inside an earlier one that did not.
  }
  return nullptr;
}

int step_of(const std::vector<ProfilerStep>& steps, double t) {
  auto it = std::upper_bound(steps.begin(), steps.end(), t,
                             [](double time, const ProfilerStep& step) { return time < step.start_s; });
  if (it == steps.begin()) return -1;
  --it;
  return t <= it->start_s + it->duration_s ? static_cast<int>(it - steps.begin()) : -1;
}

// A CPU run: every operator's self time (its duration less its children's on the same thread), classified by its own
// name, else by the nearest enclosing operator with a class; inside an optimizer step everything is the optimizer's.
void cpu_operators_as_kernels(const std::vector<CpuOp>& ops, KinetoTrace& trace) {
  std::map<std::int64_t, std::vector<const CpuOp*>> by_thread;
  for (const CpuOp& op : ops) by_thread[op.tid].push_back(&op);
  for (auto& [tid, list] : by_thread) {
    std::stable_sort(list.begin(), list.end(), [](const CpuOp* a, const CpuOp* b) {
      return a->start_s != b->start_s ? a->start_s < b->start_s : a->end_s > b->end_s;
    });
    // The class an operator's time goes to; Unclassified while neither it nor an operator around it has one.
    struct Open {
      const CpuOp* op;
      double children_s;
      KernelClass inherited;
      bool own;  // the class is the operator's own (not its parent's)
    };
    std::vector<Open> stack;
    auto close = [&trace](const Open& open) {
      TracedKernel k;
      k.name = open.op->name;
      k.kind.kind = open.inherited;
      k.stream = open.op->tid;
      k.start_s = open.op->start_s;
      k.duration_s = std::max(0.0, open.op->end_s - open.op->start_s - open.children_s);
      // Shapes and bytes belong to an operator that does the work itself, not to a wrapper (aten::linear,
      // aten::matmul, a view) whose own time is only its dispatch.
      if (open.own) {
        if (open.op->shape && open.inherited == KernelClass::Gemm) {
          k.shape = *open.op->shape;
          k.flops = k.shape.flops();
        }
        k.bytes = open.op->bytes;
      }
      k.iteration = step_of(trace.steps, open.op->start_s);
      if (k.duration_s > 0) trace.kernels.push_back(std::move(k));
    };
    for (const CpuOp* op : list) {
      while (!stack.empty() && stack.back().op->end_s <= op->start_s) {
        close(stack.back());
        stack.pop_back();
      }
      const std::optional<KernelClass> own = classify_cpu_op(op->name);
      const KernelClass parent = stack.empty() ? KernelClass::Unclassified : stack.back().inherited;
      const KernelClass kind = parent == KernelClass::Optimizer ? parent : own.value_or(parent);
      if (!stack.empty()) stack.back().children_s += op->end_s - op->start_s;
      stack.push_back({op, 0.0, kind, own.has_value() && parent != KernelClass::Optimizer});
    }
    while (!stack.empty()) {
      close(stack.back());
      stack.pop_back();
    }
  }
}

// twin's own trace of one iteration: compute ops of the lowest rank, classified by their kind.
void read_twin_trace(const json& events, const Reader& reader, KinetoTrace& trace) {
  std::map<std::string, KernelClass> classes;
  for (std::size_t index = 0; index < model::kComputeKindCount; ++index) {
    const auto kind = static_cast<model::ComputeKind>(index);
    classes[std::string(model::to_string(kind))] = class_of(kind).value_or(KernelClass::Unclassified);
  }
  std::int64_t first_rank = std::numeric_limits<std::int64_t>::max();
  for (const json& event : events) {
    if (event.is_object() && event.value("cat", std::string()) == "compute" && event.contains("pid") &&
        event["pid"].is_number_integer()) {
      first_rank = std::min(first_rank, event["pid"].get<std::int64_t>());
    }
  }
  double begin = std::numeric_limits<double>::infinity(), end = -begin;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const json& event = events[i];
    if (!event.is_object() || event.value("ph", std::string()) != "X" || !event.contains("pid") ||
        !event["pid"].is_number_integer() || event["pid"].get<std::int64_t>() != first_rank) {
      continue;
    }
    const double start = reader.seconds(i, event, "ts", false), duration = reader.seconds(i, event, "dur", true);
    begin = std::min(begin, start);
    end = std::max(end, start + duration);
    if (event.value("cat", std::string()) != "compute") continue;
    // "forward qkv_projection layer 3 micro-batch 2" (model/op_label.hpp): its class is the phase and the kind.
    const std::string op_class = model::op_class(event.value("name", std::string()));
    const std::string kind = op_class.substr(op_class.find(' ') + 1);
    TracedKernel k;
    k.name = op_class;
    const auto found = classes.find(kind);
    k.kind.kind = found != classes.end() ? found->second : KernelClass::Unclassified;
    k.stream = thread_id(event);
    k.start_s = start;
    k.duration_s = duration;
    k.iteration = 0;
    const json args = event.value("args", json::object());
    k.flops = args.value("flops", 0.0);
    k.bytes = args.value("bytes", 0.0);
    trace.kernels.push_back(std::move(k));
  }
  if (trace.kernels.empty()) throw MeasuredError(fmt::format("'{}': a twin trace without compute ops", trace.path));
  trace.rank = static_cast<int>(first_rank);
  trace.device = "cpu";
  trace.steps.push_back({1, begin, end - begin});
}

}  // namespace

KinetoTrace read_kineto_trace(const std::string& path) {
  const std::string text = read_maybe_gzipped(path);
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& error) {
    throw MeasuredError(fmt::format("'{}' is not valid JSON: {}", path, error.what()));
  }
  const json* events = nullptr;
  if (document.is_object() && document.contains("traceEvents") && document["traceEvents"].is_array()) {
    events = &document["traceEvents"];
  } else if (document.is_array()) {
    events = &document;  // the Chrome trace's bare-array form
  } else {
    throw MeasuredError(
        fmt::format("'{}' is not a PyTorch profiler trace (expected an object with a \"traceEvents\" array)", path));
  }
  const Reader reader{path};
  KinetoTrace trace;
  trace.path = path;
  if (document.is_object() && document.contains("otherData") && document["otherData"].is_object() &&
      document["otherData"].value("engine", std::string()).rfind("exec", 0) == 0) {
    read_twin_trace(*events, reader, trace);
    return trace;
  }
  trace.rank = rank_from_file_name(path);
  if (document.is_object() && document.contains("distributedInfo") && document["distributedInfo"].is_object()) {
    const json& info = document["distributedInfo"];
    if (info.contains("rank") && info["rank"].is_number_integer()) trace.rank = info["rank"].get<int>();
    if (info.contains("world_size") && info["world_size"].is_number_integer()) {
      trace.world_size = info["world_size"].get<int>();
    }
  }
  if (document.is_object() && document.contains("deviceProperties") && document["deviceProperties"].is_array() &&
      !document["deviceProperties"].empty() && document["deviceProperties"][0].is_object()) {
    const json& device = document["deviceProperties"][0];
    trace.device = device.value("name", std::string());
    if (device.contains("totalGlobalMem") && device["totalGlobalMem"].is_number()) {
      trace.device_memory_bytes = device["totalGlobalMem"].get<double>();
    }
  }

  // "ProfilerStep*" is the legacy profiler's name for the same range (numbered here in time order).
  static const std::regex step_name(R"(ProfilerStep(?:#(\d+)|\*))");
  std::vector<CpuOp> cpu_ops;
  std::unordered_map<std::int64_t, std::pair<double, std::int64_t>> launches;  // correlation -> (time, thread)
  std::vector<std::pair<std::size_t, const json*>> gpu_events;
  for (std::size_t i = 0; i < events->size(); ++i) {
    const json& event = (*events)[i];
    if (!event.is_object()) throw MeasuredError(fmt::format("'{}': traceEvents[{}] is not an object", path, i));
    if (event.value("ph", std::string()) != "X") continue;  // metadata, flows, instants, counters
    // The legacy profiler's export (a PyTorch built without Kineto) has no categories: its events are operators.
    const std::string category = event.contains("cat")
                                     ? event.value("cat", std::string())
                                     : (event.value("pid", json()) == json("CPU functions") ? "cpu_op" : std::string());
    const std::string name =
        event.contains("name") && event["name"].is_string() ? event["name"].get<std::string>() : std::string();
    std::smatch match;
    if ((category == "user_annotation" || category == "cpu_op") && std::regex_match(name, match, step_name)) {
      trace.steps.push_back({match[1].matched ? std::stoll(match[1]) : -1, reader.seconds(i, event, "ts", false),
                             reader.seconds(i, event, "dur", true)});
      continue;
    }
    if (category == "kernel" || category == "gpu_memcpy" || category == "gpu_memset") {
      gpu_events.emplace_back(i, &event);
    } else if (category == "cpu_op" || category == "user_annotation") {
      const double start = reader.seconds(i, event, "ts", false);
      cpu_ops.push_back({i, name, thread_id(event), start, start + reader.seconds(i, event, "dur", true),
                         matmul_shape(name, event), traffic_bytes(event)});
    } else if (category == "cuda_runtime" || category == "cuda_driver") {
      const std::int64_t correlation = integer_arg(event, "correlation", -1);
      if (correlation >= 0) launches[correlation] = {reader.seconds(i, event, "ts", false), thread_id(event)};
    }
  }
  std::sort(trace.steps.begin(), trace.steps.end(),
            [](const ProfilerStep& a, const ProfilerStep& b) { return a.start_s < b.start_s; });
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    if (trace.steps[i].number < 0) trace.steps[i].number = static_cast<std::int64_t>(i) + 1;
  }

  trace.gpu = !gpu_events.empty();
  if (!trace.gpu) {
    trace.device = "cpu";
    cpu_operators_as_kernels(cpu_ops, trace);
    return trace;
  }
  // The matrix-multiply operators with shapes, per thread, to give each GEMM kernel the shape it was launched with.
  std::map<std::int64_t, std::vector<const CpuOp*>> shaped;
  for (const CpuOp& op : cpu_ops) {
    if (op.shape) shaped[op.tid].push_back(&op);
  }
  for (auto& [tid, list] : shaped) {
    std::sort(list.begin(), list.end(), [](const CpuOp* a, const CpuOp* b) { return a->start_s < b->start_s; });
  }
  for (const auto& [index, event_pointer] : gpu_events) {
    const json& event = *event_pointer;
    TracedKernel k;
    k.name = event.value("name", std::string());
    const std::string category = event.value("cat", std::string());
    k.kind = category == "kernel" ? classify_kernel(k.name) : Classified{KernelClass::Copy, CommKind::Other};
    k.stream = integer_arg(event, "stream", thread_id(event));
    k.start_s = reader.seconds(index, event, "ts", false);
    k.duration_s = reader.seconds(index, event, "dur", true);
    double issued_s = k.start_s;
    if (const auto launch = launches.find(integer_arg(event, "correlation", -1)); launch != launches.end()) {
      issued_s = launch->second.first;
      if (k.kind.kind == KernelClass::Gemm) {
        if (const auto thread = shaped.find(launch->second.second); thread != shaped.end()) {
          if (const CpuOp* op = enclosing(thread->second, issued_s)) {
            k.shape = *op->shape;
            k.flops = k.shape.flops();
          }
        }
      }
    }
    k.iteration = step_of(trace.steps, issued_s);
    trace.kernels.push_back(std::move(k));
  }
  std::sort(trace.kernels.begin(), trace.kernels.end(),
            [](const TracedKernel& a, const TracedKernel& b) { return a.start_s < b.start_s; });
  return trace;
}

}  // namespace twin::measured
