// The sections of each kind of report page (report/html_report.hpp), as markup; shared helpers to read a document.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace twin::report::html {

std::string sim_sections(const nlohmann::json& document);      // html_sim.cpp
std::string compare_sections(const nlohmann::json& document);  // html_sim.cpp
std::string sweep_sections(const nlohmann::json& document);    // html_plans.cpp
std::string search_sections(const nlohmann::json& document);   // html_plans.cpp

// document[key], or ReportError naming `key` when it is absent or not of the type asked.
const nlohmann::json& required(const nlohmann::json& document, const char* key);
double required_number(const nlohmann::json& document, const char* key);

// The time split of a summary's "time_split" (fractions, or seconds with `_s` keys), in seconds, in the order of
// time_split_parts().
std::vector<double> split_seconds(const nlohmann::json& split, double iteration_time_s);

}  // namespace twin::report::html
