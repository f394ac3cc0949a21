#include "harness/cli.h"

#include <sstream>

namespace fa {

CliArgs::CliArgs(const std::vector<std::string>& args, const std::set<std::string>& flags,
                 const std::set<std::string>& options) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + a + "'");
    std::string key = a.substr(2), value;
    bool has_value = false;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_value = true;
    }
    if (flags.count(key)) {
      if (has_value) throw std::invalid_argument("--" + key + " takes no value");
      flags_.insert(key);
    } else if (options.count(key)) {
      if (!has_value) {
        if (i + 1 >= args.size()) throw std::invalid_argument("--" + key + " needs a value");
        value = args[++i];
      }
      values_[key] = value;
    } else {
      throw std::invalid_argument("unknown option --" + key);
    }
  }
}

std::string CliArgs::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t CliArgs::get_int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != it->second.size() || it->second.empty())
    throw std::invalid_argument("--" + name + " expects an integer, got '" + it->second + "'");
  return v;
}

double CliArgs::get_double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != it->second.size() || it->second.empty())
    throw std::invalid_argument("--" + name + " expects a number, got '" + it->second + "'");
  return v;
}

std::vector<int64_t> CliArgs::get_int_list(const std::string& name, const std::vector<int64_t>& fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::vector<int64_t> out;
  std::stringstream ss(it->second);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw std::invalid_argument("--" + name + " expects comma-separated integers, got '" + it->second + "'");
    out.push_back(v);
  }
  return out;
}

}  // namespace fa
