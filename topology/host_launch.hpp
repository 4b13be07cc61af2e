// What a node's host CPU takes to issue one kernel from PyTorch's eager path (Python, the framework's module, the
// dispatcher, the launch call), in microseconds: the pace at which a framework that launches from Python can feed
// the GPU (cluster.host_us_per_kernel overrides it; docs/simulator.md, "The host").
//
// The measurement (Transformer Engine issue #2053, "[PyTorch] High CPU overhead on Grace systems",
// github.com/NVIDIA/TransformerEngine/issues/2053, August 2025): the host time of one torch.nn.Linear forward (BF16,
// hidden 2048, 8192 tokens), which launches a single cuBLAS GEMM (TE issue #836, a maintainer's answer):
//   DGX H100, 2x Intel Xeon Platinum 8480C   13.48 us
//   GH200 (Grace)                            33.17 us
//   GB200 (Grace)                            37.08 us
// No such measurement was found for the other nodes' hosts; each takes the measured host nearest to it, stated:
//   DGX H200 (the DGX H100 chassis and CPUs, DGX H200 datasheet)        the 8480C's
//   DGX B200 (2x Xeon Platinum 8570, the 8480C's Emerald Rapids successor) the 8480C's
//   HGX H800 (x86 hosts of the builder's choice)                        the 8480C's
//   DGX A100 (2x AMD EPYC 7742, 2019)                                   the 8480C's: an older x86 core, so if anything
//                                                                        an underestimate of its host's time
#pragma once

namespace twin::topology {

inline constexpr double kXeon8480cHostUsPerKernel = 13.48;
inline constexpr double kGb200GraceHostUsPerKernel = 37.08;

}  // namespace twin::topology
