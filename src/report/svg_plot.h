// An SVG line plot: one line per series over a shared x axis, a legend that wraps
// above the plot area, axes at 1-2-5 ticks with SI or power-of-ten labels, and gaps
// where a series has no value. Inline SVG for the report's page (no script, nothing
// fetched); the report draws its metrics over steps with it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace st {

// Points of one line; y NaN (or any non-finite value) is a gap.
struct Series {
  std::vector<double> x, y;
  std::string colour, dashes;  // "" = by the series' index (series_colour, series_dashes)
  bool dots = false;           // a dot at every point, not only at lone ones
  bool any() const;  // some finite y
};

struct PlotSpec {
  std::string id;                  // the <svg>'s data-metric attribute
  std::string title;               // for the accessible label: "<title> over <x_name>"
  std::string y_label;             // beside the y axis
  std::string x_label = "step";    // under the x axis
  std::string x_name = "steps";
  bool from_zero = true;           // the y axis starts at 0 (when all values are >= 0)
  bool whole_x = true;             // x values are whole numbers: no ticks between them
};

// One <svg> with a line per series, labelled in the legend by `labels` (same size).
// A series equal to an earlier one is drawn dashed over it and the legend says so.
std::string render_plot(const PlotSpec& spec, const std::vector<std::string>& labels, const std::vector<Series>& all);

// Long series: at most about `buckets` x-buckets, each keeping its first, lowest,
// highest and last point, so spikes survive and the page stays small.
Series thin(const Series& s, size_t buckets);

// The CSS the plots need (the page's style sheet holds it; a standalone SVG file
// carries it in a <style> element).
const char* plot_css();

// The colour and dash pattern of series i (the page's run cards use the same).
const char* series_colour(size_t i);
const char* series_dashes(size_t i);

// Axis ticks at 1-2-5 steps: about `target` intervals covering [lo, hi], the range
// rounded out to whole steps (and down to 0 when from_zero and lo >= 0).
struct Ticks {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> values;  // lo, lo + step, ..., hi
};
Ticks nice_ticks(double lo, double hi, int target = 5, bool from_zero = false);

}  // namespace st
