#include "sim/measured_tables.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace twin::sim {

namespace data {
extern const char kGemmByShapeCsv[];
extern const char kCollectivesBySizeCsv[];
}  // namespace data

namespace {

// The rows of a CSV text, split at commas; '#' comments and the header row (its first field "gpu") skipped.
std::vector<std::vector<std::string>> csv_rows(const char* text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("gpu,", 0) == 0) continue;
    std::vector<std::string> fields;
    std::istringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) fields.push_back(cell);
    rows.push_back(std::move(fields));
  }
  return rows;
}

// Where x falls on an ascending axis in log space: the lower index and the fraction towards the next (clamped).
std::pair<std::size_t, double> log_position(const std::vector<double>& axis, double x) {
  if (axis.size() < 2 || x <= axis.front()) return {0, 0.0};
  if (x >= axis.back()) return {axis.size() - 2, 1.0};
  std::size_t i = 0;
  while (axis[i + 1] < x) ++i;
  return {i, std::log(x / axis[i]) / std::log(axis[i + 1] / axis[i])};
}

std::map<std::string, GemmShapeTable> load_gemm_tables() {
  std::map<std::string, std::map<std::array<double, 3>, double>> points;
  for (const auto& row : csv_rows(data::kGemmByShapeCsv)) {
    if (row.size() != 5) throw std::logic_error("sim/data/gemm_by_shape.csv: a row without 5 fields");
    points[row[0]][{std::stod(row[1]), std::stod(row[2]), std::stod(row[3])}] = std::stod(row[4]);
  }
  std::map<std::string, GemmShapeTable> tables;
  for (const auto& [key, by_shape] : points) {
    std::vector<double> grid;
    for (const auto& [shape, rate] : by_shape) grid.push_back(shape[0]);
    grid.erase(std::unique(grid.begin(), grid.end()), grid.end());
    std::vector<double> rates;
    for (double m : grid) {
      for (double n : grid) {
        for (double k : grid) {
          auto it = by_shape.find({m, n, k});
          if (it == by_shape.end()) throw std::logic_error("sim/data/gemm_by_shape.csv: " + key + " is not a full grid");
          rates.push_back(it->second);
        }
      }
    }
    tables.emplace(key, GemmShapeTable(key, std::move(grid), std::move(rates)));
  }
  return tables;
}

using CollectiveKey = std::tuple<std::string, std::string, int>;  // GPU key, collective, group size

std::map<CollectiveKey, CollectiveTable> load_collective_tables() {
  std::map<CollectiveKey, std::vector<std::pair<double, double>>> points;
  for (const auto& row : csv_rows(data::kCollectivesBySizeCsv)) {
    if (row.size() != 5) throw std::logic_error("sim/data/collectives_by_size.csv: a row without 5 fields");
    points[{row[0], row[1], std::stoi(row[2])}].emplace_back(std::stod(row[3]), std::stod(row[4]));
  }
  std::map<CollectiveKey, CollectiveTable> tables;
  for (auto& [key, rows] : points) {
    tables.emplace(key, CollectiveTable(std::get<0>(key), std::get<2>(key), std::move(rows)));
  }
  return tables;
}

// OpenXLA's table keys by chip (xla/service/gpu/model/*_interpolator_data.h).
std::string table_key(const std::string& gpu_name, bool gemm) {
  auto starts = [&](const char* prefix) { return gpu_name.rfind(prefix, 0) == 0; };
  // The H800 is a GH100 with 8 NVLinks of the H100's 18: the sm_90 GEMMs, not its all-to-alls.
  if (starts("H100") || starts("H200") || (gemm && starts("H800"))) return "sm_90";
  if (starts("B200")) return "sm_100_B200";
  if (starts("GB200")) return gemm ? "sm_100_B200" : "sm_100_GB200";
  return "";
}

}  // namespace

GemmShapeTable::GemmShapeTable(std::string key, std::vector<double> grid, std::vector<double> flops_per_s)
    : key_(std::move(key)), grid_(std::move(grid)), flops_per_s_(std::move(flops_per_s)) {}

double GemmShapeTable::at(std::size_t i, std::size_t j, std::size_t l) const {
  return flops_per_s_[(i * grid_.size() + j) * grid_.size() + l];
}

double GemmShapeTable::flops_per_s(double m, double n, double k) const {
  const auto [i, fi] = log_position(grid_, m);
  const auto [j, fj] = log_position(grid_, n);
  const auto [l, fl] = log_position(grid_, k);
  double log_rate = 0;
  for (int di = 0; di < 2; ++di) {
    for (int dj = 0; dj < 2; ++dj) {
      for (int dl = 0; dl < 2; ++dl) {
        const double weight = (di ? fi : 1 - fi) * (dj ? fj : 1 - fj) * (dl ? fl : 1 - fl);
        if (weight > 0) log_rate += weight * std::log(at(i + di, j + dj, l + dl));
      }
    }
  }
  return std::exp(log_rate);
}

double GemmShapeTable::shape_factor(double m, double n, double k) const {
  const double largest = grid_.back();
  return std::min(1.0, flops_per_s(m, n, k) / flops_per_s(largest, largest, largest));
}

CollectiveTable::CollectiveTable(std::string key, int group, std::vector<std::pair<double, double>> bytes_and_rate)
    : key_(std::move(key)), group_(group), points_(std::move(bytes_and_rate)) {
  std::sort(points_.begin(), points_.end());
}

double CollectiveTable::seconds(double bytes) const {
  if (points_.empty() || bytes <= 0) return 0;
  if (bytes <= points_.front().first) return points_.front().first / points_.front().second;
  if (bytes >= points_.back().first) return bytes / points_.back().second;
  std::size_t i = 0;
  while (points_[i + 1].first < bytes) ++i;
  const auto [b0, r0] = points_[i];
  const auto [b1, r1] = points_[i + 1];
  const double f = std::log(bytes / b0) / std::log(b1 / b0);
  return bytes / std::exp((1 - f) * std::log(r0) + f * std::log(r1));
}

const GemmShapeTable* gemm_shape_table(const std::string& gpu_name) {
  static const std::map<std::string, GemmShapeTable> tables = load_gemm_tables();
  auto it = tables.find(table_key(gpu_name, true));
  return it == tables.end() ? nullptr : &it->second;
}

const CollectiveTable* collective_table(const std::string& gpu_name, const std::string& collective, int group) {
  static const std::map<CollectiveKey, CollectiveTable> tables = load_collective_tables();
  auto it = tables.find({table_key(gpu_name, false), collective, group});
  return it == tables.end() ? nullptr : &it->second;
}

}  // namespace twin::sim
