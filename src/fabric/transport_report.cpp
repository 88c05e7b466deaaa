#include "fabric/transport_report.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"

namespace st {
namespace {

using nlohmann::json;

// "0, 1, 3" or "0-7" style lists of ranks.
std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j > i + 1 ? std::to_string(ranks[i]) + "-" + std::to_string(ranks[j])
                              : std::to_string(ranks[i]) + (j == i + 1 ? ", " + std::to_string(ranks[j]) : ""));
    i = j + 1;
  }
  return join(parts, ", ");
}

std::string plural_ranks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks);
}

// What one rank's NCCL chose, without the rank itself (so equal ranks group).
std::string describe_paths(const TransportSummary& s, const std::string& locality) {
  std::vector<std::string> parts;
  for (const PathCount& p : s.paths)
    if (locality.empty() || p.locality == locality)
      parts.push_back(p.via + " x" + std::to_string(p.count) + " (" + p.kind + ", " + p.locality + ")");
  return parts.empty() ? "none" : join(parts, ", ");
}

std::string describe_rank(const TransportSummary& s) {
  if (!s.log_found) return "no NCCL log at " + s.log_file;
  if (!s.any_transport_lines()) return "no transport lines in " + (s.log_file.empty() ? "the log" : s.log_file);
  std::string d = "network " + (s.networks.empty() ? std::string("(not printed)") : join(s.networks, ", "));
  if (!s.ofi_provider.empty())
    d += ", OFI provider " + s.ofi_provider + (s.ofi_fabric.empty() ? "" : " (fabric " + s.ofi_fabric + ")");
  d += "; " + std::to_string(s.intra) + " intra-node, " + std::to_string(s.inter) + " inter-node channel paths";
  if (s.channel_lines > 0) d += ": " + describe_paths(s, "");
  return d;
}

std::vector<int> all_ranks_where(const FabricReport& r, const std::function<bool(const TransportSummary&)>& pred) {
  std::vector<int> out;
  for (size_t i = 0; i < r.ranks.size(); ++i)
    if (pred(r.ranks[i])) out.push_back(static_cast<int>(i));
  return out;
}

}  // namespace

json to_json(const TransportSummary& s) {
  json paths = json::array();
  for (const PathCount& p : s.paths)
    paths.push_back({{"kind", p.kind}, {"locality", p.locality}, {"via", p.via}, {"count", p.count}});
  return {{"rank", s.rank},
          {"host", s.host},
          {"log_file", s.log_file},
          {"log_found", s.log_found},
          {"nccl_version", s.nccl_version},
          {"networks", s.networks},
          {"ofi_provider", s.ofi_provider},
          {"ofi_fabric", s.ofi_fabric},
          {"nodes", s.nodes},
          {"max_ranks", s.max_ranks},
          {"channel_lines", s.channel_lines},
          {"intra", s.intra},
          {"inter", s.inter},
          {"paths", paths},
          {"locality_basis", s.locality_basis},
          {"warnings", s.warnings},
          {"plugin_notes", s.plugin_notes}};
}

TransportSummary transport_summary_from_json(const json& j) {
  TransportSummary s;
  s.rank = j.value("rank", -1);
  s.host = j.value("host", "");
  s.log_file = j.value("log_file", "");
  s.log_found = j.value("log_found", false);
  s.nccl_version = j.value("nccl_version", "");
  s.networks = j.value("networks", std::vector<std::string>{});
  s.ofi_provider = j.value("ofi_provider", "");
  s.ofi_fabric = j.value("ofi_fabric", "");
  s.nodes = j.value("nodes", 0);
  s.max_ranks = j.value("max_ranks", 0);
  s.channel_lines = j.value("channel_lines", 0);
  s.intra = j.value("intra", 0);
  s.inter = j.value("inter", 0);
  if (j.contains("paths"))
    for (const json& p : j.at("paths"))
      s.paths.push_back({p.at("kind").get<std::string>(), p.at("locality").get<std::string>(),
                         p.at("via").get<std::string>(), p.at("count").get<int>()});
  s.locality_basis = j.value("locality_basis", "");
  s.warnings = j.value("warnings", std::vector<std::string>{});
  s.plugin_notes = j.value("plugin_notes", std::vector<std::string>{});
  return s;
}

json to_json(const FabricReport& r) {
  json env = json::array();
  for (const EnvDecision& d : r.env) env.push_back({{"name", d.name}, {"value", d.value}, {"source", d.source()}});
  json ranks = json::array();
  for (const TransportSummary& s : r.ranks) ranks.push_back(to_json(s));
  return {{"transport", r.transport}, {"log_dir", r.log_dir}, {"env", env}, {"ranks", ranks}};
}

FabricReport fabric_report_from_json(const json& j) {
  FabricReport r;
  r.transport = j.value("transport", "auto");
  r.log_dir = j.value("log_dir", "");
  if (j.contains("env"))
    for (const json& e : j.at("env"))
      r.env.push_back({e.at("name").get<std::string>(), e.at("value").get<std::string>(),
                       e.at("source").get<std::string>() == "set by profile"});
  if (j.contains("ranks"))
    for (const json& s : j.at("ranks")) r.ranks.push_back(transport_summary_from_json(s));
  return r;
}

std::vector<std::string> format_transport_report(const FabricReport& r) {
  std::vector<std::string> lines;
  std::string version;
  for (const TransportSummary& s : r.ranks)
    if (!s.nccl_version.empty()) version = s.nccl_version;
  lines.push_back("fabric: transport " + r.transport + (version.empty() ? "" : ", NCCL " + version) + ", " +
                  std::to_string(r.ranks.size()) + " rank(s), NCCL logs in " + r.log_dir);
  for (const EnvDecision& d : r.env) lines.push_back("  " + d.name + "=" + d.value + "  (" + d.source() + ")");
  // Ranks that saw the same thing share a line.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const std::string d = describe_rank(r.ranks[i]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == d; });
    if (it == groups.end())
      groups.push_back({d, {static_cast<int>(i)}});
    else
      it->second.push_back(static_cast<int>(i));
  }
  for (const auto& [d, ranks] : groups) {
    std::vector<std::string> hosts;
    for (int k : ranks)
      if (!r.ranks[k].host.empty() && std::find(hosts.begin(), hosts.end(), r.ranks[k].host) == hosts.end())
        hosts.push_back(r.ranks[k].host);
    lines.push_back("  " + plural_ranks(ranks) + (hosts.empty() ? "" : " (" + join(hosts, ", ") + ")") + ": " + d);
  }
  if (!r.ranks.empty() && std::all_of(r.ranks.begin(), r.ranks.end(), [](const TransportSummary& s) {
        return s.any_transport_lines() && s.channel_lines == 0;
      }))
    lines.push_back("  no peer paths exist (" +
                    std::string(r.ranks.size() == 1 ? "world of 1" : "no channel lines") +
                    "): only the network NCCL initialised is known");
  for (size_t i = 0; i < r.ranks.size(); ++i)
    for (const std::string& w : r.ranks[i].warnings) lines.push_back("  rank " + std::to_string(i) + " NCCL WARN " + w);
  return lines;
}

ExpectCheck check_expected_transport(const FabricReport& r, const std::string& expect) {
  ExpectCheck c;
  if (expect.empty()) return c;
  const std::string who = "--expect-transport " + expect;
  const auto& choices = fabric_expect_transports();
  if (std::find(choices.begin(), choices.end(), expect) == choices.end()) {
    c.ok = false;
    c.message = who + ": unknown transport (expected one of efa, ib, socket, nvlink, shm)";
    return c;
  }
  if (r.ranks.empty()) {
    c.ok = false;
    c.message = who + ": no NCCL communicator was created, so there is no transport to check";
    return c;
  }

  const std::vector<int> silent = all_ranks_where(r, [](const TransportSummary& s) { return !s.any_transport_lines(); });
  if (!silent.empty()) {
    std::vector<std::string> files;
    for (int k : silent) {
      const TransportSummary& s = r.ranks[k];
      std::string f = s.log_file.empty() ? "the NCCL log" : s.log_file;
      if (!s.log_found) f += " (missing)";
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
    if (files.size() > 3) files.resize(3), files.push_back("...");
    c.ok = false;
    c.message = who + ": NCCL printed no transport lines for " + plural_ranks(silent) +
                " (is NCCL_DEBUG=INFO reaching " + join(files, ", ") + "?)";
    return c;
  }

  // Per rank: what NCCL chose that does not match, or "" when it matches.
  std::map<std::string, std::vector<int>> bad;  // what was chosen -> ranks
  const bool net = expect == "efa" || expect == "ib" || expect == "socket";
  const std::string want = net ? "net:" + expect : expect;
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const TransportSummary& s = r.ranks[i];
    std::vector<std::string> wrong;
    if (net) {
      for (const PathCount& p : s.paths)
        if ((p.locality == "inter" || p.kind.rfind("net:", 0) == 0) && p.kind != want)
          wrong.push_back(p.via + " (" + p.kind + ", " + p.locality + "-node)");
      if (s.inter == 0) {
        // No inter-node path to judge (one node, or one GPU): the network NCCL
        // initialised for the communicator is what it would use.
        if (s.networks.empty()) wrong.push_back("no network printed (no \"Using network\" line)");
        for (const std::string& n : s.networks)
          if (net_kind(n, s.ofi_provider) != want)
            wrong.push_back("network " + n + (s.ofi_provider.empty() ? "" : " on OFI provider " + s.ofi_provider) +
                            " (" + net_kind(n, s.ofi_provider) + ")");
      }
    } else {
      if (s.intra == 0) wrong.push_back(s.channel_lines == 0 ? "no peer paths at all" : "no intra-node peer paths");
      for (const PathCount& p : s.paths)
        if (p.locality == "intra" && p.kind != want) wrong.push_back(p.via + " (" + p.kind + ")");
    }
    if (!wrong.empty()) bad[join(wrong, ", ")].push_back(static_cast<int>(i));
  }

  const bool world_of_one = r.ranks.size() == 1 && r.ranks[0].channel_lines == 0;
  if (world_of_one)
    c.notes.push_back(net ? "world of 1: no peer paths exist; checked the network NCCL initialised"
                          : "world of 1: no peer paths exist, so " + expect + " cannot be confirmed");
  else if (net && std::all_of(r.ranks.begin(), r.ranks.end(), [](const TransportSummary& s) { return s.inter == 0; }))
    c.notes.push_back("no inter-node paths (one node): checked the network NCCL initialised");

  if (!bad.empty()) {
    std::vector<int> ranks;
    std::vector<std::string> parts;
    for (const auto& [what, rs] : bad) {
      ranks.insert(ranks.end(), rs.begin(), rs.end());
      parts.push_back(plural_ranks(rs) + ": " + what);
    }
    std::sort(ranks.begin(), ranks.end());
    const std::string expected = net ? "every inter-node path over NET/" +
                                           std::string(expect == "efa" ? "AWS Libfabric (EFA)" : expect == "ib" ? "IB" : "Socket")
                                     : std::string("every intra-node path over ") + (expect == "nvlink" ? "P2P (NVLink)" : "SHM");
    c.ok = false;
    c.message = who + ": expected " + expected + ", but on " + plural_ranks(ranks) + " NCCL chose " + join(parts, "; ") +
                (world_of_one ? " (" + c.notes.front() + ")" : "");
  }
  return c;
}

void require_expected_transport(const FabricReport& r, const std::string& expect) {
  const ExpectCheck c = check_expected_transport(r, expect);
  if (!c.ok) throw Error(c.message);
}

}  // namespace st
