#include "model/scenario/cp_comm.hpp"

#include "model/scenario/scenario_names.hpp"

namespace twin::model {

std::string_view to_string(CpComm comm) {
  return names::name_of(names::kCpComms, comm);
}

std::optional<CpComm> cp_comm_from_name(std::string_view name) {
  return names::value_named(names::kCpComms, name);
}

}  // namespace twin::model
