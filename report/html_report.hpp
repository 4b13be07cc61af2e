// `twin report`: one self-contained HTML page (inline CSS, SVG and a few lines of script; nothing fetched) of what a
// command wrote as JSON: a simulation (`twin sim --json`), a sweep, a search, or a comparison (`twin compare
// --json`). The kind is recognised from the document's keys. Every page has the sections its kind draws, each a
// <section> with a fixed id (docs/report.md lists them), so that a test can find them in the rendered page.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/scenario/errors.hpp"

namespace twin::report {

enum class ReportKind { Sim, Sweep, Search, Compare };
const char* to_string(ReportKind kind);

// The kind of a document, or nothing when it is none of the four (a trace, a program, a comparison op by op).
std::optional<ReportKind> report_kind(const nlohmann::json& document);

// The section ids a page of this kind has, in order.
std::vector<std::string> report_sections(ReportKind kind);

// A document of a kind that lacks a field the page draws: names the field.
class ReportError : public UserError {
 public:
  using UserError::UserError;
};

// The page. `source` names the file it came from (shown under the title). Throws ReportError naming the field when
// the document is not of a kind report_kind knows or lacks what its kind's page needs.
std::string html_report(const nlohmann::json& document, const std::string& source);

}  // namespace twin::report
