// The NCCL log parser on each line format NCCL 2.28 prints, and on whole logs:
// every tests/data/nccl/*.log with a .json next to it (the expected summary fields).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fabric/nccl_log.h"
#include "fabric/transport_report.h"

namespace fs = std::filesystem;
using namespace st;

namespace {

ChannelPath path_of(const std::string& line) {
  auto p = parse_channel_line(line);
  EXPECT_TRUE(p.has_value()) << line;
  return p.value_or(ChannelPath{});
}

}  // namespace

TEST(NcclLog, ChannelLineFormats) {
  const struct {
    const char* line;
    const char* kind;
    const char* via;
  } cases[] = {
      {"Channel 00/0 : 0[0] -> 1[1] via P2P/IPC", "nvlink", "P2P/IPC"},
      {"Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM", "nvlink", "P2P/CUMEM"},
      {"Channel 03/1 : 0[0] -> 1[1] via P2P/CUMEM/read", "nvlink", "P2P/CUMEM/read"},
      {"Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read", "nvlink", "P2P/direct pointer/read"},
      {"Channel 00/0 : 0[0] -> 2[2] via P2P/indirect/1[1]", "nvlink", "P2P/indirect/1[1]"},
      {"Channel 00 : 0[0] -> 1[1] via SHM/direct/direct", "shm", "SHM/direct/direct"},
      {"Channel 01 : 1[1] -> 0[0] via SHM/CE/direct", "shm", "SHM/CE/direct"},
      {"Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0", "net:socket", "NET/Socket/0"},
      {"Channel 00/0 : 1[1] -> 0[0] [receive] via NET/IB/0", "net:ib", "NET/IB/0"},
      {"Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA", "net:ib", "NET/IB/0/GDRDMA"},
      {"Channel 02/0 : 0[0] -> 8[0] [send] via NET/IB/3(1)/GDRDMA(PCI)/Shared", "net:ib", "NET/IB/3(1)/GDRDMA(PCI)/Shared"},
      {"Channel 00/0 : 0[0] -> 1[1] [send] via NET/Libfabric/0/GDRDMA", "net:efa", "NET/Libfabric/0/GDRDMA"},
      {"Channel 00/0 : 0[0] -> 1[1] [send] via NET/AWS Libfabric/0", "net:efa", "NET/AWS Libfabric/0"},
  };
  for (const auto& c : cases) {
    // Bare, with NCCL's prefix, and with a timestamp before that.
    for (const std::string& line :
         {std::string(c.line), "ip-10-0-0-1:1234:1240 [0] NCCL INFO " + std::string(c.line),
          "[2025-01-01 00:00:00.123] node7:99:100 [3] NCCL INFO " + std::string(c.line) + "  \r"}) {
      const ChannelPath p = path_of(line);
      EXPECT_EQ(p.kind, c.kind) << line;
      EXPECT_EQ(p.via, c.via) << line;
    }
  }
  const ChannelPath p = path_of("h:1:2 [1] NCCL INFO Channel 07/1 : 3[1] -> 5[2] [receive] via NET/AWS Libfabric/2/GDRDMA");
  EXPECT_EQ(p.channel, 7);
  EXPECT_EQ(p.from_rank, 3);
  EXPECT_EQ(p.from_dev, 1);
  EXPECT_EQ(p.to_rank, 5);
  EXPECT_EQ(p.to_dev, 2);
  EXPECT_EQ(p.direction, "receive");
  EXPECT_EQ(p.network, "AWS Libfabric");
}

TEST(NcclLog, NonPathLinesAreNotPaths) {
  for (const char* line : {"Channel 00/02 : 0 1", "h:1:2 [0] NCCL INFO Channel 01/32 : 0",
                           "h:1:2 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
                           "CollNet 00/0 : 0 [send] via COLLNET/SHARP/0", "", "Using network Socket"})
    EXPECT_FALSE(parse_channel_line(line).has_value()) << line;
}

TEST(NcclLog, NetKindFollowsTheOfiProvider) {
  EXPECT_EQ(net_kind("Socket", ""), "net:socket");
  EXPECT_EQ(net_kind("IB", ""), "net:ib");
  EXPECT_EQ(net_kind("AWS Libfabric", "efa"), "net:efa");
  EXPECT_EQ(net_kind("Libfabric", ""), "net:efa");
  EXPECT_EQ(net_kind("Libfabric", "tcp"), "net:ofi-tcp");
  EXPECT_EQ(net_kind("gIB", ""), "net:gib");
}

TEST(NcclLog, NetworkProviderVersionAndNodes) {
  const std::string log =
      "a:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
      "a:1:2 [0] NCCL INFO NET/OFI Selected Provider is EFA, fabric is efa-direct (found 4 nics)\n"
      "a:1:2 [0] NCCL INFO Using network AWS Libfabric\n"
      "a:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0\n"
      "a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
      "a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA\n"
      "a:1:2 [0] misc/socket.cc:50 NCCL WARN something odd\n";
  const TransportSummary s = parse_nccl_log(log);
  EXPECT_EQ(s.host, "a");
  EXPECT_EQ(s.nccl_version, "2.28.9+cuda13.0");
  EXPECT_EQ(s.networks, std::vector<std::string>{"AWS Libfabric"});
  EXPECT_EQ(s.ofi_provider, "EFA");
  EXPECT_EQ(s.ofi_fabric, "efa-direct");
  EXPECT_EQ(s.nodes, 2);
  EXPECT_EQ(s.max_ranks, 16);
  EXPECT_EQ(s.intra, 1);
  EXPECT_EQ(s.inter, 1);
  EXPECT_EQ(s.count_kind("net:efa"), 1);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0], "something odd");
  // Lower-case provider line (current aws-ofi-nccl).
  EXPECT_EQ(parse_nccl_log("x:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)\n").ofi_provider,
            "efa");
}

TEST(NcclLog, OneNodeMakesEveryPathIntraNode) {
  const TransportSummary s = parse_nccl_log(
      "comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n"
      "Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0\n");
  EXPECT_EQ(s.intra, 1);
  EXPECT_EQ(s.inter, 0);
}

TEST(NcclLog, MissingFileIsReported) {
  const TransportSummary s = parse_nccl_log_file("/nonexistent/nccl/rank0.log");
  EXPECT_FALSE(s.log_found);
  EXPECT_FALSE(s.any_transport_lines());
  EXPECT_EQ(s.log_file, "/nonexistent/nccl/rank0.log");
}

// Every capture under tests/data/nccl: X.log parsed, compared with X.json. The JSON
// holds any subset of the summary's fields (as in to_json), plus "kinds": channel
// lines per kind. Adding a capture is adding those two files.
TEST(NcclLog, Fixtures) {
  const fs::path dir = fs::path(SHARDTRAIN_TEST_DATA) / "nccl";
  int checked = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".log") continue;
    fs::path expected_path = e.path();
    expected_path.replace_extension(".json");
    if (!fs::exists(expected_path)) {
      ADD_FAILURE() << e.path() << " has no expected summary " << expected_path.filename();
      continue;
    }
    SCOPED_TRACE(e.path().filename().string());
    const TransportSummary s = parse_nccl_log_file(e.path().string());
    const nlohmann::json got = to_json(s);
    const nlohmann::json want = nlohmann::json::parse(std::ifstream(expected_path));
    for (const auto& [key, value] : want.items()) {
      if (key == "kinds") {
        for (const auto& [kind, n] : value.items()) EXPECT_EQ(s.count_kind(kind), n.get<int>()) << "kind " << kind;
      } else {
        ASSERT_TRUE(got.contains(key)) << "unknown field '" << key << "' in " << expected_path;
        EXPECT_EQ(got.at(key), value) << "field " << key;
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 5);
}
