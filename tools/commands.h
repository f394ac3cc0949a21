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

// Returns false (after printing why to stderr) when no GPU can be used.
bool require_gpu(const char* command);

}  // namespace fa::tools
