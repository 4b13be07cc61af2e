// Markup of the report's pieces. Charts are plain SVG with a viewBox, so that they scale with the page; sizes are
// in the SVG's own units (about pixels at a 1000 px wide page).
#include "report/html_parts.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace twin::report::html {

namespace {

constexpr double kLabelWidth = 300, kPlotWidth = 560, kTextWidth = 200, kRow = 20;

std::string svg_open(double width, double height) {
  return fmt::format(
      "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {:.0f} {:.0f}\" width=\"{:.0f}\" "
      "height=\"{:.0f}\">\n",
      width, height, width, height);
}

std::string text_at(double x, double y, const std::string& text, const char* anchor = "start") {
  return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\">{}</text>\n", x, y, anchor, escaped(text));
}

std::string rect(double x, double y, double width, double height, const std::string& fill) {
  return fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", x, y,
                     std::max(0.0, width), height, fill);
}

double finite_or_zero(double value) {
  return std::isfinite(value) ? value : 0.0;
}

}  // namespace

std::string escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string section(const std::string& id, const std::string& title, const std::string& body) {
  return fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n{}</section>\n", id, escaped(title), body);
}

std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::string out = "<div class=\"scroll\"><table class=\"sortable\">\n<thead><tr>";
  for (const std::string& name : header) out += "<th>" + escaped(name) + "</th>";
  out += "</tr></thead>\n<tbody>\n";
  for (const auto& row : rows) {
    out += "<tr>";
    for (const std::string& cell : row) out += "<td>" + escaped(cell) + "</td>";
    out += "</tr>\n";
  }
  return out + "</tbody></table></div>\n";
}

std::string facts(const std::vector<std::pair<std::string, std::string>>& key_values) {
  std::string out = "<dl class=\"facts\">\n";
  for (const auto& [key, value] : key_values) out += "<dt>" + escaped(key) + "</dt><dd>" + escaped(value) + "</dd>\n";
  return out + "</dl>\n";
}

std::string bar_chart(const std::vector<Bar>& bars, const std::string& colour) {
  double longest = 0;
  for (const Bar& bar : bars) longest = std::max(longest, finite_or_zero(bar.value));
  const double height = kRow * static_cast<double>(bars.size()) + 10;
  std::string out = svg_open(kLabelWidth + kPlotWidth + kTextWidth, height);
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const double y = 5 + kRow * static_cast<double>(i);
    const double width = longest > 0 ? kPlotWidth * finite_or_zero(bars[i].value) / longest : 0;
    out += text_at(kLabelWidth - 6, y + 13, bars[i].label, "end");
    out += rect(kLabelWidth, y + 2, width, kRow - 4, colour);
    out += text_at(kLabelWidth + width + 6, y + 13, bars[i].text);
  }
  return out + "</svg>\n";
}

const std::vector<Part>& time_split_parts() {
  static const std::vector<Part> parts = {
      {"compute", "#4e79a7"},    {"exposed TP", "#f28e2b"}, {"exposed CP", "#edc948"}, {"exposed EP", "#b07aa1"},
      {"exposed DP", "#e15759"}, {"exposed PP", "#76b7b2"}, {"host", "#9c755f"},       {"fill/drain", "#d3d3d3"}};
  return parts;
}

std::string stacked_bars(const std::vector<StackedBar>& bars, const std::vector<Part>& parts, const std::string& unit) {
  double longest = 0;
  for (const StackedBar& bar : bars) {
    double total = 0;
    for (const double value : bar.values) total += finite_or_zero(value);
    longest = std::max(longest, total);
  }
  const double legend = 24;
  const double height = kRow * static_cast<double>(bars.size()) + 10 + legend;
  std::string out = svg_open(kLabelWidth + kPlotWidth + kTextWidth, height);
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const double y = 5 + kRow * static_cast<double>(i);
    out += text_at(kLabelWidth - 6, y + 13, bars[i].label, "end");
    double x = kLabelWidth, total = 0;
    for (std::size_t p = 0; p < parts.size() && p < bars[i].values.size(); ++p) {
      const double value = finite_or_zero(bars[i].values[p]);
      const double width = longest > 0 ? kPlotWidth * value / longest : 0;
      out += fmt::format("<g><title>{}: {:.4g} {}</title>{}</g>", escaped(parts[p].name), value, escaped(unit),
                         rect(x, y + 2, width, kRow - 4, parts[p].colour));
      x += width;
      total += value;
    }
    out += text_at(x + 6, y + 13, fmt::format("{:.4g} {}", total, unit));
  }
  double x = 10;
  const double y = height - legend + 6;
  for (const Part& part : parts) {
    out += rect(x, y, 12, 12, part.colour) + text_at(x + 16, y + 10, part.name);
    x += 30 + 7 * static_cast<double>(part.name.size());
  }
  return out + "</svg>\n";
}

std::string paired_bars(const std::vector<Pair>& pairs) {
  const double pair_height = 2 * kRow + 6, legend = 24;
  const double height = pair_height * static_cast<double>(pairs.size()) + 10 + legend;
  std::string out = svg_open(kLabelWidth + kPlotWidth + kTextWidth + 100, height);
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const Pair& pair = pairs[i];
    const double y = 5 + pair_height * static_cast<double>(i);
    const double scale = std::max(std::abs(finite_or_zero(pair.predicted)), std::abs(finite_or_zero(pair.measured)));
    const auto width = [&](double v) { return scale > 0 ? kPlotWidth * std::abs(finite_or_zero(v)) / scale : 0.0; };
    out += text_at(kLabelWidth - 6, y + kRow + 3, pair.label, "end");
    out += rect(kLabelWidth, y + 2, width(pair.predicted), kRow - 4, "#4e79a7");
    out += rect(kLabelWidth, y + kRow, width(pair.measured), kRow - 4, "#f28e2b");
    out += text_at(kLabelWidth + kPlotWidth + 8, y + kRow + 3, pair.text);
  }
  const double y = height - legend + 6;
  out += rect(10, y, 12, 12, "#4e79a7") + text_at(26, y + 10, "predicted");
  out += rect(110, y, 12, 12, "#f28e2b") + text_at(126, y + 10, "measured");
  return out + "</svg>\n";
}

std::string line_chart(const std::vector<Point>& points, bool numeric_x, const std::string& x_name,
                       const std::string& y_name) {
  const double left = 80, top = 36, width = 760, height = 300, bottom = 60;
  std::string out = svg_open(left + width + 40, top + height + bottom);
  double y_max = 0, x_min = 0, x_max = 1;
  for (const Point& p : points) y_max = std::max(y_max, finite_or_zero(p.y));
  if (numeric_x && !points.empty()) {
    const auto [low, high] =
        std::minmax_element(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
    x_min = low->x, x_max = high->x > low->x ? high->x : low->x + 1;
  }
  const auto x_of = [&](std::size_t i) {
    if (numeric_x) return left + width * (points[i].x - x_min) / (x_max - x_min);
    return left +
           (points.size() > 1 ? width * static_cast<double>(i) / static_cast<double>(points.size() - 1) : width / 2);
  };
  const auto y_of = [&](double y) { return top + height - (y_max > 0 ? height * finite_or_zero(y) / y_max : 0); };
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left, top, top + height);
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", left, top + height,
                     left + width);
  for (int tick = 0; tick <= 4; ++tick) {
    const double y = y_max * tick / 4;
    out += text_at(left - 6, y_of(y) + 4, fmt::format("{:.3g}", y), "end");
  }
  std::string path;
  for (std::size_t i = 0; i < points.size(); ++i) {
    path += fmt::format("{}{:.1f},{:.1f}", i == 0 ? "M" : " L", x_of(i), y_of(points[i].y));
    out +=
        fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#4e79a7\"><title>{}: {:.4g}</title></circle>\n",
                    x_of(i), y_of(points[i].y), escaped(points[i].label), points[i].y);
    out += text_at(x_of(i), top + height + 16, points[i].label, "middle");
  }
  out += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"#4e79a7\" stroke-width=\"2\"/>\n", path);
  out += text_at(left + width / 2, top + height + 40, x_name, "middle");
  out += text_at(8, 14, y_name);
  return out + "</svg>\n";
}

}  // namespace twin::report::html
