// The transport report: JSON round trip, gathering through the TCP store
// (netcheck/probe.h), and the expect_transport check.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "support/fork_ranks.h"
#include "comm/tcp_store.h"
#include "fabric/transport_report.h"
#include "netcheck/probe.h"

using namespace st;

namespace {

const char* kNvlinkNode =
    "h1:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
    "h1:1:1 [0] NCCL INFO Using network Socket\n"
    "h1:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n"
    "h1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
    "h1:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n";

const char* kSocketTwoNodes =
    "h2:1:1 [0] NCCL INFO Using network Socket\n"
    "h2:1:1 [0] NCCL INFO comm 0x1 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n"
    "h2:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Socket/0\n"
    "h2:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Socket/0\n";

const char* kEfaTwoNodes =
    "h3:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)\n"
    "h3:1:1 [0] NCCL INFO Using network AWS Libfabric\n"
    "h3:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0\n"
    "h3:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
    "h3:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/AWS Libfabric/0/GDRDMA\n";

const char* kOneGpu =
    "h4:1:1 [0] NCCL INFO Using network Socket\n"
    "h4:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 MNNVL 0\n";

FabricReport report_of(std::vector<const char*> logs) {
  FabricReport r;
  r.transport = "auto";
  r.log_dir = "/runs/x/nccl";
  r.env = {{"NCCL_DEBUG", "INFO", true}, {"NCCL_NET", "Socket", false}};
  for (size_t i = 0; i < logs.size(); ++i) {
    TransportSummary s = parse_nccl_log(logs[i]);
    s.rank = static_cast<int>(i);
    s.log_file = "/runs/x/nccl/rank" + std::to_string(i) + ".log";
    r.ranks.push_back(s);
  }
  return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(FabricReport, JsonRoundTrip) {
  const FabricReport r = report_of({kEfaTwoNodes, kSocketTwoNodes});
  const nlohmann::json j = to_json(r);
  const FabricReport back = fabric_report_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(to_json(back), j);
  EXPECT_EQ(back.ranks.size(), 2u);
  EXPECT_EQ(back.ranks[0].ofi_provider, "efa");
  EXPECT_EQ(back.ranks[0].count_kind("net:efa"), 1);
  EXPECT_EQ(back.env[1].source(), "kept from environment");
  EXPECT_EQ(j.at("env")[0].at("source"), "set by profile");
}

TEST(FabricReport, FormatNamesNetworksPathsAndVariables) {
  const auto lines = format_transport_report(report_of({kNvlinkNode, kNvlinkNode}));
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  EXPECT_TRUE(has(all, "NCCL 2.28.9+cuda13.0")) << all;
  EXPECT_TRUE(has(all, "NCCL_DEBUG=INFO  (set by profile)")) << all;
  EXPECT_TRUE(has(all, "NCCL_NET=Socket  (kept from environment)")) << all;
  EXPECT_TRUE(has(all, "ranks 0, 1 (h1): network Socket")) << all;  // equal ranks share a line
  EXPECT_TRUE(has(all, "P2P/CUMEM/read x2 (nvlink, intra)")) << all;

  const auto one = format_transport_report(report_of({kOneGpu}));
  EXPECT_TRUE(has(one.back(), "no peer paths exist (world of 1)")) << one.back();
}

TEST(FabricReport, ExpectPasses) {
  EXPECT_TRUE(check_expected_transport(report_of({kNvlinkNode, kNvlinkNode}), "nvlink").ok);
  EXPECT_TRUE(check_expected_transport(report_of({kSocketTwoNodes, kSocketTwoNodes}), "socket").ok);
  EXPECT_TRUE(check_expected_transport(report_of({kEfaTwoNodes}), "efa").ok);
  EXPECT_TRUE(check_expected_transport(report_of({kEfaTwoNodes}), "nvlink").ok);  // intra paths are P2P
  EXPECT_TRUE(check_expected_transport(report_of({kSocketTwoNodes}), "").ok);
  // One node, NVLink peers: no inter-node path, so the initialised network decides.
  const ExpectCheck c = check_expected_transport(report_of({kNvlinkNode, kNvlinkNode}), "socket");
  EXPECT_TRUE(c.ok) << c.message;
  ASSERT_FALSE(c.notes.empty());
  EXPECT_TRUE(has(c.notes[0], "no inter-node paths")) << c.notes[0];
  // World of one GPU.
  const ExpectCheck w = check_expected_transport(report_of({kOneGpu}), "socket");
  EXPECT_TRUE(w.ok) << w.message;
  EXPECT_TRUE(has(w.notes.at(0), "world of 1: no peer paths exist")) << w.notes.at(0);
}

TEST(FabricReport, ExpectMismatchNamesRanksExpectedAndChosen) {
  const ExpectCheck c = check_expected_transport(report_of({kEfaTwoNodes, kSocketTwoNodes}), "efa");
  ASSERT_FALSE(c.ok);
  EXPECT_TRUE(has(c.message, "--expect-transport efa")) << c.message;
  EXPECT_TRUE(has(c.message, "expected every inter-node path over NET/AWS Libfabric (EFA)")) << c.message;
  EXPECT_TRUE(has(c.message, "on rank 1 NCCL chose")) << c.message;
  EXPECT_TRUE(has(c.message, "NET/Socket/0 (net:socket, inter-node)")) << c.message;
  EXPECT_FALSE(has(c.message, "rank 0")) << c.message;

  const ExpectCheck s = check_expected_transport(report_of({kEfaTwoNodes, kEfaTwoNodes}), "socket");
  ASSERT_FALSE(s.ok);
  EXPECT_TRUE(has(s.message, "ranks 0, 1")) << s.message;
  EXPECT_TRUE(has(s.message, "NET/AWS Libfabric/0/GDRDMA (net:efa, inter-node)")) << s.message;

  const ExpectCheck shm = check_expected_transport(report_of({kNvlinkNode, kNvlinkNode}), "shm");
  ASSERT_FALSE(shm.ok);
  EXPECT_TRUE(has(shm.message, "every intra-node path over SHM")) << shm.message;
  EXPECT_TRUE(has(shm.message, "P2P/CUMEM/read (nvlink)")) << shm.message;

  // One GPU on sockets when EFA was expected: the initialised network is wrong.
  const ExpectCheck one = check_expected_transport(report_of({kOneGpu}), "efa");
  ASSERT_FALSE(one.ok);
  EXPECT_TRUE(has(one.message, "network Socket (net:socket)")) << one.message;
  EXPECT_TRUE(has(one.message, "world of 1")) << one.message;
  // ... and nvlink cannot be confirmed without peers.
  EXPECT_FALSE(check_expected_transport(report_of({kOneGpu}), "nvlink").ok);

  // The libfabric plugin on its tcp provider is not EFA.
  const ExpectCheck tcp = check_expected_transport(
      report_of({"a:1:1 [0] NCCL INFO NET/OFI Selected provider is tcp (found 1 nics)\n"
                 "a:1:1 [0] NCCL INFO Using network Libfabric\n"
                 "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n"
                 "a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Libfabric/0\n"}),
      "efa");
  ASSERT_FALSE(tcp.ok);
  EXPECT_TRUE(has(tcp.message, "net:ofi-tcp")) << tcp.message;

  EXPECT_THROW(require_expected_transport(report_of({kSocketTwoNodes}), "ib"), Error);
}

TEST(FabricReport, NothingFoundIsAFailure) {
  FabricReport r = report_of({"", "garbage\n"});
  r.ranks[1].log_found = false;
  const ExpectCheck c = check_expected_transport(r, "socket");
  ASSERT_FALSE(c.ok);
  EXPECT_EQ(c.message,
            "--expect-transport socket: NCCL printed no transport lines for ranks 0, 1 (is NCCL_DEBUG=INFO reaching "
            "/runs/x/nccl/rank0.log, /runs/x/nccl/rank1.log (missing)?)");
  // Only the silent rank is named.
  const ExpectCheck one = check_expected_transport(report_of({kNvlinkNode, ""}), "nvlink");
  ASSERT_FALSE(one.ok);
  EXPECT_TRUE(has(one.message, "for rank 1 (")) << one.message;
  EXPECT_FALSE(check_expected_transport(FabricReport{}, "socket").ok);
}

TEST(FabricReport, GatherThroughTheStore) {
  const int port = test::free_port(), world = 3;
  const char* logs[] = {kNvlinkNode, kSocketTwoNodes, kEfaTwoNodes};
  std::vector<FabricReport> got(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        TcpStore store("127.0.0.1", port, r, world, 20);
        FabricEnvPlan plan;
        plan.log_dir = "/l";
        plan.vars = {{"NCCL_DEBUG", "INFO", true}, {"RANK_ONLY", std::to_string(r), true}};
        got[r] = gather_fabric_report(store, r, world, parse_nccl_log(logs[r]), plan, "socket", 20);
        store.barrier("done", world, 20);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(got[r].ranks.size(), 3u);
    EXPECT_EQ(to_json(got[r]), to_json(got[0]));  // the same report everywhere
  }
  EXPECT_EQ(got[0].transport, "socket");
  EXPECT_EQ(got[2].env.at(1).value, "0");  // rank 0's variables
  for (int q = 0; q < world; ++q) EXPECT_EQ(got[1].ranks[q].rank, q);
  EXPECT_EQ(got[1].ranks[2].ofi_provider, "efa");
}
