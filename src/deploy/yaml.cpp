#include "deploy/yaml.h"

#include <regex>
#include <yaml-cpp/yaml.h>

#include "core/error.h"

namespace st {
namespace {

// Plain scalars that YAML 1.1 or 1.2 would not read as a string.
bool needs_quotes(const std::string& s) {
  static const std::regex special(
      "|~|null|Null|NULL|true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|y|Y|n|N|"
      "[-+]?[0-9][0-9_]*|0x[0-9a-fA-F_]+|0o[0-7_]+|[-+]?([0-9][0-9_]*)?\\.[0-9_]*([eE][-+]?[0-9]+)?|"
      "[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)|[0-9]+(:[0-5]?[0-9])+");
  return std::regex_match(s, special);
}

void emit(YAML::Emitter& out, const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::object:
      if (v.empty()) {  // "{}" on the key's line
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        break;
      }
      out << YAML::BeginMap;
      for (const auto& [k, x] : v.items()) {
        out << YAML::Key;
        if (needs_quotes(k)) out << YAML::DoubleQuoted;
        out << k << YAML::Value;
        emit(out, x);
      }
      out << YAML::EndMap;
      break;
    case ojson::value_t::array:
      if (v.empty()) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        break;
      }
      out << YAML::BeginSeq;
      for (const auto& x : v) emit(out, x);
      out << YAML::EndSeq;
      break;
    case ojson::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      if (s.find('\n') != std::string::npos)
        out << YAML::Literal << s;
      else if (needs_quotes(s))
        out << YAML::DoubleQuoted << s;
      else
        out << s;
      break;
    }
    case ojson::value_t::boolean: out << v.get<bool>(); break;
    case ojson::value_t::number_integer: out << v.get<long long>(); break;
    case ojson::value_t::number_unsigned: out << v.get<unsigned long long>(); break;
    case ojson::value_t::number_float: out << v.get<double>(); break;
    default: out << YAML::Null; break;
  }
}

nlohmann::json to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = to_json(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& x : n) a.push_back(to_json(x));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted: a string, whatever it looks like
      static const std::regex int_re("[-+]?[0-9]+"), float_re("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
      if (s == "null" || s == "Null" || s == "NULL" || s == "~" || s.empty()) return nullptr;
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (std::regex_match(s, int_re)) {
        try {
          return std::stoll(s);
        } catch (...) {
          return s;
        }
      }
      if (std::regex_match(s, float_re)) return std::stod(s);
      return s;
    }
    default: return nullptr;
  }
}

}  // namespace

std::string to_yaml(const ojson& doc) {
  YAML::Emitter out;
  out.SetIndent(2);
  out.SetSeqFormat(YAML::Block);
  out.SetMapFormat(YAML::Block);
  emit(out, doc);
  ST_CHECK(out.good(), "yaml: ", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

std::string to_yaml_stream(const std::vector<ojson>& docs) {
  std::string s;
  for (const ojson& d : docs) s += "---\n" + to_yaml(d);
  return s;
}

std::vector<nlohmann::json> yaml_documents(const std::string& text, const std::string& what) {
  std::vector<nlohmann::json> out;
  try {
    for (const YAML::Node& n : YAML::LoadAll(text))
      if (!n.IsNull()) out.push_back(to_json(n));
  } catch (const YAML::Exception& e) {
    fail(what, ":", e.mark.line + 1, ": YAML error: ", e.msg);
  }
  return out;
}

}  // namespace st
