// Public measurements of kernels and collectives by shape, compiled in from sim/data/*.csv (each file says where its
// numbers come from; scripts/openxla_tables.py writes them from OpenXLA's performance tables):
//   gemm_by_shape.csv       one bf16 GEMM's measured FLOP/s on a 5 x 5 x 5 grid of m, n, k (256 to 4096) per GPU;
//   collectives_by_size.csv one all-to-all's, all-gather's, reduce-scatter's or all-reduce's measured bytes per second
//                           inside one node, by group size and bytes (1 KiB to 2 GiB; the operand, all-gather's
//                           output).
// The cost model reads a GEMM's shape loss and a collective's floor from them; nothing in them is a training run.
#pragma once

#include <string>
#include <vector>

namespace twin::sim {

// Measured GEMM rates of one GPU on a grid (m, n, k each in `grid`), interpolated linearly in log(m), log(n),
// log(k) on log(rate); outside the grid, the nearest edge's rate.
class GemmShapeTable {
 public:
  GemmShapeTable(std::string key, std::vector<double> grid, std::vector<double> flops_per_s);
  const std::string& key() const { return key_; }
  double flops_per_s(double m, double n, double k) const;
  // The rate at `shape` over the rate at the grid's largest GEMM (4096^3), at most 1: what a GEMM of this shape loses
  // to latency, pipeline fill, tile and wave quantization next to a large one, as measured.
  double shape_factor(double m, double n, double k) const;

 private:
  double at(std::size_t i, std::size_t j, std::size_t l) const;
  std::string key_;
  std::vector<double> grid_;
  std::vector<double> flops_per_s_;  // [m][n][k], grid_.size()^3
};

// Measured times of one collective in one GPU's node for one group size, interpolated linearly in log(bytes) on
// log(throughput); below the smallest size, its time (the latency floor); above the largest, its throughput.
class CollectiveTable {
 public:
  CollectiveTable(std::string key, int group, std::vector<std::pair<double, double>> bytes_and_rate);
  const std::string& key() const { return key_; }
  int group() const { return group_; }
  // Seconds of one collective on `bytes` as XLA's benchmark counts them: each member's whole operand (an all-to-all's
  // own share included), an all-gather's output.
  double seconds(double bytes) const;

 private:
  std::string key_;
  int group_;
  std::vector<std::pair<double, double>> points_;  // operand bytes, bytes per second; ascending
};

// The GEMM table measured on `gpu_name`'s chip (GpuSpec::name), or null: sm_90 for the GH100 parts (H100, H200, H800),
// B200's for B200 and GB200 (the same die; OpenXLA published no GB200 GEMM table). None for the A100 (no sm_80 table).
const GemmShapeTable* gemm_shape_table(const std::string& gpu_name);
// The table of `collective` ("all-to-all", "all-gather", "reduce-scatter", "all-reduce") for `group` members inside
// one node of `gpu_name`'s (2, 4 or 8; GB200: 4 or 8 in an NVL72 rack), or null: sm_90's for H100 and H200 (the same
// NVLink 4 and NVSwitches), none for the H800 (8 NVLinks of 18) or the A100.
const CollectiveTable* collective_table(const std::string& gpu_name, const std::string& collective, int group);
inline const CollectiveTable* all_to_all_table(const std::string& gpu_name, int group) {
  return collective_table(gpu_name, "all-to-all", group);
}

}  // namespace twin::sim
