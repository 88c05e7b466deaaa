// `shardtrain nccl-check`: the NCCL preflight. Same launch contract as `train`
// (`shardtrain launch --nproc-per-node N -- nccl-check ...`, torchrun, Slurm, ...),
// same fabric profile, communicators and transport report; then a sweep of
// all_gather, reduce_scatter and all_reduce with nccl-tests' bandwidth figures.
// An --expect-transport mismatch exits non-zero before the sweep.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/factory.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/log.h"
#include "cli/rank_bringup.h"
#include "netcheck/nccl_check.h"
#include "fabric/transport_report.h"

namespace st {

Command add_nccl_check_command(CLI::App& root) {
  struct State {
    FabricOptions fabric;
    NcclCheckOptions check;
    double timeout_s = 300;
  };
  auto state = std::make_shared<State>();
  state->fabric.log_dir = "nccl-check";
  CLI::App* app = root.add_subcommand(
      "nccl-check",
      "NCCL preflight: create NCCL communicators with the fabric profile, report which transport NCCL\n"
      "chose (per rank), then time all_gather, reduce_scatter and all_reduce over a sweep of sizes\n"
      "(algbw = bytes / time, busbw as nccl-tests). Run it under a launcher, e.g.\n"
      "  shardtrain launch --nproc-per-node 8 -- nccl-check --expect-transport nvlink");
  auto& s = *state;
  app->add_option("--fabric.transport", s.fabric.transport, "auto | efa | ib | socket (as in train)")
      ->check(CLI::IsMember(fabric_transports()))
      ->capture_default_str();
  app->add_option("--fabric.socket_ifname", s.fabric.socket_ifname, "NCCL_SOCKET_IFNAME; empty = NCCL's choice");
  app->add_option("--expect-transport,--fabric.expect_transport", s.fabric.expect_transport,
                  "exit non-zero unless NCCL uses this: efa | ib | socket | nvlink | shm")
      ->check(CLI::IsMember(fabric_expect_transports()));
  app->add_option("--fabric.log_dir", s.fabric.log_dir, "directory for NCCL's logs (one per rank)")
      ->capture_default_str();
  app->add_option("--min-bytes", s.check.min_bytes, "smallest buffer (bytes)")->capture_default_str();
  app->add_option("--max-bytes", s.check.max_bytes, "largest buffer (bytes)")->capture_default_str();
  app->add_option("--factor", s.check.factor, "size step (multiply)")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  app->add_option("--iters", s.check.iters, "timed operations per size")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app->add_option("--warmup", s.check.warmup, "untimed operations per size")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app->add_option("--timeout-s", s.timeout_s, "limit on rendezvous and waits")
      ->check(finite_in(0, 604800, /*lo_open=*/true))
      ->capture_default_str();
  app->add_flag("--json", s.check.json, "print one JSON object (rank 0) instead of tables");
  return {app, [state] {
#ifndef SHARDTRAIN_HAVE_CUDA
            fail("nccl-check needs NCCL on GPUs: this build has no CUDA (nvcc was not found at configure time)");
            return 1;
#else
            std::string why;
            ST_CHECK(visible_devices("cuda", &why) > 0, "nccl-check needs NCCL on a GPU, and CUDA reports none",
                     why.empty() ? "" : ": ", why);
            DistOptions dist;
            dist.timeout_s = state->timeout_s;
            RankContext rank = bring_up_rank("cuda", dist, &state->fabric, "");
            ST_CHECK(rank.fabric, "nccl-check: a world of 1 started by hand has no NCCL communicator; run it under "
                                  "`shardtrain launch --nproc-per-node N -- nccl-check ...`");
            const DistEnv& env = rank.env;
            Backend& backend = *rank.backend;
            ProcessGroups& groups = rank.groups;
            const bool rank0 = env.rank == 0;
            const FabricReport& report = *rank.fabric;
            const ExpectCheck expect = check_expected_transport(report, state->fabric.expect_transport);
            nlohmann::json out = {{"world", env.world}, {"transport_report", to_json(report)}};
            if (!state->fabric.expect_transport.empty())
              out["expect_transport"] = {{"transport", state->fabric.expect_transport},
                                         {"ok", expect.ok},
                                         {"message", expect.message},
                                         {"notes", expect.notes}};
            if (rank0 && !state->check.json) {
              for (const std::string& line : format_transport_report(report)) log_info(line);
              for (const std::string& n : expect.notes) log_info("fabric: " + n);
            }
            if (!expect.ok) {
              if (rank0 && state->check.json) std::printf("%s\n", out.dump().c_str());
              throw Error(expect.message);
            }
            if (rank0 && !state->check.json) {
              if (!state->fabric.expect_transport.empty())
                log_info("fabric: expect_transport " + state->fabric.expect_transport + ": ok");
              log_info(check_table_header());
            }
            const auto rows = run_nccl_sweep(*groups.world, backend, state->check);
            nlohmann::json results = nlohmann::json::array();
            for (const NcclCheckRow& r : rows) {
              results.push_back(to_json(r));
              if (rank0 && !state->check.json) log_info(format_check_row(r));
            }
            out["results"] = results;
            if (rank0 && state->check.json) std::printf("%s\n", out.dump().c_str());
            return 0;
#endif
          }};
}

}  // namespace st
