// The metrics the report plots, in page order: which step-record key each reads, how
// it is scaled and labelled. The run reader checks these keys are numbers; the page
// draws one plot per row.
#pragma once
#include <string>
#include <vector>

namespace st {

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

const std::vector<Metric>& metrics();

}  // namespace st
