#include "measured/chakra.hpp"

#include "chakra/et_def.pb.h"  // generated from measured/chakra/et_def.proto

#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/util/delimited_message_util.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "measured/kineto.hpp"
#include "model/ops/op_label.hpp"
#include "model/scenario/errors.hpp"
#include "model/scenario/files.hpp"

namespace twin::measured {
namespace {

namespace pb = ChakraProtoMsg;

// The schema version this writer follows (Chakra's converters write "1.0.2-chakra.0.0.4" and later
// "1.0.2-chakra.1.0.0"; the node fields used here are unchanged between them).
constexpr const char* kSchema = "1.0.2-chakra.1.0.0";

void add_int(pb::Node& node, const char* name, std::int64_t value) {
  pb::AttributeProto* attr = node.add_attr();
  attr->set_name(name);
  attr->set_int64_val(value);
}

void add_string(pb::Node& node, const char* name, const std::string& value) {
  pb::AttributeProto* attr = node.add_attr();
  attr->set_name(name);
  attr->set_string_val(value);
}

pb::CollectiveCommType comm_type(model::CollectiveKind kind) {
  switch (kind) {
    case model::CollectiveKind::AllReduce:
      return pb::ALL_REDUCE;
    case model::CollectiveKind::ReduceScatter:
      return pb::REDUCE_SCATTER;
    case model::CollectiveKind::AllGather:
      return pb::ALL_GATHER;
    case model::CollectiveKind::AllToAll:
      return pb::ALL_TO_ALL;
  }
  return pb::ALL_REDUCE;
}

// Distinct groups of the world, numbered as met: (group, first member) -> id.
class GroupIds {
 public:
  explicit GroupIds(const model::RankLayout& layout) : layout_(layout) {}
  int id(model::Group group, int rank) {
    const std::vector<int> members = layout_.group_members(group, rank);
    const auto key = std::make_pair(static_cast<int>(group), members.front());
    if (auto it = ids_.find(key); it != ids_.end()) return it->second;
    const int id = static_cast<int>(members_.size());
    ids_.emplace(key, id);
    members_.push_back(members);
    return id;
  }
  nlohmann::json to_json() const {
    nlohmann::json out = nlohmann::json::object();
    for (std::size_t id = 0; id < members_.size(); ++id) out[std::to_string(id)] = members_[id];
    return out;
  }

 private:
  const model::RankLayout& layout_;
  std::map<std::pair<int, int>, int> ids_;
  std::vector<std::vector<int>> members_;
};

pb::Node node_of(const model::Program& program, int rank, std::size_t index, GroupIds& groups,
                 std::map<model::Stream, std::size_t>& last_on_stream) {
  const model::Op& op = program.ops_of_rank(rank)[index];
  const model::RankLayout& layout = program.layout;
  pb::Node node;
  node.set_id(index);
  node.set_name(model::op_label(op));
  for (std::int32_t dep : op.deps) node.add_data_deps(static_cast<std::uint64_t>(dep));
  if (op.stream != model::Stream::Pipeline) {
    if (auto it = last_on_stream.find(op.stream); it != last_on_stream.end()) node.add_ctrl_deps(it->second);
    last_on_stream[op.stream] = index;
  }
  add_string(node, "twin_phase", std::string(model::to_string(op.phase)));
  add_int(node, "twin_layer", op.layer);
  add_int(node, "twin_micro_batch", op.micro_batch);
  switch (op.kind) {
    case model::OpKind::Compute: {
      node.set_type(pb::COMP_NODE);
      add_int(node, "num_ops", static_cast<std::int64_t>(op.flops));
      add_int(node, "tensor_size", static_cast<std::int64_t>(op.bytes));
      pb::AttributeProto* cpu = node.add_attr();
      cpu->set_name("is_cpu_op");
      cpu->set_bool_val(false);
      add_string(node, "twin_kind", std::string(model::to_string(op.what)));
      break;
    }
    case model::OpKind::Collective:
      node.set_type(pb::COMM_COLL_NODE);
      add_int(node, "comm_type", comm_type(op.collective));
      add_int(node, "comm_size", static_cast<std::int64_t>(op.bytes));
      add_string(node, "pg_name", std::to_string(groups.id(op.group, rank)));
      break;
    case model::OpKind::Send:
    case model::OpKind::Recv: {
      const model::RankCoord me = layout.coord_of(rank);
      const int peer = layout.rank_of({me.dp, op.peer_stage, me.tp});
      const bool send = op.kind == model::OpKind::Send;
      node.set_type(send ? pb::COMM_SEND_NODE : pb::COMM_RECV_NODE);
      add_int(node, "comm_src", send ? rank : peer);
      add_int(node, "comm_dst", send ? peer : rank);
      add_int(node, "comm_tag", chakra_tag(op));
      add_int(node, "comm_size", static_cast<std::int64_t>(op.bytes));
      break;
    }
  }
  return node;
}

// The output folder's policy (README "Reliability"): no symbolic link in it is followed out of it. A stale temporary
// (or a link planted in its place) is removed, not written through; the new file is created afresh (O_EXCL, O_NOFOLLOW)
// and renamed over the name, which replaces a link there rather than the file it points at.
void write_file(const std::string& path, const std::string& bytes) {
  const std::string temporary = path + ".tmp";
  ::unlink(temporary.c_str());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw MeasuredError(fmt::format("cannot write '{}': {}", temporary, std::strerror(errno)));
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  const int error_number = errno;
  if (::close(fd) != 0 || written != bytes.size()) {
    ::unlink(temporary.c_str());
    throw twin::RunFailure(fmt::format("writing '{}' failed: {}", temporary, std::strerror(error_number)));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) throw MeasuredError(fmt::format("cannot write '{}': {}", path, error.message()));
}

}  // namespace

std::int64_t chakra_tag(const model::Op& op) {
  const model::P2PTag tag = model::p2p_tag(op);
  return (static_cast<std::int64_t>(tag.micro_batch) * 1024 + tag.sender_virtual_stage) * 2 +
         (tag.phase == model::Phase::Backward ? 1 : 0);
}

std::vector<std::string> write_chakra(const model::Program& program, const std::string& directory,
                                      const std::string& prefix) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    throw MeasuredError(fmt::format("cannot make the directory '{}'", directory));
  }
  GroupIds groups(program.layout);
  std::vector<std::string> written;
  for (int rank = 0; rank < program.layout.world_size(); ++rank) {
    std::string bytes;
    {
      google::protobuf::io::StringOutputStream stream(&bytes);
      pb::GlobalMetadata metadata;
      metadata.set_version(kSchema);
      pb::AttributeProto* schema = metadata.add_attr();
      schema->set_name("schema");
      schema->set_string_val(kSchema);
      pb::AttributeProto* rank_attr = metadata.add_attr();
      rank_attr->set_name("rank");
      rank_attr->set_int64_val(rank);
      pb::AttributeProto* source = metadata.add_attr();
      source->set_name("twin_scenario");
      source->set_string_val(program.scenario.model.name);
      google::protobuf::util::SerializeDelimitedToZeroCopyStream(metadata, &stream);
      std::map<model::Stream, std::size_t> last_on_stream;
      const std::size_t ops = program.ops_of_rank(rank).size();
      for (std::size_t index = 0; index < ops; ++index) {
        const pb::Node node = node_of(program, rank, index, groups, last_on_stream);
        google::protobuf::util::SerializeDelimitedToZeroCopyStream(node, &stream);
      }
    }
    const std::string path = fmt::format("{}/{}.{}.et", directory, prefix, rank);
    write_file(path, bytes);
    written.push_back(path);
  }
  const std::string groups_path = fmt::format("{}/{}.comm_groups.json", directory, prefix);
  write_file(groups_path, groups.to_json().dump(1) + "\n");
  written.push_back(groups_path);
  return written;
}

ChakraTrace read_chakra(const std::string& path) {
  const model::InputFile input(path, "Chakra trace", model::kMaxTraceBytes);
  google::protobuf::io::FileInputStream stream(input.fd());
  ChakraTrace trace;
  pb::GlobalMetadata metadata;
  bool clean_eof = false;
  if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&metadata, &stream, &clean_eof)) {
    throw MeasuredError(fmt::format("'{}': no Chakra GlobalMetadata at its start", path));
  }
  for (const pb::AttributeProto& attr : metadata.attr()) {
    if (attr.name() == "schema") trace.schema = attr.string_val();
    if (attr.name() == "rank") trace.rank = static_cast<int>(attr.int64_val());
  }
  for (;;) {
    pb::Node node;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&node, &stream, &clean_eof)) {
      if (clean_eof) break;
      throw MeasuredError(fmt::format("'{}': node {} does not parse as a Chakra Node", path, trace.nodes.size()));
    }
    ChakraNode out;
    out.id = node.id();
    out.name = node.name();
    out.type = node.type();
    out.data_deps.assign(node.data_deps().begin(), node.data_deps().end());
    out.ctrl_deps.assign(node.ctrl_deps().begin(), node.ctrl_deps().end());
    for (const pb::AttributeProto& attr : node.attr()) {
      const std::string& name = attr.name();
      if (name == "num_ops") out.num_ops = attr.int64_val();
      if (name == "tensor_size") out.tensor_size = attr.int64_val();
      if (name == "comm_type") out.comm_type = attr.int64_val();
      if (name == "comm_size") out.comm_size = attr.int64_val();
      if (name == "comm_src") out.comm_src = attr.int64_val();
      if (name == "comm_dst") out.comm_dst = attr.int64_val();
      if (name == "comm_tag") out.comm_tag = attr.int64_val();
      if (name == "pg_name") out.pg_name = attr.string_val();
    }
    trace.nodes.push_back(std::move(out));
  }
  return trace;
}

}  // namespace twin::measured
