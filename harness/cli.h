// A small command-line parser: --key value, --key=value and --flag. Unknown options are errors.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace fa {

class CliArgs {
 public:
  // `flags` take no value; `options` take one. Throws std::invalid_argument on anything else.
  CliArgs(const std::vector<std::string>& args, const std::set<std::string>& flags,
          const std::set<std::string>& options);

  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_double(const std::string& name, double fallback) const;
  // Comma-separated integers, e.g. "--steps 0,3,7".
  std::vector<int64_t> get_int_list(const std::string& name, const std::vector<int64_t>& fallback) const;

 private:
  std::set<std::string> flags_;
  std::map<std::string, std::string> values_;
};

}  // namespace fa
