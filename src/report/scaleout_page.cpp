// The emulated cluster's page (report/scaleout_page.h).
#include "report/scaleout_page.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"
#include "report/report.h"
#include "report/svg_plot.h"
#include "report/text.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace report_text;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Field readers: `where` is "<file>: runs[3]", so an error names the record.
struct Reader {
  const json& obj;
  std::string where;

  const json* get(const char* key, bool required) const {
    if (!obj.contains(key)) {
      if (required) fail_data(where, ": \"", key, "\" is missing");
      return nullptr;
    }
    return &obj.at(key);
  }
  std::optional<double> number(const char* key, bool required = false) const {
    const json* v = get(key, required);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_number()) fail_data(where, ": \"", key, "\" must be a number or null, got ", v->type_name(), " ", v->dump());
    const double d = v->get<double>();
    if (!std::isfinite(d)) fail_data(where, ": \"", key, "\" is not finite");
    return d;
  }
  int whole(const char* key) const {
    const json* v = get(key, true);
    if (!v->is_number_integer() || v->get<long long>() < 1 || v->get<long long>() > 1 << 20)
      fail_data(where, ": \"", key, "\" must be a positive integer, got ", v->dump());
    return v->get<int>();
  }
  std::string text(const char* key, bool required = false) const {
    const json* v = get(key, required);
    if (!v || v->is_null()) return "";
    if (!v->is_string()) fail_data(where, ": \"", key, "\" must be a string, got ", v->type_name());
    return v->get<std::string>();
  }
  bool flag(const char* key) const {
    const json* v = get(key, false);
    if (!v || v->is_null()) return false;
    if (!v->is_boolean()) fail_data(where, ": \"", key, "\" must be true or false, got ", v->dump());
    return v->get<bool>();
  }
  const json& array(const char* key) const {
    const json* v = get(key, true);
    if (!v->is_array()) fail_data(where, ": \"", key, "\" must be an array, got ", v->type_name());
    return *v;
  }
  std::vector<double> numbers(const char* key) const {
    std::vector<double> out;
    const json* v = get(key, false);
    if (!v || v->is_null()) return out;
    if (!v->is_array()) fail_data(where, ": \"", key, "\" must be an array of numbers, got ", v->type_name());
    for (const json& e : *v) {
      if (!e.is_number()) fail_data(where, ": \"", key, "\" must be an array of numbers, got ", e.dump());
      out.push_back(e.get<double>());
    }
    return out;
  }
};

ScaleoutRun read_run(const json& j, const std::string& where) {
  if (!j.is_object()) fail_data(where, ": must be an object, got ", j.type_name());
  const Reader r{j, where};
  ScaleoutRun run;
  run.nodes = r.whole("nodes");
  run.ranks_per_node = r.whole("ranks_per_node");
  run.strategy = r.text("strategy", true);
  if (run.strategy.empty()) fail_data(where, ": \"strategy\" is empty");
  r.get("link_mbit", true);
  run.link_mbit = r.number("link_mbit");
  if (run.link_mbit && !(*run.link_mbit > 0)) fail_data(where, ": \"link_mbit\" must be positive or null (no limit)");
  run.delay_ms = r.number("delay_ms").value_or(0);
  run.ok = r.flag("ok");
  run.overlap = r.flag("overlap");
  run.exposed_comm_s = r.number("exposed_comm_s");
  run.step_s = r.number("step_s", true);
  if (run.step_s && !(*run.step_s > 0)) fail_data(where, ": \"step_s\" must be positive or null");
  run.tokens_per_s = r.number("tokens_per_s");
  run.predicted_step_s = r.number("predicted_step_s");
  if (run.predicted_step_s && !(*run.predicted_step_s > 0))
    fail_data(where, ": \"predicted_step_s\" must be positive or null");
  run.tcp_one_flow_mbit = r.number("tcp_one_flow_mbit");
  run.tx_bytes_per_step = r.numbers("tx_bytes_per_step");
  run.comm_inter_tx_bytes_per_step = r.number("comm_inter_tx_bytes_per_step");
  run.name = r.text("name");
  return run;
}

ScaleoutFault read_fault(const json& j, const std::string& where) {
  if (!j.is_object()) fail_data(where, ": must be an object, got ", j.type_name());
  const Reader r{j, where};
  ScaleoutFault f;
  f.kind = r.text("kind", true);
  f.outcome = r.text("outcome");
  f.name = r.text("name");
  f.meets_goal = r.flag("meets_goal");
  for (double c : r.numbers("node_exit_codes")) f.exit_codes.push_back(static_cast<int>(c));
  if (j.contains("messages") && j.at("messages").is_object() && j.at("messages").contains("node0")) {
    const json& lines = j.at("messages").at("node0");
    if (lines.is_array())
      for (const json& l : lines)
        if (l.is_string() && l.get<std::string>().find("error:") != std::string::npos) {
          f.node0_error = l.get<std::string>();
          break;
        }
  }
  return f;
}

std::string link_text(const ScaleoutRun& r) {
  std::string s = r.link_mbit ? fmt("%g Mbit/s", *r.link_mbit) : "no limit";
  if (r.delay_ms > 0) s += fmt(" + %g ms", r.delay_ms);
  return s;
}

std::string opt(const std::optional<double>& v, const char* f) { return v ? fmt(f, *v) : "–"; }

std::string mb(double bytes) { return fixed(bytes / 1e6, 1); }

// One pair of lines (measured, predicted) per shape, strategy and delay, over the
// runs with a link limit; x = link Mbit/s, y = steps/s.
struct Plot {
  std::vector<std::string> labels;
  std::vector<Series> series;
  size_t unlimited = 0;  // runs left out: no rate to place them at
};

Plot build_plot(const ScaleoutData& d) {
  std::vector<std::string> groups;
  std::map<std::string, std::vector<const ScaleoutRun*>> by;
  Plot p;
  for (const ScaleoutRun& r : d.runs) {
    if (!r.link_mbit) {
      ++p.unlimited;
      continue;
    }
    std::string g = r.series() + (r.delay_ms > 0 ? fmt(" +%g ms", r.delay_ms) : "");
    if (!by.count(g)) groups.push_back(g);
    by[g].push_back(&r);
  }
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    std::vector<const ScaleoutRun*> runs = by[groups[gi]];
    std::sort(runs.begin(), runs.end(), [](auto* a, auto* b) { return *a->link_mbit < *b->link_mbit; });
    Series measured, predicted;
    for (const ScaleoutRun* r : runs) {
      measured.x.push_back(*r->link_mbit);
      measured.y.push_back(r->step_s ? 1 / *r->step_s : kNaN);
      predicted.x.push_back(*r->link_mbit);
      predicted.y.push_back(r->predicted_step_s ? 1 / *r->predicted_step_s : kNaN);
    }
    measured.colour = predicted.colour = series_colour(gi);
    predicted.dashes = "7 5";
    measured.dots = predicted.dots = true;
    p.labels.push_back(groups[gi] + " measured");
    p.series.push_back(measured);
    p.labels.push_back(groups[gi] + " predicted");
    p.series.push_back(predicted);
  }
  return p;
}

PlotSpec plot_spec() {
  PlotSpec s;
  s.id = "scaleout-steps";
  s.title = "steps/s against link rate";
  s.y_label = "steps/s";
  s.x_label = "link rate per node (Mbit/s)";
  s.x_name = "link rate";
  return s;
}

std::string plot_svg(const ScaleoutData& d, size_t* unlimited = nullptr) {
  const Plot p = build_plot(d);
  if (unlimited) *unlimited = p.unlimited;
  if (p.series.empty()) return "";
  return render_plot(plot_spec(), p.labels, p.series);
}

}  // namespace

std::string ScaleoutRun::series() const {
  return std::to_string(nodes) + "x" + std::to_string(ranks_per_node) + " " + strategy +
         (overlap ? "" : ", no overlap");
}

ScaleoutData read_scaleout(const std::string& path) {
  std::error_code ec;
  ScaleoutData d;
  d.path = fs::is_directory(path, ec) ? (fs::path(path) / "scaleout.json").string() : path;
  if (!fs::exists(d.path, ec))
    fail_data(d.path, ": not found (bench/scaleout.sh OUT writes OUT/scaleout.json)");
  std::string text;
  const json j = read_json_object(d.path, text);
  const Reader top{j, d.path};
  d.date = top.text("date");
  d.commit = top.text("commit");
  if (j.contains("params")) {
    const json& v = j.at("params");
    d.params = v.is_string() ? v.get<std::string>() : v.is_number() ? v.dump() : "";
  }
  if (j.contains("machine") && j.at("machine").is_object()) {
    const json& m = j.at("machine");
    const Reader mr{m, d.path + ": machine"};
    d.nproc = static_cast<int>(mr.number("nproc").value_or(0));
    d.kernel = mr.text("kernel");
    d.netem = mr.flag("netem_available");
    auto load = [&](const char* key) {
      std::string s;
      if (m.contains(key) && m.at(key).is_array())
        for (const json& v : m.at(key)) s += (s.empty() ? "" : " ") + (v.is_string() ? v.get<std::string>() : v.dump());
      return s;
    };
    d.load_start = load("loadavg_start");
    d.load_end = load("loadavg_end");
  }
  const json& runs = top.array("runs");
  for (size_t i = 0; i < runs.size(); ++i)
    d.runs.push_back(read_run(runs[i], d.path + ": runs[" + std::to_string(i) + "]"));
  if (j.contains("faults") && !j.at("faults").is_null()) {
    const json& faults = top.array("faults");
    for (size_t i = 0; i < faults.size(); ++i)
      d.faults.push_back(read_fault(faults[i], d.path + ": faults[" + std::to_string(i) + "]"));
  }
  return d;
}

std::string render_scaleout_svg(const ScaleoutData& d) {
  std::string svg = plot_svg(d);
  ST_CHECK_DATA(!svg.empty(), d.path, ": no run with a link limit, so there is nothing to plot");
  const size_t end = svg.find('>');
  std::string style = std::string("<style>") + plot_css() +
                      "svg.chart { font-family: \"DejaVu Sans\", \"Liberation Sans\", sans-serif; background: #fff; }"
                      "</style>\n";
  svg.insert(end + 2, style);
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg;
}

std::string render_scaleout_page(const ScaleoutData& d) {
  const std::string title = "shardtrain scale-out: " + d.path;
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>"
    << esc(title) << "</title>\n<style>" << report_page_css() << plot_css() << "</style>\n</head>\n<body>\n";
  o << "<header><h1>" << esc(title) << "</h1>\n<p class=\"sub\">the emulated cluster (bench/scaleout.sh): "
    << d.runs.size() << " run" << (d.runs.size() == 1 ? "" : "s") << ", " << d.faults.size() << " fault"
    << (d.faults.size() == 1 ? "" : "s") << "</p></header>\n<dl>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    if (!v.empty()) o << "<dt>" << esc(k) << "</dt><dd>" << esc(v) << "</dd>\n";
  };
  row("date", d.date);
  row("commit", d.commit);
  row("machine", (d.nproc ? std::to_string(d.nproc) + " cores, " : std::string()) + "kernel " + d.kernel +
                     (d.netem ? ", netem available" : ", no netem (no delay or loss settings)"));
  if (!d.load_start.empty()) row("load average", d.load_start + " at the start, " + d.load_end + " at the end");
  if (!d.params.empty()) row("model", d.params + " parameters");
  o << "</dl>\n";

  size_t unlimited = 0;
  const std::string svg = plot_svg(d, &unlimited);
  o << "<h2>Steps/s against link rate</h2>\n";
  if (svg.empty()) {
    o << "<p class=\"note\">No run had a link limit: nothing to plot.</p>\n";
  } else {
    o << "<figure class=\"plot\" id=\"plot-scaleout\">\n"
      << svg << "<p class=\"small\">Solid: measured (median step after the untimed ones). Dashed: the step-time "
      << "model (<code>shardtrain predict</code>, docs/scaleout.md). ";
    if (unlimited) o << unlimited << " run" << (unlimited == 1 ? "" : "s") << " with no link limit: in the table only.";
    o << "</p></figure>\n";
  }

  o << "<h2>Runs</h2>\n<table class=\"profile\" id=\"runs\">\n<tr><th>run</th><th>nodes × ranks</th><th>strategy</th>"
       "<th>overlap</th><th>link</th><th>one TCP flow Mbit/s</th><th>step s</th><th>steps/s</th><th>tokens/s</th>"
       "<th>exposed comm s</th>"
       "<th>tx MB/step per node</th><th>counted MB/step</th><th>predicted s</th><th>pred/meas</th></tr>\n";
  for (const ScaleoutRun& r : d.runs) {
    std::string tx;
    for (double b : r.tx_bytes_per_step) tx += (tx.empty() ? "" : " / ") + mb(b);
    std::string ratio = r.step_s && r.predicted_step_s ? fixed(*r.predicted_step_s / *r.step_s, 3) : "–";
    o << "<tr><td>" << esc(r.name) << (r.ok ? "" : " <strong>(failed)</strong>") << "</td><td>" << r.nodes << " × "
      << r.ranks_per_node << "</td><td>" << esc(r.strategy) << "</td><td>" << (r.overlap ? "on" : "off")
      << "</td><td>" << esc(link_text(r)) << "</td><td>"
      << opt(r.tcp_one_flow_mbit, "%.0f") << "</td><td>" << opt(r.step_s, "%.3f") << "</td><td>"
      << (r.step_s ? fixed(1 / *r.step_s, 3) : "–") << "</td><td>" << opt(r.tokens_per_s, "%.0f") << "</td><td>"
      << opt(r.exposed_comm_s, "%.3f") << "</td><td>" << (tx.empty() ? "–" : tx) << "</td><td>"
      << (r.comm_inter_tx_bytes_per_step ? mb(*r.comm_inter_tx_bytes_per_step) : "–") << "</td><td>"
      << opt(r.predicted_step_s, "%.3f") << "</td><td>" << ratio << "</td></tr>\n";
  }
  o << "</table>\n";

  if (!d.faults.empty()) {
    o << "<h2>Faults</h2>\n<table class=\"profile\" id=\"faults\">\n<tr><th>fault</th><th>exit codes</th>"
         "<th>outcome</th><th>meets the goal</th><th>node 0's error</th></tr>\n";
    for (const ScaleoutFault& f : d.faults) {
      std::string codes;
      for (int c : f.exit_codes) codes += (codes.empty() ? "" : ", ") + std::to_string(c);
      o << "<tr><td>" << esc(f.kind) << "</td><td>" << esc(codes) << "</td><td>" << esc(f.outcome) << "</td><td>"
        << (f.meets_goal ? "yes" : "<strong>no</strong>") << "</td><td>" << esc(f.node0_error) << "</td></tr>\n";
    }
    o << "</table>\n";
  }
  o << "<footer>shardtrain " << SHARDTRAIN_VERSION << " report --scaleout</footer>\n</body>\n</html>\n";
  return o.str();
}

}  // namespace st
