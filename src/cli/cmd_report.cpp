// shardtrain report RUN_DIR... [--out report.html]: one self-contained HTML page
// (inline SVG and CSS, no script, nothing fetched) with each run's header and the
// runs' metrics overlaid, plot by plot (report/report.h).
// shardtrain report --scaleout OUT [--out F] [--svg F]: the emulated cluster's sweep
// (bench/scaleout.sh's OUT/scaleout.json) as a page, and its plot alone as SVG
// (report/scaleout_page.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "report/report.h"
#include "report/scaleout_page.h"

namespace st {

namespace {
template <class Options>
int scaleout_report(const Options& o) {
  ST_CHECK_CONFIG(o.dirs.empty(), "report: --scaleout renders one sweep; give no RUN_DIR with it");
  ST_CHECK_CONFIG(o.labels.empty() && o.title.empty(), "report: --label and --title are for run directories");
  check_report_path(o.out);  // before reading anything
  if (!o.svg.empty()) check_report_path(o.svg);
  const ScaleoutData d = read_scaleout(o.scaleout);
  const std::string html = render_scaleout_page(d);
  const std::string svg = o.svg.empty() ? "" : render_scaleout_svg(d);  // may refuse: before anything is written
  write_report(o.out, html);
  std::printf("report: scale-out sweep %s (%zu runs, %zu faults) -> %s (%s)\n", d.path.c_str(), d.runs.size(),
              d.faults.size(), o.out.c_str(), human_bytes(static_cast<double>(html.size())).c_str());
  if (!o.svg.empty()) {
    write_report(o.svg, svg);
    std::printf("report: the plot alone -> %s\n", o.svg.c_str());
  }
  return 0;
}
}  // namespace

Command add_report_command(CLI::App& root) {
  struct Options {
    std::vector<std::string> dirs, labels;
    std::string out = "report.html", title, scaleout, svg;
  };
  auto o = std::make_shared<Options>();
  CLI::App* app = root.add_subcommand(
      "report",
      "Render run directories (run.out_dir of `train`) as one self-contained HTML page: run headers, metrics "
      "over steps with the runs overlaid, op profiles. With --scaleout: the emulated cluster's sweep "
      "(bench/scaleout.sh OUT) as a page: steps/s against link rate, measured and predicted, and the runs' and "
      "faults' tables.");
  app->add_option("RUN_DIR", o->dirs, "run directories (config.toml, metrics.jsonl, summary.json, profile.json)");
  app->add_option("--scaleout", o->scaleout,
                  "render bench/scaleout.sh's results instead: its OUT folder or OUT/scaleout.json");
  app->add_option("--svg", o->svg,
                  "with --scaleout: also write the plot alone as a standalone SVG file (for documents)");
  app->add_option("--out,-o", o->out, "the HTML file to write (replaced whole, never half-written)")
      ->capture_default_str();
  app->add_option("--label", o->labels, "legend label of each run, in RUN_DIR order (give it once per run)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_option("--title", o->title, "page title (default: the run labels)");
  return {app, [o] {
            if (!o->scaleout.empty()) return scaleout_report(*o);
            ST_CHECK_CONFIG(!o->dirs.empty(), "report: give RUN_DIR (one or more run directories) or --scaleout OUT");
            ST_CHECK_CONFIG(o->svg.empty(), "report: --svg goes with --scaleout");
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
