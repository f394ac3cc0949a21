// Subcommands of the fa2 tool.
#pragma once

#include <string>
#include <vector>

namespace fa::tools {

int cmd_list(const std::vector<std::string>& args);
int cmd_run(const std::vector<std::string>& args);
int cmd_configs(const std::vector<std::string>& args);
int cmd_ladder(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_decode(const std::vector<std::string>& args);

// The commit the rows are stamped with (FA_COMMIT in the environment, else the build's).
std::string commit_id();
// One CSV field: quoted when it holds a comma or a quote.
std::string csv_field(const std::string& v);
// A number with 9 significant digits, as the CSVs hold them.
std::string num(double v);

// Returns false (after printing why to stderr) when no GPU can be used.
bool require_gpu(const char* command);

}  // namespace fa::tools
