#include "report/run_data.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "core/json_file.h"
#include "fabric/nccl_log.h"
#include "report/plot_metrics.h"

namespace st {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

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


}  // namespace

long long tokens_per_rank_step(const RunConfig& c) {
  return static_cast<long long>(c.train.micro_batch) * c.train.seq_len * c.train.grad_accum;
}

std::string backend_of(const RunData& r) {
  if (r.summary && r.summary->backend) return *r.summary->backend;
  return r.config.train.device;
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

}  // namespace st
