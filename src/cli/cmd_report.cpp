// shardtrain report RUN_DIR... [--out report.html]: one self-contained HTML page
// (inline SVG and CSS, no script, nothing fetched) with each run's header and the
// runs' metrics overlaid, plot by plot (report/report.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/log.h"
#include "report/report.h"

namespace st {

Command add_report_command(CLI::App& root) {
  struct Options {
    std::vector<std::string> dirs, labels;
    std::string out = "report.html", title;
  };
  auto o = std::make_shared<Options>();
  CLI::App* app = root.add_subcommand(
      "report",
      "Render run directories (run.out_dir of `train`) as one self-contained HTML page: run headers, metrics "
      "over steps with the runs overlaid, op profiles.");
  app->add_option("RUN_DIR", o->dirs, "run directories (config.toml, metrics.jsonl, summary.json, profile.json)")
      ->required();
  app->add_option("--out,-o", o->out, "the HTML file to write (replaced whole, never half-written)")
      ->capture_default_str();
  app->add_option("--label", o->labels, "legend label of each run, in RUN_DIR order (give it once per run)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_option("--title", o->title, "page title (default: the run labels)");
  return {app, [o] {
            check_report_path(o->out);  // before reading anything
            std::vector<RunData> runs;
            for (const std::string& d : o->dirs) runs.push_back(read_run(d));
            label_runs(runs, o->labels);
            const std::string html = render_report(runs, ReportOptions{o->title});
            write_report(o->out, html);
            std::string absent;
            for (const std::string& id : unrecorded_metrics(runs)) absent += (absent.empty() ? "" : ", ") + id;
            std::printf("report: %zu run%s -> %s (%s)%s\n", runs.size(), runs.size() == 1 ? "" : "s",
                        o->out.c_str(), human_bytes(static_cast<double>(html.size())).c_str(),
                        absent.empty() ? "" : ("; not recorded: " + absent).c_str());
            for (const RunData& r : runs)
              std::printf("  %s: %s, %zu steps%s\n", r.label.c_str(), r.dir.c_str(), r.steps.size(),
                          r.finished() ? "" : r.interrupted() ? " (interrupted)" : " (unfinished: no summary.json)");
            return 0;
          }};
}

}  // namespace st
