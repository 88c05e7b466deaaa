// Validates documents against the published JSON Schemas in ../shared/deploy/schemas
// (Kubernetes core kinds, KubeRay, PyTorchJob, eksctl) with valijson. Strict as the
// API server is with fieldValidation=Strict: an object schema with properties, no
// additionalProperties and no x-kubernetes-preserve-unknown-fields rejects unknown
// fields (the core and eksctl schemas are strict already; the CRDs are made so).
#pragma once
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

namespace st::testing {

inline std::filesystem::path shared_deploy_dir() { return std::filesystem::path(SHARDTRAIN_SHARED_DIR) / "deploy"; }
inline bool have_shared_deploy() { return std::filesystem::exists(shared_deploy_dir() / "schemas" / "index.json"); }

inline void make_strict(nlohmann::json& s) {
  if (s.is_object()) {
    if (s.contains("properties") && !s.contains("additionalProperties") &&
        !s.value("x-kubernetes-preserve-unknown-fields", false))
      s["additionalProperties"] = false;
    for (auto& [k, v] : s.items()) make_strict(v);
  } else if (s.is_array()) {
    for (auto& v : s) make_strict(v);
  }
}

class SchemaSet {
 public:
  // "" when the document is valid, else every error valijson reports, one per line.
  std::string validate(const nlohmann::json& doc) {
    const std::string key = doc.value("apiVersion", "?") + "/" + doc.value("kind", "?");
    valijson::Schema& schema = load(key);
    valijson::Validator v(valijson::Validator::kStrongTypes);
    valijson::ValidationResults results;
    valijson::adapters::NlohmannJsonAdapter target(doc);
    if (v.validate(schema, target, &results)) return "";
    std::string out;
    valijson::ValidationResults::Error e;
    while (results.popError(e)) {
      std::string path;
      for (const std::string& c : e.context) path += c;
      out += key + " " + path + ": " + e.description + "\n";
    }
    return out.empty() ? key + ": invalid" : out;
  }

 private:
  valijson::Schema& load(const std::string& key) {
    auto it = schemas_.find(key);
    if (it != schemas_.end()) return *it->second;
    const auto dir = shared_deploy_dir() / "schemas";
    nlohmann::json index;
    std::ifstream(dir / "index.json") >> index;
    if (!index["schemas"].contains(key)) throw std::runtime_error("no schema for " + key);
    nlohmann::json raw;
    std::ifstream(dir / index["schemas"][key]["file"].get<std::string>()) >> raw;
    make_strict(raw);
    raws_[key] = std::make_unique<nlohmann::json>(std::move(raw));
    auto schema = std::make_unique<valijson::Schema>();
    valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
    valijson::adapters::NlohmannJsonAdapter adapter(*raws_[key]);
    parser.populateSchema(adapter, *schema);
    return *(schemas_[key] = std::move(schema));
  }
  std::map<std::string, std::unique_ptr<nlohmann::json>> raws_;
  std::map<std::string, std::unique_ptr<valijson::Schema>> schemas_;
};

}  // namespace st::testing
