// NCCL environment profiles: what each transport sets, and that the user's own
// variables always win.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "fabric/profile.h"
#include "support/errors.h"
#include "support/temp_dir.h"

using namespace st;

namespace {

std::map<std::string, std::string> as_map(const FabricEnvPlan& p) {
  std::map<std::string, std::string> m;
  for (const EnvDecision& d : p.vars) m[d.name] = d.value;
  return m;
}

FabricOptions with(const std::string& transport) {
  FabricOptions o;
  o.transport = transport;
  o.log_dir = "/runs/x/nccl";
  return o;
}

}  // namespace

TEST(FabricProfile, EachTransportsVariables) {
  const auto efa = as_map(plan_fabric_env(with("efa"), 3, {}, ""));
  EXPECT_EQ(efa.at("FI_PROVIDER"), "efa");
  EXPECT_EQ(efa.at("NCCL_NET_PLUGIN"), "ofi");
  EXPECT_EQ(efa.at("NCCL_NET"), "AWS Libfabric");

  const auto ib = as_map(plan_fabric_env(with("ib"), 0, {}, ""));
  EXPECT_EQ(ib.at("NCCL_NET"), "IB");
  EXPECT_FALSE(ib.count("FI_PROVIDER"));

  const auto sock = as_map(plan_fabric_env(with("socket"), 0, {}, ""));
  EXPECT_EQ(sock.at("NCCL_NET"), "Socket");

  const auto autom = as_map(plan_fabric_env(with("auto"), 0, {}, ""));
  EXPECT_FALSE(autom.count("NCCL_NET"));
  EXPECT_FALSE(autom.count("NCCL_NET_PLUGIN"));
  EXPECT_FALSE(autom.count("NCCL_SOCKET_IFNAME"));

  for (const auto& m : {efa, ib, sock, autom}) {
    EXPECT_EQ(m.at("NCCL_DEBUG"), "INFO");
    EXPECT_EQ(m.at("NCCL_DEBUG_SUBSYS"), "INIT,NET");
  }
  EXPECT_EQ(efa.at("NCCL_DEBUG_FILE"), "/runs/x/nccl/rank3.log");
}

TEST(FabricProfile, SocketIfnameAndDefaultLogDir) {
  FabricOptions o;
  o.socket_ifname = "ens5";
  const FabricEnvPlan p = plan_fabric_env(o, 1, {}, "runs/tiny");
  EXPECT_EQ(as_map(p).at("NCCL_SOCKET_IFNAME"), "ens5");
  EXPECT_EQ(p.log_dir, "runs/tiny/nccl");
  EXPECT_EQ(p.debug_file, "runs/tiny/nccl/rank1.log");
  for (const EnvDecision& d : p.vars) EXPECT_EQ(d.source(), "set by profile") << d.name;
}

TEST(FabricProfile, UserVariablesWin) {
  FabricOptions o = with("efa");
  o.socket_ifname = "ens5";
  const std::map<std::string, std::string> env = {
      {"NCCL_NET", "Socket"}, {"NCCL_DEBUG", "WARN"}, {"NCCL_SOCKET_IFNAME", "eth0"},
      {"NCCL_DEBUG_FILE", "/tmp/nccl.%h.%p.log"}, {"FI_PROVIDER", ""}};
  const FabricEnvPlan p = plan_fabric_env(o, 0, env, "");
  for (const auto& [name, value] : env) {
    const EnvDecision* d = p.find(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->value, value) << name;
    EXPECT_FALSE(d->from_profile) << name;
    EXPECT_EQ(d->source(), "kept from environment");
  }
  EXPECT_TRUE(p.find("NCCL_NET_PLUGIN")->from_profile);
  EXPECT_EQ(p.debug_file, "/tmp/nccl.%h.%p.log");
}

TEST(FabricProfile, UnknownTransportIsAnError) {
  const std::string e = st::testing::error_of([] { plan_fabric_env(with("infiniband"), 0, {}, ""); });
  EXPECT_NE(e.find("fabric.transport must be one of auto, efa, ib, socket, got 'infiniband'"), std::string::npos) << e;
}

TEST(FabricProfile, ExpandDebugFileLikeNccl) {
  EXPECT_EQ(expand_debug_file("/l/nccl.%h.%p.log", "node1", 42), "/l/nccl.node1.42.log");
  EXPECT_EQ(expand_debug_file("a%%b%x%", "h", 1), "a%b%x%");
  EXPECT_EQ(expand_debug_file("/l/rank0.log", "h", 1), "/l/rank0.log");
}

TEST(FabricProfile, ApplySetsOnlyWhatTheUserDidNotAndCreatesTheLogDir) {
  const auto dir = st::testing::fresh_path("fabric");
  ::setenv("NCCL_DEBUG", "TRACE", 1);
  ::unsetenv("NCCL_NET");
  ::unsetenv("NCCL_DEBUG_FILE");
  FabricOptions o = with("socket");
  o.log_dir = (dir / "nccl").string();
  const FabricEnvPlan p = apply_fabric_env(o, 2, "");
  EXPECT_STREQ(std::getenv("NCCL_DEBUG"), "TRACE");
  EXPECT_STREQ(std::getenv("NCCL_NET"), "Socket");
  EXPECT_EQ(std::string(std::getenv("NCCL_DEBUG_FILE")), (dir / "nccl" / "rank2.log").string());
  EXPECT_TRUE(std::filesystem::is_directory(dir / "nccl"));
  EXPECT_FALSE(p.find("NCCL_DEBUG")->from_profile);
  std::filesystem::remove_all(dir);
  ::unsetenv("NCCL_DEBUG");
  ::unsetenv("NCCL_NET");
  ::unsetenv("NCCL_DEBUG_FILE");
}
