#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"
#include "core/log.h"
#include "fabric/nccl_log.h"
#include "fabric/transport_report.h"
#include "core/files.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- what is plotted ----------------------------------------------------------------

struct Metric {
  std::string id, title;
  std::string key;                // in the step records
  std::string axis;               // y axis label
  double scale = 1;               // plotted value = record value * scale
  bool from_zero = true;          // the y axis starts at 0
  bool zero_is_missing = false;   // 0 means "not known" (MFU without a peak)
  std::string absent_hint;        // after "not recorded" when no run has it
  bool bytes = false;             // plotted in KiB, MiB or GiB, whichever suits the largest value
};

const std::vector<Metric>& metrics() {
  static const std::vector<Metric> m = {
      {"loss", "Loss", "loss", "loss", 1, false, false, ""},
      {"lr", "Learning rate", "lr", "learning rate", 1, true, false, ""},
      {"grad_norm", "Gradient norm", "grad_norm", "gradient norm (before clipping)", 1, true, false, ""},
      {"tokens_per_s", "Throughput", "tokens_per_s", "tokens/s (all ranks)", 1, true, false, ""},
      {"mfu", "MFU", "mfu", "MFU (%)", 100, true, true,
       "MFU needs the device's peak TFLOP/s: a known GPU, or train.peak_tflops"},
      {"memory", "Memory", "peak_memory_bytes", "peak memory per rank", 1, true, true,
       "no step record of metrics.jsonl has peak_memory_bytes (runs of older versions), or the backend does not "
       "track its allocations", true},
  };
  return m;
}

// ---- text -------------------------------------------------------------------------

std::string esc(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s == "-0" || s.rfind("-0.", 0) == 0) {  // "-0.0" -> "0.0"
    bool all_zero = s.find_first_not_of("-0.") == std::string::npos;
    if (all_zero) s.erase(0, 1);
  }
  return s;
}

// 1234567 -> "1,234,567".
std::string grouped(long long v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string sig3(double v) { return fmt("%.3g", v); }

// ---- metrics.jsonl ------------------------------------------------------------------

// Keys of a step record that must be numbers (or null, a non-finite value) when present.
std::vector<std::string> numeric_step_keys() {
  std::vector<std::string> keys = {"tokens", "elapsed_s", "step_s", "tflops_per_rank"};
  for (const Metric& m : metrics()) keys.push_back(m.key);
  return keys;
}

void read_metrics(RunData& r, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_data(path, ": cannot read");
  const std::vector<std::string> numeric = numeric_step_keys();
  std::map<int, StepRecord> by_step;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      // The line is the record: "parse error at line 1, column 18: ..." -> "column 18: ...".
      std::string m = json_message(e);
      if (m.rfind("parse error at line 1, column", 0) == 0) m = m.substr(std::string("parse error at line 1, ").size());
      fail_data(where, ": not a JSON record: ", m);
    }
    if (!j.is_object()) fail_data(where, ": expected a JSON object, got ", j.type_name());
    if (j.contains("transport_report")) {
      const json& t = j.at("transport_report");
      if (!t.is_object()) fail_data(where, ": \"transport_report\" must be an object, got ", t.type_name());
      try {
        r.transport = fabric_report_from_json(t);
      } catch (const json::exception& e) {
        fail_data(where, ": malformed transport report: ", json_message(e));
      }
      continue;
    }
    if (!j.contains("step")) continue;  // a record of another kind
    const json& s = j.at("step");
    if (!s.is_number_integer() || s.get<long long>() < 1 || s.get<long long>() > std::numeric_limits<int>::max())
      fail_data(where, ": \"step\" must be a positive integer, got ", s.dump());
    StepRecord rec;
    rec.step = s.get<int>();
    rec.values = json::object();
    for (const std::string& key : numeric) {
      if (!j.contains(key)) continue;
      const json& v = j.at(key);
      if (v.is_null()) continue;
      if (!v.is_number()) fail_data(where, ": \"", key, "\" must be a number, got ", v.type_name(), " ", v.dump());
      rec.values[key] = v;
    }
    by_step[rec.step] = std::move(rec);  // a resumed run logs a step again: the last one counts
  }
  if (in.bad()) fail_data(path, ": read failed");
  for (auto& [step, rec] : by_step) r.steps.push_back(std::move(rec));
}

// ---- summary.json, profile.json -----------------------------------------------------

void read_summary(RunData& r, const std::string& path) { r.summary = read_run_summary(path); }

void read_profile(RunData& r, const std::string& path) {
  std::string text;
  json j = read_json_object(path, text);
  for (const char* key : {"steps", "step_ms", "ops_ms_per_step", "denominator_ms", "peak_tflops", "peak_gbps"})
    require_number(j, key, path, text);
  if (!j.contains("rows") || !j.at("rows").is_array()) {
    const int line = line_of_key(text, "rows");
    fail_data(path, line ? ":" + std::to_string(line) : std::string(), ": \"rows\" must be an array of op rows");
  }
  for (const json& row : j.at("rows")) {
    if (!row.is_object() || !row.contains("op") || !row.at("op").is_string()) {
      fail_data(path, ": every entry of \"rows\" must be an object with a string \"op\", got ", row.dump());
    }
    for (const char* key : {"calls_per_step", "ms_per_step", "share_of_step", "flops_per_call", "bytes_per_call",
                            "tflops", "gbps", "percent_of_peak"})
      if (row.contains(key) && !row.at(key).is_number() && !row.at(key).is_null())
        fail_data(path, ": op '", row.at("op").get<std::string>(), "': \"", key, "\" must be a number or null, got ",
                  row.at(key).type_name());
  }
  r.profile = std::move(j);
}

long long tokens_per_rank_step(const RunConfig& c) {
  return static_cast<long long>(c.train.micro_batch) * c.train.seq_len * c.train.grad_accum;
}

void find_world(RunData& r) {
  if (r.summary && r.summary->world && *r.summary->world > 0) {
    r.world = *r.summary->world;
    r.world_from = "summary.json";
    return;
  }
  if (r.transport && !r.transport->ranks.empty()) {
    r.world = static_cast<int>(r.transport->ranks.size());
    r.world_from = "transport report";
    return;
  }
  // The tokens one step added: micro_batch x seq_len x grad_accum x world.
  const long long per_rank = tokens_per_rank_step(r.config);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepRecord& s = r.steps[i];
    if (!s.values.contains("tokens")) continue;
    long long added = -1;
    if (s.step == 1) added = s.values.at("tokens").get<long long>();
    else if (i > 0 && r.steps[i - 1].step == s.step - 1 && r.steps[i - 1].values.contains("tokens"))
      added = s.values.at("tokens").get<long long>() - r.steps[i - 1].values.at("tokens").get<long long>();
    if (added > 0 && per_rank > 0 && added % per_rank == 0) {
      r.world = static_cast<int>(added / per_rank);
      r.world_from = "tokens per step";
      return;
    }
  }
}

std::string dir_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (p.empty() || p == "." || p == "..") {
    std::error_code ec;
    p = fs::absolute(dir, ec).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
  }
  const std::string name = p.filename().string();
  return name.empty() ? dir : name;
}

// ---- labels -------------------------------------------------------------------------

std::string transport_of(const RunData& r) {
  if (r.config.fabric.transport != "auto") return r.config.fabric.transport;
  if (!r.transport) return "";
  std::set<std::string> kinds;
  for (const TransportSummary& s : r.transport->ranks)
    for (const std::string& n : s.networks) {
      std::string k = net_kind(n, s.ofi_provider);
      if (k.rfind("net:", 0) == 0) k = k.substr(4);
      kinds.insert(k);
    }
  std::string out;
  for (const std::string& k : kinds) out += (out.empty() ? "" : "+") + k;
  return out;
}

// "mb16": a prefix and a number, for labels.
std::string tag(const char* prefix, int v) {
  std::string s = prefix;
  s += std::to_string(v);
  return s;
}

std::string backend_of(const RunData& r) {
  if (r.summary && r.summary->backend) return *r.summary->backend;
  return r.config.train.device;
}

// ---- axes ---------------------------------------------------------------------------

// How an axis prints its tick values: plain with `decimals`, with an SI suffix
// ("12.5k"), or as mantissas with a power of ten in the axis label ("x10^-4").
struct AxisFormat {
  double divisor = 1;
  std::string suffix;   // per tick: "k", "M", ...
  int exponent = 0;     // != 0: the axis label says "×10^exponent"
  int decimals = 0;
  std::string label(double v) const {
    if (v == 0) return "0";
    return fixed(v / divisor, decimals) + suffix;
  }
};

int decimals_for(double step) {
  if (!(step > 0)) return 0;
  return std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
}

AxisFormat axis_format(const Ticks& t) {
  AxisFormat f;
  const double big = std::max(std::abs(t.lo), std::abs(t.hi));
  if (big >= 1e4) {
    static const std::pair<double, const char*> units[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}};
    for (const auto& [u, s] : units)
      if (big >= u) {
        f.divisor = u, f.suffix = s;
        break;
      }
  } else if (big > 0 && big < 1e-2) {
    f.exponent = static_cast<int>(std::floor(std::log10(big) + 1e-9));
    f.divisor = std::pow(10.0, f.exponent);
  }
  f.decimals = decimals_for(t.step / f.divisor);
  return f;
}

std::string superscript(int n) {
  static const char* digits[] = {"⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"};
  std::string out = n < 0 ? "⁻" : "";
  for (char c : std::to_string(std::abs(n))) out += digits[c - '0'];
  return out;
}

// ---- colours ------------------------------------------------------------------------

// Okabe & Ito's colour-blind-safe palette (yellow left out: too faint on white); past
// seven runs the colours repeat with dashes.
const char* colour(size_t i) {
  static const char* c[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"};
  return c[i % 7];
}
const char* dashes(size_t i) {
  static const char* d[] = {"", "9 5", "2 4"};
  return d[(i / 7) % 3];
}

// ---- one plot -----------------------------------------------------------------------

struct Series {
  std::vector<double> x, y;  // y NaN: no value at that step (a gap)
  bool any() const {
    return std::any_of(y.begin(), y.end(), [](double v) { return std::isfinite(v); });
  }
};

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

// Long runs: at most about `buckets` x-buckets, each keeping its first, lowest,
// highest and last point, so spikes survive and the page stays small.
Series thin(const Series& s, size_t buckets) {
  if (s.x.size() <= 4 * buckets) return s;
  const double x0 = s.x.front(), span = std::max(s.x.back() - x0, 1.0);
  Series out;
  size_t i = 0;
  while (i < s.x.size()) {
    const size_t b = static_cast<size_t>((s.x[i] - x0) / span * (buckets - 1));
    size_t j = i, lo = i, hi = i;
    bool gap = false;
    while (j < s.x.size() && static_cast<size_t>((s.x[j] - x0) / span * (buckets - 1)) == b) {
      if (!std::isfinite(s.y[j])) gap = true;
      else {
        if (!std::isfinite(s.y[lo]) || s.y[j] < s.y[lo]) lo = j;
        if (!std::isfinite(s.y[hi]) || s.y[j] > s.y[hi]) hi = j;
      }
      ++j;
    }
    std::set<size_t> keep = {i, lo, hi, j - 1};
    for (size_t k : keep) out.x.push_back(s.x[k]), out.y.push_back(s.y[k]);
    if (gap) out.x.push_back(s.x[j - 1]), out.y.push_back(kNaN);
    i = j;
  }
  return out;
}

bool same_values(const Series& a, const Series& b) {
  if (a.x != b.x) return false;
  for (size_t k = 0; k < a.y.size(); ++k) {
    const bool fa = std::isfinite(a.y[k]), fb = std::isfinite(b.y[k]);
    if (fa != fb) return false;
    if (fa && std::abs(a.y[k] - b.y[k]) > 1e-9 * std::max(std::abs(a.y[k]), std::abs(b.y[k]))) return false;
  }
  return true;
}

constexpr double kW = 720, kPlotH = 300;
constexpr double kLeft = 78, kRight = 24, kBottom = 58;
constexpr double kLegendFont = 16, kTickFont = 15;  // as the page's CSS sets them

// Rough width of text in the plots' sans-serif font.
double text_width(const std::string& s, double font) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;  // UTF-8 code points
  return static_cast<double>(chars) * font * 0.58;
}

std::string c1(double v) { return fixed(v, 1); }

std::string render_plot(const Metric& m, const std::vector<RunData>& runs, const std::vector<Series>& all) {
  // The legend: one entry per run, wrapped into rows above the plot area.
  struct Entry {
    double x, y;
    std::string text;
    size_t run;
  };
  std::vector<Entry> legend;
  double lx = kLeft, ly = 20;
  // A run whose values equal an earlier run's would hide it: it is drawn dashed over
  // it, and the legend says so.
  std::vector<int> same_as(runs.size(), -1);
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = 0; j < i && same_as[i] < 0; ++j)
      if (all[i].any() && same_values(all[i], all[j])) same_as[i] = static_cast<int>(j);
  auto dash = [&](size_t i) -> std::string {
    return *dashes(i) ? dashes(i) : same_as[i] >= 0 ? "8 7" : "";
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string text = runs[i].label + (all[i].any() ? "" : " (not recorded)");
    if (same_as[i] >= 0) text += " — same as " + runs[same_as[i]].label;
    const double w = 30 + text_width(text, kLegendFont) + 22;
    if (lx > kLeft && lx + w > kW - kRight) lx = kLeft, ly += 25;
    legend.push_back({lx, ly, text, i});
    lx += w;
  }
  // The plot area has the same height whatever the legend takes above it.
  const double top = ly + 22, bottom = top + kPlotH;
  const double height = bottom + kBottom;

  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const Series& s : all)
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!std::isfinite(s.y[k])) continue;
      xmin = std::min(xmin, s.x[k]), xmax = std::max(xmax, s.x[k]);
      ymin = std::min(ymin, s.y[k]), ymax = std::max(ymax, s.y[k]);
    }
  Ticks xt = nice_ticks(xmin, xmax, 6, true);
  if (xt.step < 1) {  // steps are whole numbers
    xt = nice_ticks(xmin, std::max(xmax, xmin + 1), 1, true);
  }
  const Ticks yt = nice_ticks(ymin, ymax, 5, m.from_zero);
  const AxisFormat xf = axis_format(xt), yf = axis_format(yt);
  const double x0 = kLeft, x1 = kW - kRight;
  auto px = [&](double v) { return x0 + (v - xt.lo) / (xt.hi - xt.lo) * (x1 - x0); };
  auto py = [&](double v) { return bottom - (v - yt.lo) / (yt.hi - yt.lo) * (bottom - top); };

  std::ostringstream o;
  o << "<svg class=\"chart\" data-metric=\"" << m.id << "\" viewBox=\"0 0 " << kW << " " << height
    << "\" role=\"img\" aria-label=\"" << esc(m.title) << " over steps\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  // Gridlines and ticks.
  o << "<g class=\"grid\">";
  for (double v : yt.values) o << "<line x1=\"" << c1(x0) << "\" x2=\"" << c1(x1) << "\" y1=\"" << c1(py(v)) << "\" y2=\"" << c1(py(v)) << "\"/>";
  for (double v : xt.values) o << "<line y1=\"" << c1(top) << "\" y2=\"" << c1(bottom) << "\" x1=\"" << c1(px(v)) << "\" x2=\"" << c1(px(v)) << "\"/>";
  o << "</g>\n<g class=\"axis\"><line x1=\"" << c1(x0) << "\" x2=\"" << c1(x1) << "\" y1=\"" << c1(bottom) << "\" y2=\""
    << c1(bottom) << "\"/><line x1=\"" << c1(x0) << "\" x2=\"" << c1(x0) << "\" y1=\"" << c1(top) << "\" y2=\""
    << c1(bottom) << "\"/></g>\n";
  o << "<g class=\"ticks\">";
  for (double v : yt.values)
    o << "<text x=\"" << c1(x0 - 8) << "\" y=\"" << c1(py(v) + kTickFont * 0.35) << "\" text-anchor=\"end\">"
      << esc(yf.label(v)) << "</text>";
  for (double v : xt.values)
    o << "<text x=\"" << c1(px(v)) << "\" y=\"" << c1(bottom + 22) << "\" text-anchor=\"middle\">" << esc(xf.label(v))
      << "</text>";
  o << "</g>\n";
  std::string ylabel = m.axis;
  if (yf.exponent != 0) ylabel += " ×10" + superscript(yf.exponent);
  o << "<text class=\"axis-label\" x=\"" << c1((x0 + x1) / 2) << "\" y=\"" << c1(height - 12)
    << "\" text-anchor=\"middle\">step</text>\n";
  o << "<text class=\"axis-label\" transform=\"translate(18," << c1((top + bottom) / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">" << esc(ylabel) << "</text>\n";
  // One path per run (gaps start a new subpath); a point with no neighbour gets a dot.
  for (size_t i = 0; i < runs.size(); ++i) {
    const Series s = thin(all[i], 1000);
    std::string d;
    std::vector<std::pair<double, double>> dots;
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!std::isfinite(s.y[k])) continue;
      const bool prev = k > 0 && std::isfinite(s.y[k - 1]);
      const bool next = k + 1 < s.x.size() && std::isfinite(s.y[k + 1]);
      d += (prev ? "L" : (d.empty() ? "M" : " M")) + c1(px(s.x[k])) + "," + c1(py(s.y[k]));
      if (!prev && !next) dots.push_back({px(s.x[k]), py(s.y[k])});
    }
    if (d.empty()) continue;
    o << "<path class=\"series\" data-run=\"" << i << "\" stroke=\"" << colour(i) << "\"";
    if (!dash(i).empty()) o << " stroke-dasharray=\"" << dash(i) << "\"";
    o << " d=\"" << d << "\"><title>" << esc(runs[i].label) << "</title></path>\n";
    for (const auto& [x, y] : dots)
      o << "<circle class=\"dot\" cx=\"" << c1(x) << "\" cy=\"" << c1(y) << "\" r=\"3.5\" fill=\"" << colour(i)
        << "\"/>";
  }
  o << "<g class=\"legend\">";
  for (const Entry& e : legend) {
    o << "<line x1=\"" << c1(e.x) << "\" x2=\"" << c1(e.x + 26) << "\" y1=\"" << c1(e.y - 5) << "\" y2=\""
      << c1(e.y - 5) << "\" stroke=\"" << colour(e.run) << "\"";
    if (!dash(e.run).empty()) o << " stroke-dasharray=\"" << dash(e.run) << "\"";
    o << "/><text x=\"" << c1(e.x + 32) << "\" y=\"" << c1(e.y) << "\">" << esc(e.text) << "</text>";
  }
  o << "</g>\n</svg>\n";
  return o.str();
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
svg.chart { display: block; width: 100%; height: auto; font-family: inherit; }
svg .grid line { stroke: #e4e4ea; stroke-width: 1; }
svg .axis line { stroke: #8a8a96; stroke-width: 1.2; }
svg .ticks text { font-size: 15px; fill: #3c3c46; font-variant-numeric: tabular-nums; }
svg .axis-label { font-size: 16px; fill: #1b1b1f; }
svg .legend text { font-size: 16px; fill: #1b1b1f; }
svg .legend line { stroke-width: 4; }
svg path.series { fill: none; stroke-width: 2.5; stroke-linejoin: round; stroke-linecap: round; }
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
  o << "<article class=\"run\" id=\"run-" << i << "\" style=\"--c:" << colour(i) << "\">\n";
  o << "<h3><span class=\"swatch\"" << (*dashes(i) ? " style=\"border-top-style:dashed\"" : "") << "></span>"
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
  o << "<section class=\"profile\" id=\"profile-" << i << "\" style=\"--c:" << colour(i) << "\">\n";
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

// ---- public -------------------------------------------------------------------------

Ticks nice_ticks(double lo, double hi, int target, bool from_zero) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  const bool non_negative = lo >= 0;
  if (from_zero && non_negative) lo = 0;
  if (hi == lo) {
    const double d = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= d, hi += d;
    if (from_zero && non_negative) lo = 0;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  Ticks t;
  t.step = (f <= 1 + 1e-9 ? 1 : f <= 2 + 1e-9 ? 2 : f <= 5 + 1e-9 ? 5 : 10) * mag;
  t.lo = std::floor(lo / t.step + 1e-9) * t.step;
  t.hi = std::ceil(hi / t.step - 1e-9) * t.step;
  const long n = std::lround((t.hi - t.lo) / t.step);
  for (long i = 0; i <= n; ++i) {
    double v = t.lo + static_cast<double>(i) * t.step;
    if (std::abs(v) < t.step * 1e-9) v = 0;
    t.values.push_back(v);
  }
  return t;
}

RunData read_run(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) fail_config(dir, ": no such run directory");
  if (!fs::is_directory(st)) fail_config(dir, ": not a directory (a run directory holds config.toml and metrics.jsonl)");
  RunData r;
  r.dir = dir;
  r.name = dir_name(dir);
  const std::string base = (fs::path(dir) / "").string();
  for (const char* f : {"config.toml", "metrics.jsonl"})
    if (!fs::exists(base + f))
      fail_data(base, f, ": not found; a run directory (run.out_dir of `shardtrain train`) holds config.toml and "
                "metrics.jsonl");
  r.config = read_run_config(base + "config.toml", &r.model_note);
  read_metrics(r, base + "metrics.jsonl");
  if (fs::exists(base + "summary.json")) read_summary(r, base + "summary.json");
  if (fs::exists(base + "profile.json")) read_profile(r, base + "profile.json");
  find_world(r);
  r.label = r.name;
  return r;
}

void label_runs(std::vector<RunData>& runs, const std::vector<std::string>& labels) {
  if (!labels.empty()) {
    ST_CHECK_CONFIG(labels.size() == runs.size(), "--label given ", labels.size(), " time",
                    labels.size() == 1 ? "" : "s", " for ", runs.size(), " run", runs.size() == 1 ? "" : "s",
                    "; give one per run, in order");
    for (size_t i = 0; i < runs.size(); ++i) runs[i].label = labels[i];
    return;
  }
  // Names: the directory's, with its parent where two are the same, then a number.
  std::map<std::string, int> count;
  for (RunData& r : runs) ++count[r.name];
  for (RunData& r : runs) {
    r.label = r.name;
    if (count[r.name] > 1) {
      const fs::path p = fs::path(r.dir).lexically_normal();
      fs::path parent = (p.filename().empty() ? p.parent_path() : p).parent_path();
      if (!parent.filename().empty() && parent.filename() != "." && parent.filename() != "..")
        r.label = parent.filename().string() + "/" + r.name;
    }
  }
  std::map<std::string, int> seen, total;
  for (RunData& r : runs) ++total[r.label];
  for (RunData& r : runs)
    if (total[r.label] > 1) r.label += " #" + std::to_string(++seen[r.label]);

  // What differs between the runs.
  const std::vector<std::function<std::string(const RunData&)>> attrs = {
      [](const RunData& r) { return tag("mb", r.config.train.micro_batch); },
      [](const RunData& r) { return tag("ga", r.config.train.grad_accum); },
      [](const RunData& r) { return tag("T", r.config.train.seq_len); },
      [](const RunData& r) { return r.world > 0 ? tag("w", r.world) : std::string(); },
      [](const RunData& r) { return transport_of(r); },
      [](const RunData& r) { return r.config.train.device; },
  };
  std::vector<std::vector<std::string>> extra(runs.size());
  for (const auto& attr : attrs) {
    std::set<std::string> values;
    for (const RunData& r : runs) values.insert(attr(r));
    if (values.size() < 2) continue;
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::string v = attr(runs[i]);
      if (!v.empty() && runs[i].name != v) extra[i].push_back(v);
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (extra[i].empty()) continue;
    std::string e;
    for (const std::string& s : extra[i]) e += (e.empty() ? "" : ", ") + s;
    runs[i].label += " (" + e + ")";
  }
}

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
    << esc(title) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n";
  o << "<header><h1>" << esc(title) << "</h1>\n<p class=\"sub\">" << runs.size() << " run"
    << (runs.size() == 1 ? "" : "s") << "; every plot is over optimizer steps, one line per run</p></header>\n";

  o << "<h2>Runs</h2>\n<section class=\"runs\">\n";
  for (size_t i = 0; i < runs.size(); ++i) o << run_card(runs[i], i);
  o << "</section>\n";

  o << "<h2>Metrics</h2>\n<section class=\"plots\">\n";
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
      << render_plot(m, runs, all) << "</figure>\n";
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
