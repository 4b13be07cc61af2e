// twin._twin: the compiled half of the Python package, a thin layer over api/ (api/twin.hpp). Scenarios travel as a
// name or path, or TOML text, with "section.key=value" overrides; options as a dict of `twin sim`'s flag names;
// results as the JSON text the command's --json writes (the pure-Python half, twin/__init__.py, parses it). A UserError
// is raised as twin.ScenarioError (a ValueError) with `field`: the scenario key or option it names, else None.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/twin.hpp"
#include "model/scenario/errors.hpp"

namespace py = pybind11;

namespace twin::python {
namespace {

// A scenario as Python passes it: a name or path (`is_text` false) or TOML text, with overrides.
model::Scenario load(const std::string& source, bool is_text, const std::vector<std::string>& sets) {
  const std::vector<model::Override> overrides = api::parse_overrides(sets);
  return is_text ? api::scenario_from_text(source, overrides) : api::scenario_named(source, overrides);
}

// `twin sim`'s options from a dict of its flag names (underscores for dashes); unknown names are refused by name.
api::SimRequest sim_request(const py::dict& options) {
  api::SimRequest r;
  for (const auto& [key_object, value] : options) {
    const std::string key = py::str(key_object);
    if (key == "fidelity")
      r.fidelity = value.cast<std::string>();
    else if (key == "granularity")
      r.granularity = value.cast<std::string>();
    else if (key == "gpu")
      r.gpu = value.cast<std::string>();
    else if (key == "profile")
      r.profile = value.cast<std::string>();
    else if (key == "placement")
      r.placement = value.cast<std::string>();
    else if (key == "algorithm")
      r.algorithm = value.cast<std::string>();
    else if (key == "oversubscription")
      r.oversubscription = value.cast<double>();
    else if (key == "rail_optimized")
      r.rail_optimized = value.cast<bool>();
    else if (key == "ideal_network")
      r.ideal_network = value.cast<bool>();
    else if (key == "sensitivity_percent")
      r.sensitivity_percent = value.cast<double>();
    else if (key == "train_tokens")
      r.train_tokens = value.cast<std::string>();
    else if (key == "usd_per_gpu_hour")
      r.usd_per_gpu_hour = value.cast<double>();
    else if (key == "goodput")
      r.goodput = value.cast<bool>();
    else if (key == "slow_gpus")
      r.slow_gpus = value.cast<std::vector<std::string>>();
    else if (key == "slow_links")
      r.slow_links = value.cast<std::vector<std::string>>();
    else if (key == "failed_uplinks")
      r.failed_uplinks = value.cast<std::vector<std::string>>();
    else if (key == "slow_gpu_fraction")
      r.slow_gpu_fraction = value.cast<double>();
    else if (key == "slow_gpu_factor")
      r.slow_gpu_factor = value.cast<double>();
    else if (key == "seed")
      r.seed = value.cast<std::uint64_t>();
    else
      throw UserError("--" + key + ": no such option of a simulation");
  }
  return r;
}

std::string simulate(const std::string& source, bool is_text, const std::vector<std::string>& sets,
                     const py::dict& options) {
  const api::SimRequest request = sim_request(options);
  py::gil_scoped_release unlocked;
  return api::sim_document(api::simulate(load(source, is_text, sets), request), request).dump();
}

std::string graph(const std::string& source, bool is_text, const std::vector<std::string>& sets,
                  const std::string& granularity) {
  py::gil_scoped_release unlocked;
  const model::Program program =
      api::build_program_within_memory(load(source, is_text, sets), api::parse_granularity(granularity));
  return model::program_to_json(program).dump();
}

std::string sweep(const std::string& path, const std::vector<std::string>& sets, const std::vector<std::string>& varies,
                  const py::dict& options, double days) {
  api::SweepRequest request;
  request.scenario = path;
  request.sets = sets;
  request.varies = varies;
  request.extras = sim_request(options);
  request.within_days = days;
  api::check_within_days(request.within_days, request.extras);
  py::gil_scoped_release unlocked;
  return api::sweep_document(api::sweep(request), request).dump();
}

std::string search(const std::string& path, const std::vector<std::string>& sets, const py::dict& space,
                   const py::dict& options, double days) {
  api::SearchRequest request;
  request.scenario = path;
  request.sets = sets;
  for (const auto& [key_object, value] : space) {
    const std::string key = py::str(key_object);
    if (key == "vary_recompute")
      request.space.vary_recompute = value.cast<bool>();
    else if (key == "vary_sequence_parallel")
      request.space.vary_sequence_parallel = value.cast<bool>();
    else if (key == "vary_zero")
      request.space.vary_zero = value.cast<bool>();
    else if (key == "vary_schedule")
      request.space.vary_schedule = value.cast<bool>();
    else if (key == "vary_etp")
      request.space.vary_etp = value.cast<bool>();
    else if (key == "vary_cp")
      request.space.vary_cp = value.cast<bool>();
    else if (key == "memory_headroom")
      request.space.memory_headroom = value.cast<std::string>();
    else if (key == "vary_node")
      request.nodes = value.cast<std::vector<std::string>>();
    else if (key == "max_plans")
      request.max_plans = value.cast<int>();
    else if (key == "all")
      request.all = value.cast<bool>();
    else if (key == "explain")
      request.explain = value.cast<bool>();
    else
      throw UserError("--" + key + ": no such option of a search");
  }
  request.extras = sim_request(options);
  request.within_days = days;
  api::check_within_days(request.within_days, request.extras);
  py::gil_scoped_release unlocked;
  return api::search_document(api::search(request), request).dump();
}

// {"table": ..., "document": ...}: `predicted` and, when `measured_is_document`, `measured` are JSON text; otherwise
// `measured` is a file or a number of seconds.
std::string compare(const std::string& predicted, const std::string& predicted_name, const std::string& measured,
                    bool measured_is_document, const std::string& measured_name, bool allow_mismatch, int iterations,
                    bool fastest_step, std::size_t top) {
  api::CompareRequest request{allow_mismatch, iterations, fastest_step, top};
  py::gil_scoped_release unlocked;
  const nlohmann::json predicted_document = nlohmann::json::parse(predicted);
  const api::Comparison c = measured_is_document
                                ? api::compare_documents(predicted_document, predicted_name,
                                                         nlohmann::json::parse(measured), measured_name, request)
                                : api::compare(predicted_document, predicted_name, measured, request);
  return nlohmann::json{{"table", c.table}, {"document", c.document}}.dump();
}

// The field a UserError names: a scenario key, or an option's name ("--train-tokens: ..." -> "train_tokens").
py::object field_of(const UserError& error) {
  std::string field = api::field_of(error);
  const std::string message = error.what();
  if (field.empty() && message.rfind("--", 0) == 0) {
    const std::size_t end = message.find_first_of(" :=", 2);
    field = message.substr(2, end == std::string::npos ? std::string::npos : end - 2);
    for (char& c : field) c = c == '-' ? '_' : c;
  }
  return field.empty() ? py::none() : py::object(py::str(field));
}

}  // namespace
}  // namespace twin::python

PYBIND11_MODULE(_twin, m) {
  using namespace twin::python;
  m.doc() = "twin's library (api/twin.hpp); use the package twin, not this module";
  static py::exception<twin::UserError> scenario_error(m, "ScenarioError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const twin::UserError& error) {
      py::object instance = py::handle(scenario_error.ptr())(py::str(error.what()));
      instance.attr("field") = field_of(error);
      instance.attr("problems") = error.problems();
      PyErr_SetObject(scenario_error.ptr(), instance.ptr());
    } catch (const twin::RunFailure& error) {
      PyErr_SetString(PyExc_RuntimeError, error.what());
    }
  });
  m.def("set_scenario_directory", &twin::api::set_scenario_directory);
  m.def("scenario_directory", &twin::api::scenario_directory);
  m.def("resolve_scenario_path", &twin::api::resolve_scenario_path);
  m.def("scenario_toml", [](const std::string& source, bool is_text, const std::vector<std::string>& sets) {
    const twin::model::Scenario s = load(source, is_text, sets);
    return py::make_tuple(s.model.name, s.source, twin::model::to_toml(s));
  });
  m.def("simulate", &simulate);
  m.def("graph", &graph);
  m.def("sweep", &sweep);
  m.def("search", &search);
  m.def("compare", &compare);
}
