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
#include <stdexcept>
#include <unordered_map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "model/ops/op_label.hpp"
#include "model/scenario/files.hpp"

namespace twin::measured {

std::string read_maybe_gzipped(const std::string& path, std::size_t max_bytes) {
  // The input policy (model/scenario/files.hpp) on the file itself, then a cap on what it decompresses to: a small
  // gzip file can unpack to any size.
  model::InputFile input(path, "input file", model::kMaxTraceBytes);
  const std::uint64_t cap = std::min<std::uint64_t>(max_bytes, model::kMaxTraceBytes);
  // gzread passes a file that is not gzip-compressed through unchanged.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzdopen(input.fd(), "rb"), gzclose);
  if (!file) throw MeasuredError(fmt::format("cannot open '{}'", path));
  input.release();  // gzclose closes it now
  std::string text;
  char buffer[1 << 16];
  while (text.size() < cap) {
    const int got = gzread(file.get(), buffer, static_cast<unsigned>(std::min<std::uint64_t>(sizeof buffer, cap - text.size())));
    if (got < 0) {
      int code = 0;
      throw MeasuredError(fmt::format("'{}': cannot decompress: {}", path, gzerror(file.get(), &code)));
    }
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
  }
  if (text.size() == cap && max_bytes == std::string::npos && gzgetc(file.get()) != -1) {
    throw MeasuredError(fmt::format("'{}' decompresses to more than {} GiB, more than any trace or log twin reads", path,
                                    model::kMaxTraceBytes >> 30));
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

struct CpuOp {
  std::size_t index;  // in traceEvents
  std::string name;
  std::int64_t tid;
  double start_s, end_s;
  std::optional<MatmulShape> shape;
  double bytes = 0;
  const json* args = nullptr;  // the event's "args" (nullptr: none)
};

// A trace's rank when distributedInfo has none: "rank-3", "rank_3", "rank3" in the file name.
int rank_from_file_name(const std::string& path) {
  static const std::regex pattern(R"(rank[-_]?(\d+))", std::regex::icase);
  std::smatch match;
  const std::string name = std::filesystem::path(path).filename().string();
  if (std::regex_search(name, match, pattern)) return std::stoi(match[1]);
  return -1;
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
      std::optional<KernelClass> own = classify_cpu_op(op->name);
      const KernelClass parent = stack.empty() ? KernelClass::Unclassified : stack.back().inherited;
      // A copy or reduction inside an operator of a class the Program has ops for is that operator's work:
      // aten::addmm copies the bias into its output, a linear layer's backward sums the bias gradient, split's
      // backward concatenates the gradients.
      if (own && !modelled_by_twin(*own) && modelled_by_twin(parent)) own.reset();
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
    // "forward qkv_projection layer 3 micro-batch 2" (model/ops/op_label.hpp): its class is the phase and the kind.
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
    // The attention core's FLOPs as the cost model counts a fused kernel's (op_args.hpp attention_flops): the
    // Program counts both score matrices whole (4 b s^2 h d forward, twice that backward), the kernel computes the
    // causal half forward and 2.5 times that backward.
    if (kind == "attention_core") k.flops *= op_class.rfind("backward", 0) == 0 ? 5.0 / 8.0 : 0.5;
    k.bytes = args.value("bytes", 0.0);
    trace.kernels.push_back(std::move(k));
  }
  if (trace.kernels.empty()) throw MeasuredError(fmt::format("'{}': a twin trace without compute ops", trace.path));
  trace.rank = static_cast<int>(first_rank);
  trace.device = "cpu";
  trace.steps.push_back({1, begin, end - begin});
}

using Launches = std::unordered_map<std::int64_t, std::pair<double, std::int64_t>>;  // correlation -> (time, thread)

// One thread's operators, sorted by start, and the longest one's duration (no operator that started longer before a
// time can be around it).
struct ThreadOps {
  std::vector<const CpuOp*> ops;
  double longest_s = 0;
};

// The innermost operator of `thread` around time `t` for which `wanted` holds, or nullptr.
template <typename Wanted>
const CpuOp* enclosing_where(const ThreadOps& thread, double t, Wanted wanted) {
  const auto& ops = thread.ops;
  auto it =
      std::upper_bound(ops.begin(), ops.end(), t, [](double time, const CpuOp* op) { return time < op->start_s; });
  while (it != ops.begin()) {
    --it;
    if (t - (*it)->start_s > thread.longest_s) break;
    // Operators on one thread nest: one that ended before t may sit inside an earlier one that did not.
    if ((*it)->end_s >= t && wanted(**it)) return *it;
  }
  return nullptr;
}

// Each kernel's work from the operator that launched it (the innermost one around its launch, on the launching
// thread): a GEMM's shape; a memory-bound kernel's bytes when that operator launched it alone (an operator's bytes
// are not split among several kernels); a fused attention kernel's FLOPs (the longest kernel of its operator: the
// others are its small pre- and post-processing); a collective's size and group, recorded on the NCCL kernel itself
// or on the operator (record_param_comms) that launched it.
void attribute_work(std::vector<TracedKernel>& kernels, const std::vector<const CpuOp*>& launchers,
                    const std::vector<const CpuOp*>& collective_launchers) {
  std::map<const CpuOp*, int> launched;
  std::map<const CpuOp*, std::size_t> longest_attention;
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    if (!launchers[i]) continue;
    ++launched[launchers[i]];
    if (kernels[i].kind.kind != KernelClass::Attention) continue;
    auto [it, fresh] = longest_attention.emplace(launchers[i], i);
    if (!fresh && kernels[i].duration_s > kernels[it->second].duration_s) it->second = i;
  }
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    TracedKernel& k = kernels[i];
    const CpuOp* op = launchers[i];
    if (op && (k.kind.kind == KernelClass::Elementwise || k.kind.kind == KernelClass::Norm) && launched[op] == 1) {
      k.bytes = op->bytes;
    }
    if (op && op->args && k.kind.kind == KernelClass::Attention && longest_attention[op] == i) {
      k.flops = attention_flops(op->name, *op->args);
    }
    if (k.kind.kind == KernelClass::Communication && k.collective.bytes == 0 && collective_launchers[i]) {
      k.collective = collective_call(*collective_launchers[i]->args).value_or(CollectiveCall{});
    }
  }
}

// A GPU run: every kernel, memcpy and memset, with its stream, time, class, iteration (that of its launch) and work.
void gpu_kernels(const std::vector<std::pair<std::size_t, const json*>>& gpu_events, const std::vector<CpuOp>& cpu_ops,
                 const Launches& launches, const Reader& reader, KinetoTrace& trace) {
  std::map<std::int64_t, ThreadOps> by_thread;
  for (const CpuOp& op : cpu_ops) {
    ThreadOps& thread = by_thread[op.tid];
    thread.ops.push_back(&op);
    thread.longest_s = std::max(thread.longest_s, op.end_s - op.start_s);
  }
  for (auto& [tid, thread] : by_thread) {
    std::stable_sort(thread.ops.begin(), thread.ops.end(),
                     [](const CpuOp* a, const CpuOp* b) { return a->start_s < b->start_s; });
  }
  std::vector<const CpuOp*> launchers, collective_launchers;
  for (const auto& [index, event_pointer] : gpu_events) {
    const json& event = *event_pointer;
    TracedKernel k;
    k.name = event.value("name", std::string());
    const std::string category = event.value("cat", std::string());
    k.kind = category == "kernel" ? classify_kernel(k.name) : Classified{KernelClass::Copy, CommKind::Other};
    k.stream = integer_arg(event, "stream", thread_id(event));
    k.start_s = reader.seconds(index, event, "ts", false);
    k.duration_s = reader.seconds(index, event, "dur", true);
    if (k.kind.kind == KernelClass::Communication && event.contains("args")) {
      k.collective = collective_call(event["args"]).value_or(CollectiveCall{});
    }
    double issued_s = k.start_s;
    const CpuOp *launcher = nullptr, *collective_launcher = nullptr;
    if (const auto launch = launches.find(integer_arg(event, "correlation", -1)); launch != launches.end()) {
      issued_s = launch->second.first;
      if (const auto thread = by_thread.find(launch->second.second); thread != by_thread.end()) {
        launcher = enclosing_where(thread->second, issued_s, [](const CpuOp&) { return true; });
        // A GEMM's shape from the matrix-multiply operator around it (a wrapper's child may be innermost).
        const CpuOp* shaped =
            k.kind.kind == KernelClass::Gemm
                ? enclosing_where(thread->second, issued_s, [](const CpuOp& op) { return op.shape.has_value(); })
                : nullptr;
        if (shaped) {
          k.shape = *shaped->shape;
          k.flops = k.shape.flops();
        }
        if (k.kind.kind == KernelClass::Communication) {
          collective_launcher = enclosing_where(thread->second, issued_s, [](const CpuOp& op) {
            return op.args && collective_call(*op.args).has_value();
          });
        }
      }
    }
    k.iteration = step_of(trace.steps, issued_s);
    trace.kernels.push_back(std::move(k));
    launchers.push_back(launcher);
    collective_launchers.push_back(collective_launcher);
  }
  attribute_work(trace.kernels, launchers, collective_launchers);
}

// The trace at `path`, any exception of the JSON library or std::stoll let through (read_kineto_trace refuses them).
KinetoTrace read_trace_document(const std::string& path) {
  const std::string text = read_maybe_gzipped(path);
  json document;
  try {
    document = json::parse(text);
  } catch (const json::exception& error) {  // a syntax error, or a number past what a double holds
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
  Launches launches;
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
      const auto args = event.find("args");
      const json* args_of = args != event.end() && args->is_object() ? &*args : nullptr;
      cpu_ops.push_back({i, name, thread_id(event), start, start + reader.seconds(i, event, "dur", true),
                         args_of ? matmul_shape(name, *args_of) : std::nullopt, args_of ? traffic_bytes(*args_of) : 0.0,
                         args_of});
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
  gpu_kernels(gpu_events, cpu_ops, launches, reader, trace);
  std::sort(trace.kernels.begin(), trace.kernels.end(),
            [](const TracedKernel& a, const TracedKernel& b) { return a.start_s < b.start_s; });
  return trace;
}

}  // namespace

KinetoTrace read_kineto_trace(const std::string& path) {
  // A field of another type than the profiler writes (a name that is an object, a step number of 30 digits) is a
  // file that is not a profiler trace: one refusal naming the file, not the JSON library's or the standard library's
  // exception (fuzz_kineto found both).
  try {
    return read_trace_document(path);
  } catch (const json::exception& error) {
    throw MeasuredError(fmt::format("'{}' is not a PyTorch profiler trace: {}", path, error.what()));
  } catch (const std::out_of_range& error) {
    throw MeasuredError(fmt::format("'{}' is not a PyTorch profiler trace: a number out of range ({})", path,
                                    error.what()));
  }
}

void keep_fastest_step(KinetoTrace& trace) {
  if (trace.steps.size() < 2) return;
  const auto fastest = std::min_element(trace.steps.begin(), trace.steps.end(), [](const auto& a, const auto& b) {
    return a.duration_s < b.duration_s;
  });
  const int kept = static_cast<int>(fastest - trace.steps.begin());
  trace.steps = {*fastest};
  std::erase_if(trace.kernels, [kept](const TracedKernel& k) { return k.iteration != kept; });
  for (TracedKernel& k : trace.kernels) k.iteration = 0;
}

}  // namespace twin::measured
