// The page around the sections: styles, the console-error hook and the table sort (the only script), and the
// recognition of a document's kind.
#include "report/html_report.hpp"

#include <fmt/format.h>

#include "report/html_parts.hpp"
#include "report/html_sections.hpp"

namespace twin::report {

namespace {

constexpr const char* kStyle = R"(body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:28px}
.source{color:#666;font-size:13px}.scroll{overflow-x:auto;max-width:100%}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:4px 18px;font-size:14px}
dl.facts dt{color:#555}dl.facts dd{margin:0}
table{border-collapse:collapse;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #e4e4e4;text-align:right}
th{cursor:pointer;background:#f4f4f4;position:sticky;top:0}td:first-child,th:first-child{text-align:left}
svg.chart{max-width:100%;height:auto;font-size:12px}svg text{font-family:Helvetica,Arial,sans-serif}
.note{color:#666;font-size:13px}#console-errors{color:#b00}
)";

// Before anything else runs: every uncaught error and console.error is counted on the <html> element (the Chromium
// test reads the count from the rendered page), and listed at the top of the page.
constexpr const char* kErrorHook = R"(<script>
(function(){var n=0,root=document.documentElement;
function note(message){n+=1;root.setAttribute('data-console-errors',String(n));
var box=document.getElementById('console-errors');if(box){box.hidden=false;box.textContent+=message+'\n';}}
window.addEventListener('error',function(e){note('error: '+e.message);});
var original=console.error;console.error=function(){note(Array.prototype.join.call(arguments,' '));
original.apply(console,arguments);};})();
</script>
)";

// A click on a header sorts its table by that column: numbers as numbers, the rest as text; again reverses.
constexpr const char* kSortScript = R"(<script>
(function(){document.querySelectorAll('table.sortable').forEach(function(table){
var heads=table.querySelectorAll('th');heads.forEach(function(th,column){th.addEventListener('click',function(){
var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);var up=th.getAttribute('data-up')!=='1';
heads.forEach(function(h){h.removeAttribute('data-up');});if(up)th.setAttribute('data-up','1');
function key(row){var t=row.cells[column]?row.cells[column].textContent:'';var x=parseFloat(t);return isNaN(x)?t:x;}
rows.sort(function(a,b){var x=key(a),y=key(b);var c=(typeof x===typeof y)?(x<y?-1:x>y?1:0):(typeof x==='number'?-1:1);
return up?c:-c;});rows.forEach(function(row){body.appendChild(row);});});});});
document.documentElement.setAttribute('data-rendered','yes');})();
</script>
)";

std::string model_name(const nlohmann::json& document, ReportKind kind) {
  const nlohmann::json* scenario = document.contains("scenario") ? &document.at("scenario") : nullptr;
  if (kind == ReportKind::Sim && scenario != nullptr && scenario->is_object()) return scenario->value("name", "");
  if (scenario != nullptr && scenario->is_string()) return scenario->get<std::string>();
  return "";
}

}  // namespace

const char* to_string(ReportKind kind) {
  switch (kind) {
    case ReportKind::Sim:
      return "simulation";
    case ReportKind::Sweep:
      return "sweep";
    case ReportKind::Search:
      return "search";
    case ReportKind::Compare:
      return "comparison";
  }
  return "";
}

std::optional<ReportKind> report_kind(const nlohmann::json& document) {
  if (!document.is_object()) return std::nullopt;
  const auto has = [&](const char* key) { return document.contains(key); };
  if (has("mode") && has("totals") && document.at("mode") != "ops") return ReportKind::Compare;
  if (has("plans") && has("plans_that_fit")) return ReportKind::Search;
  if (has("variants") && has("varied")) return ReportKind::Sweep;
  if (has("iteration_time_s") && has("stages") && has("scenario") && document.at("scenario").is_object()) {
    return ReportKind::Sim;
  }
  return std::nullopt;
}

std::vector<std::string> report_sections(ReportKind kind) {
  switch (kind) {
    case ReportKind::Sim:
      return {"summary", "time-split", "stages", "pipeline"};
    case ReportKind::Sweep:
      return {"summary", "curve", "time-split", "variants"};
    case ReportKind::Search:
      return {"summary", "ranking", "time-split", "plans"};
    case ReportKind::Compare:
      return {"summary", "predicted-vs-measured", "stages"};
  }
  return {};
}

std::string html_report(const nlohmann::json& document, const std::string& source) {
  const std::optional<ReportKind> kind = report_kind(document);
  if (!kind) {
    throw ReportError(
        "not a document twin report reads: it takes what twin sim --json, twin sweep --json, twin search --json or "
        "twin compare --json (of summaries, not traces op by op) wrote");
  }
  std::string body;
  try {
    switch (*kind) {
      case ReportKind::Sim:
        body = html::sim_sections(document);
        break;
      case ReportKind::Sweep:
        body = html::sweep_sections(document);
        break;
      case ReportKind::Search:
        body = html::search_sections(document);
        break;
      case ReportKind::Compare:
        body = html::compare_sections(document);
        break;
    }
  } catch (const nlohmann::json::exception& error) {  // a field of the wrong type deep inside
    throw ReportError(
        fmt::format("a {} document with a field twin report cannot read: {}", to_string(*kind), error.what()));
  }
  const std::string name = model_name(document, *kind);
  const std::string title = fmt::format("twin {}{}", to_string(*kind), name.empty() ? "" : " of " + name);
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta "
      "charset=\"utf-8\">\n<title>{0}</title>\n<style>\n{1}</style>\n"
      "{2}</head>\n<body>\n<pre id=\"console-errors\" hidden></pre>\n<h1>{0}</h1>\n<p class=\"source\">from {3}</p>\n"
      "{4}{5}</body>\n</html>\n",
      html::escaped(title), kStyle, kErrorHook, html::escaped(source), body, kSortScript);
}

}  // namespace twin::report
