// Reads NCCL's INFO log (NCCL_DEBUG=INFO) and says which transport it chose. The
// lines it uses (NCCL 2.28; each may carry the "host:pid:tid [dev] NCCL INFO "
// prefix, and an optional timestamp before it):
//   NCCL version 2.28.9+cuda13.0
//   Using network Socket | IB | AWS Libfabric | Libfabric
//   comm 0x5581 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
//   Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read        (p2p.cc: also P2P/IPC, P2P/direct pointer,
//                                                           P2P/indirect/2[2], /CE suffixes)
//   Channel 00 : 0[0] -> 1[1] via SHM/direct/direct        (shm.cc: no connection index)
//   Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0    (net.cc: [send]/[receive], NET/<name>/<dev>
//   Channel 00/0 : 1[1] -> 0[0] [receive] via NET/IB/0/GDRDMA    with optional (proxy), /GDRDMA, (PCI),
//                                                                 /Shared)
//   NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)   (aws-ofi-nccl; older
//                                                                 releases: "Selected Provider is efa")
// Ring summaries ("Channel 00/02 : 0 1") carry no "via" and are not paths.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace st {

// One "Channel .. via .." line.
struct ChannelPath {
  int channel = -1;
  int from_rank = -1, from_dev = -1, to_rank = -1, to_dev = -1;  // ranks within the communicator
  std::string direction;  // "send", "receive", or "" (P2P and SHM lines do not say)
  std::string via;        // as printed: "P2P/CUMEM/read", "NET/AWS Libfabric/0/GDRDMA"
  std::string kind;       // "nvlink" (P2P), "shm" (SHM), "net:<network>" (see net_kind)
  std::string network;    // NET lines: the name between "NET/" and "/<dev>" ("Socket", "IB")
};

// Parses one line (with or without NCCL's prefix); nullopt when it is not a path.
std::optional<ChannelPath> parse_channel_line(std::string_view line);

// The kind of a NET path over network `name`: "net:socket", "net:ib", "net:efa"
// (Libfabric / AWS Libfabric / OFI on the efa provider, or on an unknown one),
// "net:ofi-<provider>" (Libfabric on another provider, e.g. tcp: the plugin's own
// fallback), otherwise "net:<name in lower case>".
std::string net_kind(const std::string& network, const std::string& ofi_provider);

// Distinct paths of one kind and locality, with how often they were seen.
struct PathCount {
  std::string kind;      // as ChannelPath::kind
  std::string locality;  // "intra" | "inter"
  std::string via;       // ChannelPath::via
  int count = 0;
};

// What one rank's NCCL log says.
struct TransportSummary {
  int rank = -1;
  std::string host;                   // from the line prefix ("" when the lines had none)
  std::string log_file;               // where it was read from ("" when parsed from text)
  bool log_found = false;             // the file existed (or text was given)
  std::string nccl_version;           // "2.28.9+cuda13.0"
  std::vector<std::string> networks;  // "Using network X", distinct, in order
  std::string ofi_provider, ofi_fabric;
  int nodes = 0;        // largest nNodes of any communicator (0: not printed)
  int max_ranks = 0;    // largest nRanks of any communicator
  int channel_lines = 0;
  int intra = 0, inter = 0;           // channel lines by locality
  std::vector<PathCount> paths;       // distinct (kind, locality, via)
  std::string locality_basis;         // how intra/inter was decided, for the report
  std::vector<std::string> warnings;  // first NCCL WARN lines
  std::vector<std::string> plugin_notes;  // "NET/Plugin ..." lines (a plugin not found, ...)

  // Anything at all about the transport: a network or a path.
  bool any_transport_lines() const { return !networks.empty() || channel_lines > 0; }
  // Channel lines per kind ("nvlink" -> 8).
  int count_kind(const std::string& kind) const;
};

// Parses a whole log (NCCL writes one per process; all its communicators share it).
// Locality: with nNodes 1 on every communicator, every path is intra-node;
// otherwise P2P and SHM are intra-node by nature and NET is inter-node.
TransportSummary parse_nccl_log(std::string_view text);

// Reads and parses a log file; a missing file gives log_found = false.
TransportSummary parse_nccl_log_file(const std::string& path);

}  // namespace st
