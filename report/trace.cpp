#include "report/trace.hpp"

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

#include "model/ops/op_label.hpp"

namespace twin::report {

std::string chrome_trace(const model::Program& program, const Timeline& timeline, const std::vector<int>& ranks) {
  std::string out;
  auto it = std::back_inserter(out);
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"engine\":\"" + timeline.engine + "\"},\"traceEvents\":[\n";
  bool first = true;
  const auto separator = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  static const char* const kStreams[] = {"compute", "data-parallel", "pipeline", "expert"};
  for (const RankTimeline& rank : timeline.ranks) {
    if (!ranks.empty() && std::find(ranks.begin(), ranks.end(), rank.rank) == ranks.end()) continue;
    const model::RankCoord coord = program.layout.coord_of(rank.rank);
    separator();
    fmt::format_to(it,
                   "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"args\":{{\"name\":\"rank {0} (stage {1}, "
                   "dp {2}, tp {3})\"}}}},\n{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{0},\"args\":{{"
                   "\"sort_index\":{0}}}}}",
                   rank.rank, rank.stage, coord.dp, coord.tp);
    // The expert stream only where the Program uses it (framework.moe_a2a_overlap), so that other traces keep theirs.
    const int streams = program.scenario.framework.moe_a2a_overlap ? 4 : 3;
    for (int stream = 0; stream < streams; ++stream) {
      fmt::format_to(it,
                     ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                     rank.rank, stream, kStreams[stream]);
    }
    const auto& ops = program.stage_ops[rank.stage];
    for (const OpSpan& span : rank.spans) {
      const model::Op& op = ops[span.op];
      // A Recv is posted long before its data leaves; show it from when the bytes began to move.
      const double shown_start = op.kind == model::OpKind::Recv ? span.active_s : span.start_s;
      separator();
      fmt::format_to(it,
                     "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},"
                     "\"args\":{{\"op\":{},\"bytes\":{:.0f},\"flops\":{:.0f},\"wait_us\":{:.3f}}}}}",
                     model::op_label(op), model::to_string(op.kind), rank.rank, static_cast<int>(op.stream),
                     shown_start * 1e6, (span.end_s - shown_start) * 1e6, span.op, op.bytes, op.flops,
                     (span.active_s - shown_start) * 1e6);
    }
  }
  out += "\n]}\n";
  return out;
}

std::vector<int> parse_rank_list(std::string_view text, int world_size) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("rank list '" + std::string(text) + "': " + why);
  };
  const auto number = [&](std::string_view word) {
    int value = 0;
    const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), value);
    if (word.empty()) throw bad("a range needs a rank on both sides of '-' (ranks are 0 or more: 0-7)");
    if (error != std::errc() || end != word.data() + word.size()) throw bad("'" + std::string(word) + "' is no rank");
    if (value < 0 || value >= world_size) {
      throw bad(fmt::format("rank {} is outside 0..{}", value, world_size - 1));
    }
    return value;
  };
  std::vector<int> ranks;
  std::size_t position = 0;
  while (position <= text.size()) {
    const std::size_t comma = std::min(text.find(',', position), text.size());
    const std::string_view item = text.substr(position, comma - position);
    if (item.empty()) throw bad("empty item");
    if (const std::size_t dash = item.find('-'); dash != std::string_view::npos) {
      const int from = number(item.substr(0, dash)), to = number(item.substr(dash + 1));
      if (to < from) throw bad("descending range");
      for (int rank = from; rank <= to; ++rank) ranks.push_back(rank);
    } else {
      ranks.push_back(number(item));
    }
    position = comma + 1;
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace twin::report
