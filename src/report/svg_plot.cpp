#include "report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "report/text.h"

namespace st {
namespace {
using namespace report_text;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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

}  // namespace

bool Series::any() const {
  return std::any_of(y.begin(), y.end(), [](double v) { return std::isfinite(v); });
}

// ---- colours ------------------------------------------------------------------------

const char* plot_css() {
  return R"css(
svg.chart { display: block; width: 100%; height: auto; font-family: inherit; }
svg .grid line { stroke: #e4e4ea; stroke-width: 1; }
svg .axis line { stroke: #8a8a96; stroke-width: 1.2; }
svg .ticks text { font-size: 15px; fill: #3c3c46; font-variant-numeric: tabular-nums; }
svg .axis-label { font-size: 16px; fill: #1b1b1f; }
svg .legend text { font-size: 16px; fill: #1b1b1f; }
svg .legend line { stroke-width: 4; }
svg path.series { fill: none; stroke-width: 2.5; stroke-linejoin: round; stroke-linecap: round; }
)css";
}

// Okabe & Ito's colour-blind-safe palette (yellow left out: too faint on white); past
// seven runs the colours repeat with dashes.
const char* series_colour(size_t i) {
  static const char* c[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"};
  return c[i % 7];
}
const char* series_dashes(size_t i) {
  static const char* d[] = {"", "9 5", "2 4"};
  return d[(i / 7) % 3];
}

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

std::string render_plot(const PlotSpec& spec, const std::vector<std::string>& labels, const std::vector<Series>& all) {
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
  std::vector<int> same_as(labels.size(), -1);
  for (size_t i = 0; i < labels.size(); ++i)
    for (size_t j = 0; j < i && same_as[i] < 0; ++j)
      if (all[i].any() && same_values(all[i], all[j])) same_as[i] = static_cast<int>(j);
  auto dash = [&](size_t i) -> std::string {
    if (!all[i].dashes.empty()) return all[i].dashes;
    return *series_dashes(i) ? series_dashes(i) : same_as[i] >= 0 ? "8 7" : "";
  };
  auto colour = [&](size_t i) -> std::string { return all[i].colour.empty() ? series_colour(i) : all[i].colour; };
  for (size_t i = 0; i < labels.size(); ++i) {
    std::string text = labels[i] + (all[i].any() ? "" : " (not recorded)");
    if (same_as[i] >= 0) text += " — same as " + labels[same_as[i]];
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
  if (spec.whole_x && xt.step < 1) {  // e.g. steps are whole numbers
    xt = nice_ticks(xmin, std::max(xmax, xmin + 1), 1, true);
  }
  const Ticks yt = nice_ticks(ymin, ymax, 5, spec.from_zero);
  const AxisFormat xf = axis_format(xt), yf = axis_format(yt);
  const double x0 = kLeft, x1 = kW - kRight;
  auto px = [&](double v) { return x0 + (v - xt.lo) / (xt.hi - xt.lo) * (x1 - x0); };
  auto py = [&](double v) { return bottom - (v - yt.lo) / (yt.hi - yt.lo) * (bottom - top); };

  std::ostringstream o;
  o << "<svg class=\"chart\" data-metric=\"" << spec.id << "\" viewBox=\"0 0 " << kW << " " << height
    << "\" role=\"img\" aria-label=\"" << esc(spec.title) << " over " << esc(spec.x_name) << "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
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
  std::string ylabel = spec.y_label;
  if (yf.exponent != 0) ylabel += " ×10" + superscript(yf.exponent);
  o << "<text class=\"axis-label\" x=\"" << c1((x0 + x1) / 2) << "\" y=\"" << c1(height - 12)
    << "\" text-anchor=\"middle\">" << esc(spec.x_label) << "</text>\n";
  o << "<text class=\"axis-label\" transform=\"translate(18," << c1((top + bottom) / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">" << esc(ylabel) << "</text>\n";
  // One path per run (gaps start a new subpath); a point with no neighbour gets a dot.
  for (size_t i = 0; i < labels.size(); ++i) {
    Series s = thin(all[i], 1000);
    s.dots = all[i].dots;
    std::string d;
    std::vector<std::pair<double, double>> dots;
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!std::isfinite(s.y[k])) continue;
      const bool prev = k > 0 && std::isfinite(s.y[k - 1]);
      const bool next = k + 1 < s.x.size() && std::isfinite(s.y[k + 1]);
      d += (prev ? "L" : (d.empty() ? "M" : " M")) + c1(px(s.x[k])) + "," + c1(py(s.y[k]));
      if (s.dots || (!prev && !next)) dots.push_back({px(s.x[k]), py(s.y[k])});
    }
    if (d.empty()) continue;
    o << "<path class=\"series\" data-run=\"" << i << "\" stroke=\"" << colour(i) << "\"";
    if (!dash(i).empty()) o << " stroke-dasharray=\"" << dash(i) << "\"";
    o << " d=\"" << d << "\"><title>" << esc(labels[i]) << "</title></path>\n";
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

}  // namespace st
