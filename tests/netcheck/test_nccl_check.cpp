// nccl-check's bandwidth arithmetic (as nccl-tests computes it) and size sweep.
#include <gtest/gtest.h>

#include "core/error.h"
#include "netcheck/nccl_check.h"

using namespace st;

namespace {
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(NcclCheckMath, BusBandwidthLikeNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::AllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::AllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::ReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor(Collective::AllReduce, 1), 0.0);
  // 1 GiB all-reduce in 10 ms over 8 ranks: algbw 107.37 GB/s, busbw 187.9 GB/s.
  const Bandwidth ar = collective_bandwidth(Collective::AllReduce, 1073741824.0, 0.010, 8);
  EXPECT_NEAR(ar.algbw_gbps, 107.3741824, 1e-9);
  EXPECT_NEAR(ar.busbw_gbps, 107.3741824 * 1.75, 1e-9);
  // 256 MB gathered in 2 ms over 2 ranks: algbw 128 GB/s, busbw 64 GB/s.
  const Bandwidth ag = collective_bandwidth(Collective::AllGather, 256e6, 0.002, 2);
  EXPECT_NEAR(ag.algbw_gbps, 128.0, 1e-9);
  EXPECT_NEAR(ag.busbw_gbps, 64.0, 1e-9);
  EXPECT_EQ(collective_bandwidth(Collective::ReduceScatter, 1e6, 0, 2).algbw_gbps, 0);
}

TEST(NcclCheckMath, SweepSizes) {
  EXPECT_EQ(sweep_sizes(1 << 20, 1 << 30, 4, 16),
            (std::vector<size_t>{1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30}));
  EXPECT_EQ(sweep_sizes(100, 100, 4, 24), (std::vector<size_t>{96}));
  EXPECT_EQ(sweep_sizes(1, 10, 2, 32), (std::vector<size_t>{32}));
  EXPECT_THROW(sweep_sizes(10, 1, 4, 4), Error);
  NcclCheckRow row{Collective::AllReduce, 1 << 20, 12.5, {83.9, 125.8}};
  EXPECT_EQ(to_json(row).at("op"), "all_reduce");
  EXPECT_TRUE(has(format_check_row(row), "all_reduce"));
}
