// The pieces an HTML report is made of: escaped text, tables, and charts drawn as inline SVG (horizontal bars,
// stacked bars of a time split, pairs of bars, a line through points). Each returns a fragment of markup; nothing
// here knows which command's document it draws (report/html_report.cpp does).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace twin::report::html {

// Text as HTML or XML character data or attribute value: < > & " ' replaced.
std::string escaped(std::string_view text);

// <section id="ID"><h2>TITLE</h2>BODY</section>: the sections the Chromium test looks for by id.
std::string section(const std::string& id, const std::string& title, const std::string& body);

// A table whose header cells sort it when clicked (the page's script). Cells are text, escaped here.
std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

// "key: value" lines of a summary, as a definition list. Values are text, escaped here.
std::string facts(const std::vector<std::pair<std::string, std::string>>& key_values);

struct Bar {
  std::string label;
  double value = 0;
  std::string text;  // written after the bar (the value with its unit)
};
// One horizontal bar per entry, longest = the plot's width.
std::string bar_chart(const std::vector<Bar>& bars, const std::string& colour);

// The parts of a time split, in the order of report::TimeSplit, with their colours.
struct Part {
  std::string name;
  std::string colour;
};
const std::vector<Part>& time_split_parts();
struct StackedBar {
  std::string label;
  std::vector<double> values;  // one per part
};
// One horizontal bar per entry split into its parts, the longest total = the plot's width, with a legend.
std::string stacked_bars(const std::vector<StackedBar>& bars, const std::vector<Part>& parts, const std::string& unit);

struct Pair {
  std::string label;
  double predicted = 0, measured = 0;
  std::string text;  // the values and the error
};
// For each entry, a predicted bar over a measured bar, scaled to the larger of the two (the entries have units of
// their own: seconds, TFLOP/s, fractions).
std::string paired_bars(const std::vector<Pair>& pairs);

struct Point {
  std::string label;  // the x value as written
  double x = 0;       // its position when the axis is numeric
  double y = 0;
};
// Points joined by a line, y from zero; x numeric (`numeric_x`) or one step per point in order.
std::string line_chart(const std::vector<Point>& points, bool numeric_x, const std::string& x_name,
                       const std::string& y_name);

}  // namespace twin::report::html
