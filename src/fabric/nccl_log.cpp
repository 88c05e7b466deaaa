#include "fabric/nccl_log.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

namespace st {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A line split into NCCL's prefix ("host:pid:tid [dev] NCCL INFO ") and the message.
struct Line {
  std::string host;
  std::string level;  // "INFO", "WARN", or "" (no prefix: the whole line is the message)
  std::string_view msg;
};

// "host:pid:tid" -> host; "" when the token is not of that form.
std::string host_of(std::string_view token) {
  const size_t b = token.rfind(':');
  if (b == std::string_view::npos || b == 0) return "";
  const size_t a = token.rfind(':', b - 1);
  if (a == std::string_view::npos || a == 0) return "";
  auto digits = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(token.substr(a + 1, b - a - 1)) || !digits(token.substr(b + 1))) return "";
  return std::string(token.substr(0, a));
}

Line split_line(std::string_view raw) {
  Line l;
  raw = trim(raw);
  for (const char* level : {"INFO", "WARN"}) {
    const std::string tag = std::string("NCCL ") + level + " ";
    size_t pos = raw.find(tag);
    if (pos == std::string_view::npos && raw.size() >= tag.size() - 1 &&
        raw.substr(raw.size() - (tag.size() - 1)) == std::string_view(tag).substr(0, tag.size() - 1))
      pos = raw.size() - (tag.size() - 1);  // "NCCL INFO" with nothing after it
    if (pos == std::string_view::npos) continue;
    l.level = level;
    l.msg = pos + tag.size() <= raw.size() ? trim(raw.substr(pos + tag.size())) : std::string_view();
    // The host is the "host:pid:tid" token before the tag (a timestamp may precede it).
    std::istringstream head{std::string(raw.substr(0, pos))};
    for (std::string tok; head >> tok;)
      if (std::string h = host_of(tok); !h.empty()) l.host = h;
    return l;
  }
  l.msg = raw;
  return l;
}

// "key <int>" inside a message; -1 when absent (or too large for an int).
int int_after(std::string_view msg, std::string_view key) {
  const size_t pos = msg.find(key);
  if (pos == std::string_view::npos) return -1;
  size_t i = pos + key.size();
  int v = 0;
  bool any = false;
  while (i < msg.size() && msg[i] >= '0' && msg[i] <= '9') {
    if (v > (std::numeric_limits<int>::max() - 9) / 10) return -1;
    v = v * 10 + (msg[i++] - '0'), any = true;
  }
  return any ? v : -1;
}

// The word after `key` (case-insensitive key), up to a space, comma or parenthesis.
std::string word_after_icase(std::string_view msg, const std::string& key) {
  const std::string m = lower(std::string(msg));
  const size_t pos = m.find(lower(key));
  if (pos == std::string::npos) return "";
  size_t i = pos + key.size(), j = i;
  while (j < msg.size() && !std::isspace(static_cast<unsigned char>(msg[j])) && msg[j] != ',' && msg[j] != '(') ++j;
  return std::string(msg.substr(i, j - i));
}

}  // namespace

std::optional<ChannelPath> parse_channel_line(std::string_view raw) {
  const std::string_view msg = split_line(raw).msg;
  if (!starts_with(msg, "Channel ") || msg.find(" via ") == std::string_view::npos) return std::nullopt;
  // Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0
  // Channel 00 : 0[0] -> 1[1] via SHM/direct/direct
  static const std::regex re(
      R"(^Channel (\d+)(?:/(\d+))? : (\d+)\[(\d+)\] -> (\d+)\[(\d+)\](?: \[(send|receive)\])? via (.+)$)");
  std::cmatch m;
  if (!std::regex_match(msg.data(), msg.data() + msg.size(), m, re)) return std::nullopt;
  ChannelPath p;
  // A number too large for an int makes the line no path (std::stoi would throw).
  const std::pair<int, int*> numbers[] = {{1, &p.channel}, {3, &p.from_rank}, {4, &p.from_dev}, {5, &p.to_rank},
                                          {6, &p.to_dev}};
  for (const auto& [group, out] : numbers)
    if (std::from_chars(m[group].first, m[group].second, *out).ec != std::errc()) return std::nullopt;
  p.direction = m[7].str();
  p.via = std::string(trim(m[8].str()));
  if (starts_with(p.via, "P2P/") || p.via == "P2P") {
    p.kind = "nvlink";  // NCCL's P2P transport: NVLink, or PCIe peer access without NVLink
  } else if (starts_with(p.via, "SHM/") || p.via == "SHM") {
    p.kind = "shm";
  } else if (starts_with(p.via, "NET/")) {
    const std::string rest = p.via.substr(4);
    p.network = rest.substr(0, rest.find('/'));
    p.kind = net_kind(p.network, "");
  } else {
    p.kind = "other:" + lower(p.via.substr(0, p.via.find('/')));
  }
  return p;
}

std::string net_kind(const std::string& network, const std::string& ofi_provider) {
  const std::string n = lower(network);
  if (n == "libfabric" || n == "aws libfabric" || n == "ofi") {
    const std::string prov = lower(ofi_provider);
    if (prov.empty() || prov == "efa") return "net:efa";
    return "net:ofi-" + prov;
  }
  return "net:" + n;  // "socket", "ib", and whatever else a plugin calls itself
}

int TransportSummary::count_kind(const std::string& kind) const {
  int n = 0;
  for (const PathCount& p : paths)
    if (p.kind == kind) n += p.count;
  return n;
}

TransportSummary parse_nccl_log(std::string_view text) {
  TransportSummary s;
  s.log_found = true;
  std::vector<ChannelPath> channels;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view raw = text.substr(start, end - start);
    start = end + 1;
    const Line l = split_line(raw);
    const std::string_view msg = l.msg;
    if (msg.empty()) continue;
    if (s.host.empty() && !l.host.empty()) s.host = l.host;
    if (l.level == "WARN") {
      if (s.warnings.size() < 5) s.warnings.emplace_back(msg);
      continue;
    }
    if (starts_with(msg, "NCCL version ")) {
      if (s.nccl_version.empty()) {
        std::string_view v = msg.substr(13);
        s.nccl_version = std::string(v.substr(0, v.find(' ')));
      }
    } else if (starts_with(msg, "Using network ")) {
      const std::string net(trim(msg.substr(14)));
      if (std::find(s.networks.begin(), s.networks.end(), net) == s.networks.end()) s.networks.push_back(net);
    } else if (starts_with(msg, "comm ") && msg.find(" nNodes ") != std::string_view::npos) {
      s.nodes = std::max(s.nodes, int_after(msg, " nNodes "));
      s.max_ranks = std::max(s.max_ranks, int_after(msg, " nRanks "));
    } else if (starts_with(msg, "Channel ")) {
      if (auto p = parse_channel_line(msg)) channels.push_back(std::move(*p));
    } else if (lower(std::string(msg)).find("selected provider is ") != std::string::npos) {
      if (s.ofi_provider.empty()) {
        s.ofi_provider = word_after_icase(msg, "selected provider is ");
        s.ofi_fabric = word_after_icase(msg, "fabric is ");
      }
    } else if (msg.find("NET/Plugin") != std::string_view::npos) {
      if (s.plugin_notes.size() < 5) s.plugin_notes.emplace_back(msg);
    }
    if (end == text.size()) break;
  }

  const bool one_node = s.nodes == 1;
  s.locality_basis = one_node ? "nNodes 1 on every communicator: all paths within the node"
                              : "by transport: P2P and SHM within a node, NET across nodes";
  for (ChannelPath& c : channels) {
    if (!c.network.empty()) c.kind = net_kind(c.network, s.ofi_provider);
    const bool intra = one_node || c.kind == "nvlink" || c.kind == "shm";
    const std::string locality = intra ? "intra" : "inter";
    ++s.channel_lines;
    ++(intra ? s.intra : s.inter);
    auto it = std::find_if(s.paths.begin(), s.paths.end(), [&](const PathCount& p) {
      return p.kind == c.kind && p.locality == locality && p.via == c.via;
    });
    if (it == s.paths.end())
      s.paths.push_back({c.kind, locality, c.via, 1});
    else
      ++it->count;
  }
  return s;
}

TransportSummary parse_nccl_log_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    TransportSummary s;
    s.log_file = path;
    s.log_found = false;
    return s;
  }
  std::stringstream text;
  text << in.rdbuf();
  TransportSummary s = parse_nccl_log(text.str());
  s.log_file = path;
  return s;
}

}  // namespace st
