#include "measured/op_args.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <string_view>

namespace twin::measured {
namespace {

using nlohmann::json;

std::vector<std::int64_t> dims_of(const json& args, std::size_t i) {
  const auto all = args.find("Input Dims");
  if (all == args.end() || !all->is_array() || i >= all->size() || !(*all)[i].is_array()) return {};
  std::vector<std::int64_t> out;
  for (const json& d : (*all)[i]) {
    if (!d.is_number_integer()) return {};
    out.push_back(d.get<std::int64_t>());
  }
  return out;
}

std::int64_t product(const std::vector<std::int64_t>& v, std::size_t count) {
  std::int64_t p = 1;
  for (std::size_t i = 0; i < count && i < v.size(); ++i) p *= v[i];
  return p;
}

// Bytes of one element of an "Input type" (c10's ScalarType names as the profiler prints them); 0 for "" (a scalar
// or a list) and for names no row knows.
double element_bytes(std::string_view type) {
  static const std::map<std::string_view, double> kBytes = {{"float", 4},
                                                            {"c10::BFloat16", 2},
                                                            {"c10::Half", 2},
                                                            {"double", 8},
                                                            {"long int", 8},
                                                            {"int", 4},
                                                            {"short int", 2},
                                                            {"signed char", 1},
                                                            {"unsigned char", 1},
                                                            {"bool", 1},
                                                            {"c10::Float8_e4m3fn", 1},
                                                            {"c10::Float8_e5m2", 1},
                                                            {"c10::complex<float>", 8}};
  const auto it = kBytes.find(type);
  return it == kBytes.end() ? 0 : it->second;
}

// A collective's "dtype" (c10's ScalarType names as ParamCommsUtils records them).
double dtype_bytes(std::string_view dtype) {
  static const std::map<std::string_view, double> kBytes = {{"Float", 4},
                                                            {"BFloat16", 2},
                                                            {"Half", 2},
                                                            {"Double", 8},
                                                            {"Long", 8},
                                                            {"Int", 4},
                                                            {"Short", 2},
                                                            {"Char", 1},
                                                            {"Byte", 1},
                                                            {"Bool", 1},
                                                            {"Float8_e4m3fn", 1},
                                                            {"Float8_e5m2", 1},
                                                            {"Float8_e4m3fnuz", 1},
                                                            {"Float8_e5m2fnuz", 1}};
  const auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

double number_arg(const json& args, const char* key) {
  const auto it = args.find(key);
  return it != args.end() && it->is_number() ? it->get<double>() : -1;
}

// "[0, 8, 16, ...]" -> {0, 8, 16, ...}; a list the profiler cut short ("...]") continues at its first stride up to
// `group_size` ranks (as facebookresearch/param's comm trace analysis reads it).
std::vector<int> parse_ranks(const std::string& text, int group_size) {
  std::vector<int> ranks;
  bool truncated = false;
  for (std::size_t i = 0; i < text.size();) {
    if (std::isdigit(static_cast<unsigned char>(text[i]))) {
      char* end = nullptr;
      ranks.push_back(static_cast<int>(std::strtol(text.c_str() + i, &end, 10)));
      i = static_cast<std::size_t>(end - text.c_str());
    } else {
      if (text.compare(i, 3, "...") == 0) truncated = true;
      ++i;
    }
  }
  if (truncated && ranks.size() >= 2 && group_size > static_cast<int>(ranks.size())) {
    const int stride = ranks[1] - ranks[0];
    while (static_cast<int>(ranks.size()) < group_size) ranks.push_back(ranks.back() + stride);
  }
  return ranks;
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

std::optional<MatmulShape> matmul_shape(const std::string& name, const json& args) {
  if (!args.is_object() || !args.contains("Input Dims")) return std::nullopt;
  MatmulShape s;
  if (name == "aten::mm" || name == "aten::addmm") {
    const auto a = dims_of(args, name == "aten::mm" ? 0 : 1), b = dims_of(args, name == "aten::mm" ? 1 : 2);
    if (a.size() != 2 || b.size() != 2) return std::nullopt;
    s = {a[0], b[1], a[1], 1};
  } else if (name == "aten::bmm" || name == "aten::baddbmm") {
    const auto a = dims_of(args, name == "aten::bmm" ? 0 : 1), b = dims_of(args, name == "aten::bmm" ? 1 : 2);
    if (a.size() != 3 || b.size() != 3) return std::nullopt;
    s = {a[1], b[2], a[2], a[0]};
  } else if (name == "aten::linear") {
    const auto x = dims_of(args, 0), w = dims_of(args, 1);
    if (x.empty() || w.size() != 2) return std::nullopt;
    s = {product(x, x.size() - 1), w[0], w[1], 1};
  } else if (name == "aten::matmul") {
    const auto a = dims_of(args, 0), b = dims_of(args, 1);
    if (a.size() < 2 || b.size() < 2) return std::nullopt;
    s = {a[a.size() - 2], b[b.size() - 1], a[a.size() - 1], product(a, a.size() - 2)};
  } else {
    return std::nullopt;
  }
  if (s.m <= 0 || s.n <= 0 || s.k <= 0 || s.batch <= 0) return std::nullopt;
  return s;
}

double traffic_bytes(const json& args) {
  if (!args.is_object() || !args.contains("Input Dims") || !args["Input Dims"].is_array()) return 0;
  const json& all = args["Input Dims"];
  const json types = args.value("Input type", json::array());
  double total = 0, largest = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const json& dims = all[i];
    if (!dims.is_array() || dims.empty()) continue;
    double elements = 1;
    for (const json& d : dims) elements *= d.is_number() ? d.get<double>() : 0;
    const bool typed = types.is_array() && i < types.size() && types[i].is_string();
    const double bytes = elements * (typed ? element_bytes(types[i].get<std::string>()) : 4.0);
    total += bytes;
    largest = std::max(largest, bytes);
  }
  return total + largest;
}

double attention_flops(const std::string& name, const json& args) {
  if (!args.is_object()) return 0;
  const bool heads_second = contains(name, "scaled_dot_product");  // [b, h, s, d]; the others [b, s, h, d]
  if (!heads_second && !contains(name, "flash_attention") && !contains(name, "efficient_attention") &&
      !contains(name, "flash_attn")) {
    return 0;
  }
  std::vector<std::int64_t> q;
  for (std::size_t i = 0; q.size() != 4 && i < 8; ++i) q = dims_of(args, i);
  if (q.size() != 4) return 0;
  const double b = static_cast<double>(q[0]), d = static_cast<double>(q[3]);
  const double h = static_cast<double>(heads_second ? q[1] : q[2]), s = static_cast<double>(heads_second ? q[2] : q[1]);
  bool causal = true;
  if (const auto concrete = args.find("Concrete Inputs"); concrete != args.end() && concrete->is_array()) {
    for (const json& value : *concrete) {
      if (value == "True" || value == "False") {
        causal = value == "True";
        break;
      }
    }
  }
  const double forward = 4 * b * h * s * s * d * (causal ? 0.5 : 1.0);
  const bool backward = contains(name, "backward") || contains(name, "bwd");
  return backward ? 2.5 * forward : forward;
}

std::optional<CollectiveCall> collective_call(const json& args) {
  if (!args.is_object()) return std::nullopt;
  const double in = number_arg(args, "In msg nelems"), out = number_arg(args, "Out msg nelems");
  const double element = dtype_bytes(args.value("dtype", std::string()));
  if (in < 0 || element <= 0) return std::nullopt;
  CollectiveCall call;
  call.bytes = std::max(in, out) * element;
  call.group_size = static_cast<int>(std::max(0.0, number_arg(args, "Group size")));
  const auto ranks = args.find("Process Group Ranks");
  if (ranks != args.end() && ranks->is_string()) call.ranks = parse_ranks(ranks->get<std::string>(), call.group_size);
  if (call.group_size == 0) call.group_size = static_cast<int>(call.ranks.size());
  return call;
}

double bus_factor(CommKind kind, int group_size) {
  const double n = std::max(1, group_size);
  switch (kind) {
    case CommKind::AllReduce:
      return 2 * (n - 1) / n;
    case CommKind::AllGather:
    case CommKind::ReduceScatter:
    case CommKind::AllToAll:
      return (n - 1) / n;
    case CommKind::Broadcast:
    case CommKind::Reduce:
    case CommKind::SendRecv:
    case CommKind::Other:
      return 1;
  }
  return 1;
}

}  // namespace twin::measured
