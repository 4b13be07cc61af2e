// A prediction next to a measurement, as `twin compare` makes it: a summary (twin sim --json) against another summary
// (twin run --json, another twin sim), a measured run (PyTorch profiler traces, a Megatron-LM / NeMo / torchtitan
// log) or an iteration time in seconds; or two traces op by op. Returns the table it prints and the document
// `twin compare --json` writes.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace twin::api {

struct CompareRequest {
  bool allow_mismatch = false;  // compare even when model, plan or hardware differ (each difference is a warning)
  int iterations = 0;           // a profiler trace without ProfilerStep ranges: the iterations it holds (0: none)
  bool fastest_step = false;    // profiler traces: each rank's fastest step, not the mean
  std::size_t top = 10;         // two traces: the ops whose times differ most
};

struct Comparison {
  std::string table;        // what `twin compare` prints
  nlohmann::json document;  // what `twin compare --json` writes
};

// The JSON file at `path`; throws UserError naming it when it is a directory or not JSON.
nlohmann::json read_json_file(const std::string& path);

// `predicted` (a document read from `predicted_name`) against `measured`: a number of seconds ("60.1"), a measured
// run's file or folder, or a JSON summary or trace file. Throws UserError naming the file.
Comparison compare(const nlohmann::json& predicted, const std::string& predicted_name, const std::string& measured,
                   const CompareRequest& request = {});
// Two documents already read (a summary against a summary, or a trace against a trace).
Comparison compare_documents(const nlohmann::json& predicted, const std::string& predicted_name,
                             const nlohmann::json& measured, const std::string& measured_name,
                             const CompareRequest& request = {});

}  // namespace twin::api
