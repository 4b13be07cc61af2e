// How context-parallel ranks exchange keys and values (framework.cp_comm, Megatron-Core's --cp-comm-type): the
// scenario's choice. What each way sends is model/ops/context_parallel.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace twin::model {

enum class CpComm : std::uint8_t { P2P, AllGather, AllToAll };
std::string_view to_string(CpComm comm);                         // "p2p", "all_gather", "a2a"
std::optional<CpComm> cp_comm_from_name(std::string_view name);  // Megatron-Core's --cp-comm-type names

}  // namespace twin::model
