// `shardtrain report`: the HTML page (report/report.h). The runs come from
// report/run_data, the plots from report/svg_plot.
#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "fabric/nccl_log.h"
#include "report/plot_metrics.h"
#include "report/svg_plot.h"
#include "report/text.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace report_text;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- a metric over steps ------------------------------------------------------------

Series series_of(const RunData& r, const Metric& m) {
  const std::string& key = m.key;
  Series out;
  for (const StepRecord& s : r.steps) {
    double v = s.values.contains(key) ? s.values.at(key).get<double>() * m.scale : kNaN;
    if (m.zero_is_missing && !(v > 0)) v = kNaN;
    if (!std::isfinite(v)) v = kNaN;
    out.x.push_back(s.step);
    out.y.push_back(v);
  }
  return out;
}

// A byte-valued metric in the unit that suits its largest value: its scale and its
// axis label ("... (MiB)").
Metric in_units(const Metric& m, const std::vector<RunData>& runs) {
  if (!m.bytes) return m;
  double most = 0;
  for (const RunData& r : runs)
    for (double v : series_of(r, m).y)
      if (std::isfinite(v)) most = std::max(most, v);
  static const std::pair<double, const char*> units[] = {{1ull << 40, "TiB"}, {1ull << 30, "GiB"},
                                                         {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  Metric out = m;
  std::string unit = "bytes";
  for (const auto& [u, name] : units)
    if (most >= u) {
      out.scale = m.scale / u, unit = name;
      break;
    }
  out.axis += " (" + unit + ")";
  return out;
}

PlotSpec plot_spec(const Metric& m) {
  PlotSpec p;
  p.id = m.id;
  p.title = m.title;
  p.y_label = m.axis;
  p.from_zero = m.from_zero;
  return p;
}

// ---- the page -----------------------------------------------------------------------

const char* kStyle = R"css(
:root { --fg: #1b1b1f; --muted: #5a5a66; --line: #d6d6de; --card: #f6f6f9; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1680px; padding: 24px 32px 48px; color: var(--fg); background: #fff;
       font: 16px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", "Liberation Sans", sans-serif; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 21px; margin: 32px 0 12px; }
.sub { color: var(--muted); margin: 0 0 8px; }
.runs { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 16px; }
.run { background: var(--card); border: 1px solid var(--line); border-top: 5px solid var(--c); border-radius: 6px;
       padding: 12px 16px 14px; min-width: 0; }
.run h3 { margin: 0; font-size: 19px; display: flex; align-items: center; gap: 10px; overflow-wrap: anywhere; }
.swatch { flex: none; display: inline-block; width: 30px; border-top: 4px solid var(--c); }
.status { margin: 4px 0 8px; font-weight: 600; }
.status.finished { color: #1e6b3a; }
.status.interrupted, .status.unfinished { color: #a33b00; }
dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 4px 16px; margin: 0; }
dt { color: var(--muted); }
dd { margin: 0; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
.small { color: var(--muted); font-size: 14px; }
pre { margin: 2px 0 0; font-size: 13px; line-height: 1.35; white-space: pre-wrap; overflow-wrap: anywhere; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 18px; }
figure.plot { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px 4px; min-width: 0; }
figure.plot h3 { margin: 0 0 2px; font-size: 18px; }
.note { color: var(--muted); }
.absent { margin-top: 14px; }
.absent p.note { margin: 4px 0; }
.absent strong { color: var(--fg); }
table.profile { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 14px; margin-top: 6px; }
table.profile th, table.profile td { padding: 4px 12px; border-bottom: 1px solid var(--line); text-align: right;
                                     white-space: nowrap; }
table.profile th { background: var(--card); }
table.profile th:first-child, table.profile td:first-child { text-align: left; white-space: normal; }
table.profile .bar { display: inline-block; height: 10px; background: var(--c); vertical-align: middle;
                     margin-right: 8px; border-radius: 2px; }
footer { margin-top: 36px; color: var(--muted); font-size: 14px; }
)css";

std::string model_text(const RunData& r) {
  const RunConfig& c = r.config;
  const ModelOptions& mo = c.model_options;
  std::string name = !mo.config.empty() ? mo.config : !mo.init_from.empty() ? mo.init_from : mo.preset;
  std::vector<std::string> overrides;
  auto add = [&](const char* what, int v) {
    if (v) overrides.push_back(std::string(what) + " " + std::to_string(v));
  };
  add("layers", mo.layers), add("hidden", mo.hidden_size), add("intermediate", mo.intermediate_size);
  add("heads", mo.heads), add("kv_heads", mo.kv_heads), add("vocab", mo.vocab_size);
  std::string out = esc(name);
  if (!overrides.empty()) {
    std::string o;
    for (const std::string& s : overrides) o += (o.empty() ? "" : ", ") + s;
    out += " with " + esc(o);
  }
  const ModelConfig& m = c.model;
  if (m.hidden_size > 0) {
    out += "<br><span class=\"small\">" + human_count(static_cast<double>(m.num_params())) + " parameters; " +
           std::to_string(m.num_layers) + " layers, hidden " + std::to_string(m.hidden_size) + ", heads " +
           std::to_string(m.num_heads) + "/" + std::to_string(m.num_kv_heads) + ", vocab " +
           grouped(m.vocab_size) + "</span>";
  } else if (!r.model_note.empty()) {
    out += "<br><span class=\"small\">dimensions unknown here: " + esc(r.model_note) + "</span>";
  }
  return out;
}

std::string status_html(const RunData& r) {
  const int total = r.summary && r.summary->steps ? *r.summary->steps : r.config.train.steps;
  const int last = r.steps.empty() ? 0 : r.steps.back().step;
  const std::string logged = r.steps.empty() ? "no step logged"
                                             : std::to_string(r.steps.size()) + " step" +
                                                   (r.steps.size() == 1 ? "" : "s") + " logged, the last step " +
                                                   std::to_string(last) + " of " + std::to_string(total);
  if (r.finished())
    return "<p class=\"status finished\">finished: " + std::to_string(total) + " step" + (total == 1 ? "" : "s") +
           "</p>";
  if (r.interrupted()) {
    const RunSummary& s = *r.summary;
    std::string t = "interrupted";
    if (s.signal) t += " by signal " + std::to_string(*s.signal);
    if (s.steps_done) t += " after step " + std::to_string(*s.steps_done) + " of " + std::to_string(total);
    if (s.checkpoint && !s.checkpoint->empty()) t += "; checkpoint in " + *s.checkpoint;
    return "<p class=\"status interrupted\">" + esc(t) + " (" + esc(logged) + ")</p>";
  }
  return "<p class=\"status unfinished\">unfinished: no summary.json (" + esc(logged) +
         "); the plots show what metrics.jsonl holds</p>";
}

void row(std::ostringstream& o, const std::string& dt, const std::string& dd_html) {
  o << "<dt>" << esc(dt) << "</dt><dd>" << dd_html << "</dd>\n";
}

std::string run_card(const RunData& r, size_t i) {
  const RunConfig& c = r.config;
  std::ostringstream o;
  o << "<article class=\"run\" id=\"run-" << i << "\" style=\"--c:" << series_colour(i) << "\">\n";
  o << "<h3><span class=\"swatch\"" << (*series_dashes(i) ? " style=\"border-top-style:dashed\"" : "") << "></span>"
    << esc(r.label) << "</h3>\n";
  o << status_html(r);
  o << "<dl>\n";
  row(o, "directory", esc(r.dir));
  row(o, "model", model_text(r));
  {
    std::string paths;
    for (const std::string& p : c.data.paths) paths += (paths.empty() ? "" : ", ") + p;
    row(o, "data", esc(c.data.source) + (c.data.source == "random" || paths.empty() ? "" : ": " + esc(paths)));
  }
  const long long per_rank = tokens_per_rank_step(c);
  if (r.world > 0) {
    row(o, "world size",
        std::to_string(r.world) + " rank" + (r.world == 1 ? "" : "s") +
            (r.world_from == "summary.json" ? "" : " <span class=\"small\">(from the " + esc(r.world_from) + ")</span>"));
    row(o, "batch",
        std::to_string(c.train.micro_batch) + " × " + std::to_string(c.train.seq_len) + " × " +
            std::to_string(c.train.grad_accum) + " × " + std::to_string(r.world) + " = " +
            grouped(per_rank * r.world) +
            " tokens/step<br><span class=\"small\">micro_batch × seq_len × grad_accum × world</span>");
  } else {
    row(o, "world size", "unknown");
    row(o, "batch",
        std::to_string(c.train.micro_batch) + " × " + std::to_string(c.train.seq_len) + " × " +
            std::to_string(c.train.grad_accum) + " = " + grouped(per_rank) +
            " tokens/step per rank<br><span class=\"small\">micro_batch × seq_len × grad_accum</span>");
  }
  row(o, "backend", esc(backend_of(r)) + (c.train.recompute != "none" ? ", recompute " + esc(c.train.recompute) : ""));

  // Summary numbers: summary.json when the run finished; otherwise what the steps say.
  if (r.finished()) {
    const RunSummary& s = *r.summary;
    auto num = [](const auto& v) { return v ? static_cast<double>(*v) : 0.0; };
    if (s.first_loss && s.final_loss)
      row(o, "loss", fmt("%.4f", num(s.first_loss)) + " → " + fmt("%.4f", num(s.final_loss)));
    if (s.tokens_per_s)
      row(o, "tokens/s",
          human_count(num(s.tokens_per_s)) +
              (r.world > 1 ? " (" + human_count(num(s.tokens_per_s_per_rank)) + " per rank)" : std::string()) +
              " <span class=\"small\">mean after step 1</span>");
    if (num(s.mfu) > 0)
      row(o, "MFU", fmt("%.1f%%", 100 * num(s.mfu)) + " <span class=\"small\">(" + sig3(num(s.tflops_per_rank)) +
                        " of " + sig3(num(s.peak_tflops)) + " TFLOP/s per rank)</span>");
    else
      row(o, "MFU", "<span class=\"small\">not known (no peak TFLOP/s for this device)</span>");
    if (num(s.peak_memory_bytes) > 0)
      row(o, "peak memory", human_bytes(num(s.peak_memory_bytes)) + " <span class=\"small\">per rank, after step 1</span>");
    if (num(s.first_step_after_start_s) > 0)
      row(o, "first step", fmt("%.2f s", num(s.first_step_after_start_s)) +
                               " <span class=\"small\">after the process started</span>");
  } else {
    if (!r.steps.empty() && r.steps.front().values.contains("loss") && r.steps.back().values.contains("loss"))
      row(o, "loss", fmt("%.4f", r.steps.front().values.at("loss").get<double>()) + " → " +
                         fmt("%.4f", r.steps.back().values.at("loss").get<double>()) +
                         " <span class=\"small\">(logged steps)</span>");
    double sum = 0;
    int n = 0;
    for (size_t k = 1; k < r.steps.size(); ++k)
      if (r.steps[k].values.contains("tokens_per_s")) sum += r.steps[k].values.at("tokens_per_s").get<double>(), ++n;
    if (n > 0)
      row(o, "tokens/s", human_count(sum / n) + " <span class=\"small\">mean of the logged steps after the first</span>");
    row(o, "summary", "<span class=\"small\">none: " +
                          std::string(r.interrupted() ? "the run was interrupted" : "the run has not finished") +
                          " (MFU, peak memory and the first step's time come with a finished run's summary.json)</span>");
  }
  if (r.transport) {
    std::string lines;
    for (const std::string& l : format_transport_report(*r.transport)) lines += l + "\n";
    row(o, "transport", "<pre>" + esc(lines) + "</pre>");
  } else {
    row(o, "transport", "<span class=\"small\">no transport report (no NCCL communicator)</span>");
  }
  if (r.profile) row(o, "op profile", "<a href=\"#profile-" + std::to_string(i) + "\">below</a>");
  o << "</dl>\n</article>\n";
  return o.str();
}

std::string profile_section(const RunData& r, size_t i) {
  const json& p = *r.profile;
  auto num = [&](const json& j, const char* k) {
    return j.contains(k) && j.at(k).is_number() ? j.at(k).get<double>() : 0.0;
  };
  const bool has = [&] {
    for (const char* k : {"steps", "step_ms"})
      if (!p.contains(k)) return false;
    return true;
  }();
  std::ostringstream o;
  o << "<section class=\"profile\" id=\"profile-" << i << "\" style=\"--c:" << series_colour(i) << "\">\n";
  o << "<h3>" << esc(r.label) << "</h3>\n<p class=\"sub\">";
  if (p.contains("device") && p.at("device").is_string()) o << "on " << esc(p.at("device").get<std::string>()) << ": ";
  if (has) {
    const int steps = static_cast<int>(num(p, "steps"));
    o << steps << " step" << (steps == 1 ? "" : "s") << " in the window, step " << fmt("%.3f", num(p, "step_ms"))
      << " ms, ops " << fmt("%.3f", num(p, "ops_ms_per_step")) << " ms";
  }
  o << "; ceilings " << (num(p, "peak_tflops") > 0 ? sig3(num(p, "peak_tflops")) + " TFLOP/s" : "unknown TFLOP/s")
    << ", " << (num(p, "peak_gbps") > 0 ? sig3(num(p, "peak_gbps")) + " GB/s" : "unknown GB/s") << "</p>\n";
  o << "<table class=\"profile\"><thead><tr><th>op</th><th>calls/step</th><th>ms/step</th><th>share of step</th>"
       "<th>achieved</th><th>% of peak</th></tr></thead><tbody>\n";
  for (const json& row : p.at("rows")) {
    const bool other = row.value("other", false);
    const double share = num(row, "share_of_step");
    std::string achieved = "-", pct = "-", calls = "-";
    if (!other) {
      if (row.contains("tflops") && row.at("tflops").is_number()) achieved = sig3(num(row, "tflops")) + " TFLOP/s";
      else if (row.contains("gbps") && row.at("gbps").is_number()) achieved = sig3(num(row, "gbps")) + " GB/s";
      if (row.contains("percent_of_peak") && row.at("percent_of_peak").is_number())
        pct = fmt("%.1f%%", num(row, "percent_of_peak"));
      if (row.contains("calls_per_step") && row.at("calls_per_step").is_number()) {
        const double c = num(row, "calls_per_step");
        calls = c == std::floor(c) ? fmt("%.0f", c) : fmt("%.2f", c);
      }
    }
    o << "<tr><td>" << esc(row.at("op").get<std::string>()) << "</td><td>" << calls << "</td><td>"
      << fmt("%.3f", num(row, "ms_per_step")) << "</td><td><span class=\"bar\" style=\"width:"
      << fmt("%.0f", std::clamp(share, 0.0, 1.0) * 120) << "px\"></span>" << fmt("%.1f%%", 100 * share)
      << "</td><td>" << achieved << "</td><td>" << pct << "</td></tr>\n";
  }
  o << "</tbody></table>\n</section>\n";
  return o.str();
}

}  // namespace

const std::vector<MetricInfo>& report_metrics() {
  static const std::vector<MetricInfo> out = [] {
    std::vector<MetricInfo> v;
    for (const Metric& m : metrics()) v.push_back({m.id, m.title});
    return v;
  }();
  return out;
}

std::vector<std::string> unrecorded_metrics(const std::vector<RunData>& runs) {
  std::vector<std::string> out;
  for (const Metric& m : metrics()) {
    bool any = false;
    for (const RunData& r : runs) any = any || series_of(r, m).any();
    if (!any) out.push_back(m.id);
  }
  return out;
}

std::string render_report(const std::vector<RunData>& runs, const ReportOptions& options) {
  std::string title = options.title;
  if (title.empty()) {
    title = "shardtrain report: ";
    for (size_t i = 0; i < runs.size(); ++i) title += (i ? ", " : "") + runs[i].name;
  }
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>"
    << esc(title) << "</title>\n<style>" << kStyle << plot_css() << "</style>\n</head>\n<body>\n";
  o << "<header><h1>" << esc(title) << "</h1>\n<p class=\"sub\">" << runs.size() << " run"
    << (runs.size() == 1 ? "" : "s") << "; every plot is over optimizer steps, one line per run</p></header>\n";

  o << "<h2>Runs</h2>\n<section class=\"runs\">\n";
  for (size_t i = 0; i < runs.size(); ++i) o << run_card(runs[i], i);
  o << "</section>\n";

  o << "<h2>Metrics</h2>\n<section class=\"plots\">\n";
  std::vector<std::string> labels;
  for (const RunData& r : runs) labels.push_back(r.label);
  std::string absent;
  for (const Metric& metric : metrics()) {
    const Metric m = in_units(metric, runs);
    std::vector<Series> all;
    bool any = false;
    for (const RunData& r : runs) {
      all.push_back(series_of(r, m));
      any = any || all.back().any();
    }
    if (!any) {
      absent += "<p class=\"note\" data-metric=\"" + m.id + "\"><strong>" + esc(m.title) + "</strong>: not recorded" +
                (m.absent_hint.empty() ? std::string() : " (" + esc(m.absent_hint) + ")") + "</p>\n";
      continue;
    }
    o << "<figure class=\"plot\" id=\"plot-" << m.id << "\">\n<h3>" << esc(m.title) << "</h3>\n"
      << render_plot(plot_spec(m), labels, all) << "</figure>\n";
  }
  o << "</section>\n";
  if (!absent.empty()) o << "<section class=\"absent\">\n" << absent << "</section>\n";

  bool profiles = false;
  for (const RunData& r : runs) profiles = profiles || r.profile.has_value();
  if (profiles) {
    o << "<h2>Op profiles</h2>\n";
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i].profile) o << profile_section(runs[i], i);
  }
  o << "<footer>shardtrain " << SHARDTRAIN_VERSION << " report</footer>\n</body>\n</html>\n";
  return o.str();
}

const char* report_page_css() { return kStyle; }

void check_report_path(const std::string& path) {
  std::error_code ec;
  ST_CHECK_CONFIG(!path.empty(), "the report's path is empty");
  if (fs::is_directory(path, ec))
    fail_config(path, ": is a directory; the report is one file (e.g. ", (fs::path(path) / "report.html").string(), ")");
  const fs::path p(path);
  if (p.filename().empty()) fail_config(path, ": names a directory; the report is one file");
  const fs::path parent = p.parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    fail_config(path, ": directory '", parent.string(), "' does not exist");
}

void write_report(const std::string& path, const std::string& html) {
  check_report_path(path);
  write_text_atomic(path, html);  // a failed write leaves nothing behind
}

}  // namespace st
