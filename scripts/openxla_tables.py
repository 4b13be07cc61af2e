#!/usr/bin/env python3
"""Write sim/data/gemm_by_shape.csv and sim/data/collectives_by_size.csv from OpenXLA's measured performance tables.

    git -C xla show e97611c4c41c1f2dd331aca646792089f7f86b66:xla/service/gpu/model/matmul_interpolator_data.h > m.h
    git -C xla show e97611c4c41c1f2dd331aca646792089f7f86b66:xla/service/gpu/model/collective_interpolator_data.h > c.h
    scripts/openxla_tables.py m.h c.h

The tables are what XLA's GPU cost model reads (xla/service/gpu/model/matmul_interpolator.cc and
collective_interpolator.cc); NVIDIA and Google generated them on the GPUs named by their keys (xla/tools:
matmul_perf_table_gen_main and collective_perf_table_gen_main). Kept: the single (b = 1) GEMMs' bf16 rates, and the
all-to-alls, all-gathers, reduce-scatters and all-reduces of one 8-GPU node by group size (GB200: one NVL72 rack
in groups of 8 or 4). The FP8 columns are left out: on sm_90 they exceed the H100's dense FP8
datasheet peak (2424 TFLOP/s at 4096^3 against 1979), so they cannot be read as rates of the FLOPs counted here.
"""
import re
import sys

COMMIT = "e97611c4c41c1f2dd331aca646792089f7f86b66"


def gemm_rows(text):
    for key, body in re.findall(r'key: "(sm_[^"]*)"\s*value \{(.*?)\n    \}', text, re.S):
        for b, m, n, k, flops in re.findall(r"b: (\d+)\s+m: (\d+)\s+n: (\d+)\s+k: (\d+)\s+((?:flops \{[^}]*\}\s*)+)",
                                            body):
            rate = dict(re.findall(r'key: "([^"]*)" value: (\d+)', flops)).get("bf16xbf16->bf16")
            if b == "1" and rate:
                yield key, int(m), int(n), int(k), int(rate)


def collective_rows(text):
    """(gpu key, collective, group size, bytes, bytes per second) for every measured entry: bytes is the benchmark's
    tensor size (xla/tools/collective_perf_table_gen.cc: the operand of all-reduce, reduce-scatter and all-to-all, the
    output of all-gather; the throughput is that size over the time)."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "S8": 1, "U8": 1}
    parts = re.split(r'\n    key: "([^"]*)"', text)
    for key, body in zip(parts[1::2], parts[2::2]):
        for entry in body.split("\n      entries {"):
            fields = re.search(r'opcode: "([^"]*)".*?element_type: (\w+)\s+dimensions: (\d+).*?num_replica_groups: '
                               r'(\d+)\s+num_devices_per_group: (\d+).*?network_throughput_bytes_per_sec: (\d+)',
                               entry, re.S)
            if not fields:
                continue
            collective, element, elements, groups, per_group, rate = fields.groups()
            if collective not in ("all-to-all", "all-gather", "reduce-scatter", "all-reduce"):
                continue
            # One 8-GPU node (sm_90, B200); on GB200 the whole NVL72 rack, cut into groups of 8 or 4 (all 72 busy).
            whole_node = int(groups) * int(per_group) == 8
            whole_rack = key == "sm_100_GB200" and int(groups) * int(per_group) == 72 and per_group in ("4", "8")
            if whole_node or whole_rack:
                yield key, collective, int(per_group), int(elements) * sizes[element], int(rate)


def main():
    matmul, collective = (open(p).read() for p in sys.argv[1:3])
    with open("sim/data/gemm_by_shape.csv", "w") as out:
        out.write(f"# OpenXLA xla/service/gpu/model/matmul_interpolator_data.h at {COMMIT}: measured bf16 GEMM rates\n"
                  "# (one [m,k]x[k,n] GEMM, b = 1) by GPU key; written by scripts/openxla_tables.py\n"
                  "gpu,m,n,k,flops_per_s\n")
        for row in sorted(set(gemm_rows(matmul))):
            out.write(",".join(map(str, row)) + "\n")
    with open("sim/data/collectives_by_size.csv", "w") as out:
        out.write(f"# OpenXLA xla/service/gpu/model/collective_interpolator_data.h at {COMMIT}: measured collective\n"
                  "# throughput (bytes per second of the benchmark's tensor: the operand of all-reduce, reduce-scatter and all-to-all,\n"
                  "# the output of all-gather) in one 8-GPU node (GB200: an NVL72 rack), by GPU key, collective, group\n"
                  "# size and tensor bytes; written by scripts/openxla_tables.py\n"
                  "gpu,collective,group,bytes,bytes_per_s\n")
        for row in sorted(set(collective_rows(collective))):
            out.write(",".join(map(str, row)) + "\n")


if __name__ == "__main__":
    main()
