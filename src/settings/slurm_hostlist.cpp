#include "settings/slurm_hostlist.h"

#include <cctype>
#include <utility>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant::detail {
namespace {

// One bracket entry: lo-hi (or a single number, lo == hi), printed at least `width` digits wide.
struct Range {
  unsigned long long lo = 0, hi = 0;
  std::size_t width = 0;
};

// A group is a sequence of segments: literal text (ranges empty) or one bracket set.
struct Segment {
  std::string literal;
  std::vector<Range> ranges;
  bool is_bracket() const { return !ranges.empty(); }
};

class Parser {
 public:
  Parser(const std::string& text, const std::string& variable) : text_(text), variable_(variable) {}

  std::vector<std::string> expand() const {
    std::vector<std::vector<Segment>> groups;
    std::size_t total = 0;
    for (const auto& [begin, end] : split_groups()) {
      if (begin == end) continue;  // "a,,b" and a trailing comma, which Slurm skips too
      groups.push_back(parse_group(begin, end));
      total += count(groups.back());  // each ≤ kMaxSlurmHosts, so no overflow
      if (total > kMaxSlurmHosts) fail(too_many());
    }
    if (groups.empty()) fail("names no machine");
    std::vector<std::string> hosts;
    hosts.reserve(total);
    for (const auto& group : groups) append_product(group, 0, "", hosts);
    return hosts;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw EnvironmentError(
        variable_, text_,
        str("Invalid Slurm node list: ", variable_, "=", text_.empty() ? "(empty)" : text_, " ",
            what,
            ". Likely cause: the variable was set or edited by hand (Slurm writes it itself, "
            "in the form node[01-04,07]). Fix: leave the node lists to srun and sbatch, or export "
            "MASTER_ADDR to the address of the machine that runs rank 0, so that no node list "
            "needs to be read."));
  }

  std::string too_many() const {
    return str("expands to more than ", kMaxSlurmHosts, " host names, more than any cluster has");
  }

  // [begin, end) of each comma-separated group; commas inside brackets do not separate.
  std::vector<std::pair<std::size_t, std::size_t>> split_groups() const {
    std::vector<std::pair<std::size_t, std::size_t>> groups;
    std::size_t begin = 0, open = std::string::npos;
    for (std::size_t i = 0; i < text_.size(); ++i) {
      const char c = text_[i];
      if (c == '[') {
        if (open != std::string::npos) {
          fail(str("has a '[' at character ", i + 1, " inside the brackets opened at character ",
                   open + 1, " (brackets do not nest)"));
        }
        open = i;
      } else if (c == ']') {
        if (open == std::string::npos) {
          fail(str("has a ']' at character ", i + 1, " with no '[' before it"));
        }
        open = std::string::npos;
      } else if (c == ',' && open == std::string::npos) {
        groups.emplace_back(begin, i);
        begin = i + 1;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        fail(str("has a blank at character ", i + 1, " (host names and ranges have none)"));
      }
    }
    if (open != std::string::npos) {
      fail(str("has a '[' at character ", open + 1, " that is never closed"));
    }
    groups.emplace_back(begin, text_.size());
    return groups;
  }

  std::vector<Segment> parse_group(std::size_t begin, std::size_t end) const {
    std::vector<Segment> segments;
    std::size_t i = begin;
    while (i < end) {
      if (text_[i] != '[') {
        const std::size_t stop = std::min(text_.find('[', i), end);
        segments.push_back({text_.substr(i, stop - i), {}});
        i = stop;
        continue;
      }
      const std::size_t close = text_.find(']', i);  // split_groups saw it, before `end`
      segments.push_back({"", parse_bracket(i + 1, close)});
      i = close + 1;
    }
    return segments;
  }

  std::vector<Range> parse_bracket(std::size_t begin, std::size_t end) const {
    std::vector<Range> ranges;
    std::size_t entry = begin;
    while (true) {
      std::size_t stop = text_.find(',', entry);
      if (stop == std::string::npos || stop > end) stop = end;
      ranges.push_back(parse_range(entry, stop));
      if (stop == end) break;
      entry = stop + 1;
    }
    return ranges;
  }

  Range parse_range(std::size_t begin, std::size_t end) const {
    const std::string entry = text_.substr(begin, end - begin);
    if (entry.empty()) {
      fail(str("has an empty entry in its brackets at character ", begin + 1,
               " (write n[1,3], not n[1,,3] or n[])"));
    }
    const std::size_t dash = entry.find('-');
    const std::string lo = entry.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : entry.substr(dash + 1);
    auto is_number = [](const std::string& s) {
      // 18 digits always fit an unsigned long long; longer numbers are no host index anyway.
      return !s.empty() && s.size() <= 18 &&
             std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
    };
    if (!is_number(lo) || !is_number(hi)) {
      fail(str("has \"", entry,
               "\" in its brackets, which is neither a number nor a range of numbers lo-hi"));
    }
    Range range{std::stoull(lo), std::stoull(hi), lo.size()};
    if (range.lo > range.hi) {
      fail(
          str("has the range ", entry, ", whose start is above its end (write ", hi, "-", lo, ")"));
    }
    if (range.hi - range.lo >= kMaxSlurmHosts) fail(too_many());
    return range;
  }

  // Hosts of one group: the product of its bracket sets' sizes, or kMaxSlurmHosts + 1 when more.
  std::size_t count(const std::vector<Segment>& group) const {
    std::size_t product = 1;
    for (const auto& segment : group) {
      std::size_t size = 0;
      for (const auto& r : segment.ranges) size += static_cast<std::size_t>(r.hi - r.lo + 1);
      if (!segment.is_bracket()) size = 1;
      if (size > kMaxSlurmHosts || product * size > kMaxSlurmHosts) fail(too_many());
      product *= size;
    }
    return product;
  }

  // The first bracket set varies slowest, as in Slurm: a[1-2]-b[3-4] is a1-b3 a1-b4 a2-b3 a2-b4.
  static void append_product(const std::vector<Segment>& group, std::size_t at,
                             const std::string& prefix, std::vector<std::string>& hosts) {
    if (at == group.size()) {
      hosts.push_back(prefix);
      return;
    }
    const Segment& segment = group[at];
    if (!segment.is_bracket()) {
      append_product(group, at + 1, prefix + segment.literal, hosts);
      return;
    }
    for (const auto& r : segment.ranges) {
      for (unsigned long long v = r.lo; v <= r.hi; ++v) {
        std::string digits = std::to_string(v);
        if (digits.size() < r.width) digits.insert(0, r.width - digits.size(), '0');
        append_product(group, at + 1, prefix + digits, hosts);
      }
    }
  }

  const std::string& text_;
  const std::string& variable_;
};

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& text,
                                               const std::string& variable) {
  return Parser(text, variable).expand();
}

}  // namespace accelerant::detail
