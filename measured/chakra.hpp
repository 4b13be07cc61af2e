// The Program as Chakra execution traces (MLCommons Chakra, schema/protobuf/et_def.proto; the subset twin uses is
// measured/chakra/et_def.proto): one file per rank, DIR/PREFIX.RANK.et, as ASTRA-sim reads them, and
// DIR/PREFIX.comm_groups.json, the ranks of each communication group (ASTRA-sim's --comm-group-configuration).
//
// Each op of a rank's list is one node, its id the op's index in the list:
//   Compute     COMP_NODE, attributes num_ops (its FLOPs), tensor_size (bytes it moves), is_cpu_op = false;
//   Collective  COMM_COLL_NODE, comm_type (CollectiveCommType), comm_size (bytes per rank, as the Program counts
//               them), pg_name (the group's id in comm_groups.json);
//   Send/Recv   COMM_SEND_NODE / COMM_RECV_NODE, comm_src, comm_dst (global ranks), comm_tag (the P2P tag:
//               (micro_batch * 1024 + sender_virtual_stage) * 2 + 1 for a backward gradient), comm_size.
// data_deps are the op's deps; ctrl_deps the previous op on the same ordered stream (compute, data-parallel), the
// order the Program's execution semantics impose (model/program/program.hpp). Every node also carries twin's own op label
// as its name and its phase, kind, layer and micro-batch as attributes, so that a reader gets the op back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/program/program.hpp"

namespace twin::measured {

// Writes the traces of every rank; returns the files written. Throws MeasuredError naming a file it cannot write.
std::vector<std::string> write_chakra(const model::Program& program, const std::string& directory,
                                      const std::string& prefix = "twin");

// One node as read back from a trace (what the round-trip test checks).
struct ChakraNode {
  std::uint64_t id = 0;
  std::string name;
  int type = 0;  // ChakraProtoMsg::NodeType
  std::vector<std::uint64_t> data_deps, ctrl_deps;
  std::int64_t num_ops = 0, tensor_size = 0;
  std::int64_t comm_type = -1, comm_size = 0, comm_src = -1, comm_dst = -1, comm_tag = -1;
  std::string pg_name;
};

struct ChakraTrace {
  std::string schema;  // the metadata's "schema" attribute
  int rank = -1;       // its "rank" attribute
  std::vector<ChakraNode> nodes;
};

// Reads one trace file back; throws MeasuredError naming the file and the message that does not parse.
ChakraTrace read_chakra(const std::string& path);

// The P2P tag of a Send or Recv as written in comm_tag.
std::int64_t chakra_tag(const model::Op& op);

}  // namespace twin::measured
