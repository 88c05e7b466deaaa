// `shardtrain report`: one self-contained HTML page for run directories: a header per
// run, one inline SVG plot per metric over steps with the runs overlaid, and each
// run's op profile. The room in three parts: report/run_data.h reads a run
// directory, report/svg_plot.h draws a plot, this file is the page.
//
//   std::vector<RunData> runs = {read_run("runs/a"), read_run("runs/b")};
//   label_runs(runs);                         // "a (mb16)", "b (mb8)"
//   write_report("report.html", render_report(runs));
//
#pragma once
#include <string>
#include <vector>

#include "report/run_data.h"

namespace st {

struct ReportOptions {
  std::string title;  // "" = "shardtrain report: <the run directories' names>"
};

// The metrics plotted, in page order: {id, title}. Each becomes one <svg> (with
// data-metric="<id>"), or a "not recorded" note when no run has the metric.
struct MetricInfo {
  std::string id, title;
};
const std::vector<MetricInfo>& report_metrics();
// The ids of the metrics no run recorded (they get a note instead of a plot).
std::vector<std::string> unrecorded_metrics(const std::vector<RunData>& runs);

// The whole HTML page: inline CSS and SVG, no script, nothing fetched.
std::string render_report(const std::vector<RunData>& runs, const ReportOptions& options = {});

// The page's style sheet without the plots' part (svg_plot.h's plot_css), for other
// pages of the same look (report/scaleout_page.h).
const char* report_page_css();

// Writes the page through a temporary file renamed into place: a failure leaves the
// old file (or none) and no temporary. A path that is a directory, or whose parent
// directory does not exist, is refused before anything is written.
void write_report(const std::string& path, const std::string& html);
// write_report's refusals alone, to check a path before the runs are read.
void check_report_path(const std::string& path);

}  // namespace st
