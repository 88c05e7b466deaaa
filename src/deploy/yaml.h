// YAML in and out for the manifests, through yaml-cpp. Documents are built as
// nlohmann::ordered_json (so keys keep the order they were written in) and emitted
// as block YAML; a string that YAML would read as something else ("true", "4",
// "0.5", "null", "") is double-quoted, as Kubernetes wants strings to stay strings.
// Reading back keeps quoted scalars strings and resolves plain ones to null, bool,
// integer or float (YAML 1.2 core schema), so `num-gpus: 4` and `num-gpus: "4"`
// differ as they do for the API server.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace st {

using ojson = nlohmann::ordered_json;

std::string to_yaml(const ojson& doc);
// Several documents, each started by "---".
std::string to_yaml_stream(const std::vector<ojson>& docs);

// Every document of a YAML stream as JSON. st::Error (naming `what` and the line)
// on a syntax error.
std::vector<nlohmann::json> yaml_documents(const std::string& text, const std::string& what);

}  // namespace st
