// Static checks of compiled kernels, read from the object file with cuobjdump (no GPU needed).
//   fa_sass_check --object=<file.o> --cuobjdump=<path> [--require=HMMA ...] [--forbid=LDGSTS ...]
//                 [--kernel=<regex>] [--min-count=HMMA:64 ...] [--max-count=WARPGROUP.ARRIVE:2 ...]
//                 [--hmma-per-kv-tile=<BLOCK_N>] [--arch=<regex>]
// Tests: the object holds kernels; no kernel uses local memory (no spills, no stack arrays:
// LDL/STL in SASS, LOCAL/STACK in the resource report); every --require'd instruction appears in
// the kernels matching --kernel, for every architecture in the object; every --min-count'ed
// instruction appears at least that many times in EACH kernel matching --kernel (e.g. a kernel
// that does both Q·Kᵀ and P·V on tensor cores has at least twice the HMMAs of one of them); no
// instruction named by --forbid appears in a kernel matching --kernel (a step that has not
// taught cp.async yet must not use it: the lesson that adds it is then the diff that adds it);
// every --max-count'ed instruction appears at most that many times in each kernel matching
// --kernel (a wgmma kernel has one WARPGROUP.ARRIVE per group of wgmmas it issues: more means the
// compiler serialised the wgmmas, waiting after each one).
// --arch: the instruction rules apply only to the kernels of the architectures matching it (e.g.
// sm_90 for an instruction that exists only there); the local-memory check covers every kernel.
// --hmma-per-kv-tile: each kernel matching --kernel has at least the HMMAs one K/V tile needs with
// both matmuls on tensor cores, 2·(D/16)·(BLOCK_N/8) for one warp's 16 rows (Q·Kᵀ: D/16 k-steps
// × BLOCK_N/8 key fragments; P·V: BLOCK_N/16 k-steps × D/8 dim fragments, the same number). D
// and BLOCK_N are read from the kernel's template arguments, attention_kernel<D, Config<BLOCK_M,
// BLOCK_N, ...>>; a kernel whose name carries no Config uses the BLOCK_N given to the option.
// P·V on CUDA cores leaves only Q·Kᵀ's half, at every head dim. --hmma-per-kv-tile=BLOCK_N:T
// multiplies the count by T, for kernels whose warps own T row tiles of 16 (each K/V fragment then
// feeds T times the mmas).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Options {
  std::vector<std::string> objects;
  std::string cuobjdump = "cuobjdump";
  std::vector<std::string> require;
  std::vector<std::string> forbid;
  std::vector<std::pair<std::string, int>> min_count;
  std::vector<std::pair<std::string, int>> max_count;
  std::string kernel = ".*";
  std::string arch = ".*";  // --arch: a regex over the architecture, sm_80, sm_90, sm_90a
  int hmma_block_n = 0;     // --hmma-per-kv-tile: the BLOCK_N of kernels without a Config (0: rule off)
  int hmma_row_tiles = 1;   // ... and the 16-row mma tiles each warp owns (step 09 on: 2)
} g_opt;

struct Kernel {
  std::string arch, name, sass;
};

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  *status = pclose(f);
  return out;
}

std::vector<Kernel> dump_sass(const std::string& object) {
  int st = 0;
  std::string text = run("'" + g_opt.cuobjdump + "' -sass '" + object + "'", &st);
  if (st != 0) throw std::runtime_error("cuobjdump -sass failed (" + std::to_string(st) + "): " + text.substr(0, 400));
  std::vector<Kernel> kernels;
  std::string arch;
  std::istringstream in(text);
  std::string line;
  static const std::regex arch_re(R"(arch = (sm_\d+a?))"), fn_re(R"(Function : (\S+))");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, arch_re))
      arch = m[1];
    else if (std::regex_search(line, m, fn_re))
      kernels.push_back({arch, m[1], ""});
    else if (!kernels.empty())
      kernels.back().sass += line + "\n";
  }
  return kernels;
}

// Every kernel of every --object, disassembled once per process and shared by the tests.
const std::vector<Kernel>& all_kernels() {
  static const std::vector<Kernel> all = [] {
    std::vector<Kernel> v;
    for (const auto& o : g_opt.objects) {
      auto k = dump_sass(o);
      v.insert(v.end(), k.begin(), k.end());
    }
    return v;
  }();
  return all;
}

// The opcode-position pattern of `mnemonic`, compiled once: "/*0a30*/   HMMA.16816.F32.BF16 R4, ..."
// matches HMMA as a word.
const std::regex& instruction_regex(const std::string& mnemonic) {
  static std::map<std::string, std::regex> compiled;
  auto it = compiled.find(mnemonic);
  if (it == compiled.end())
    it = compiled.emplace(mnemonic, std::regex("\\*/\\s+(@!?U?P\\w+\\s+)?" + mnemonic + "(\\.|\\s)")).first;
  return it->second;
}

bool has_instruction(const std::string& sass, const std::string& mnemonic) {
  return std::regex_search(sass, instruction_regex(mnemonic));
}

int count_instruction(const std::string& sass, const std::string& mnemonic) {
  const std::regex& re = instruction_regex(mnemonic);
  return int(std::distance(std::sregex_iterator(sass.begin(), sass.end(), re), std::sregex_iterator()));
}

TEST(Sass, ObjectHoldsKernels) {
  ASSERT_FALSE(g_opt.objects.empty()) << "no --object given";
  const auto& kernels = all_kernels();
  EXPECT_FALSE(kernels.empty()) << "cuobjdump found no kernels";
  std::set<std::string> arches;
  for (auto& k : kernels) arches.insert(k.arch);
  for (auto& a : arches) std::cout << "  arch " << a << "\n";
}

TEST(Sass, NoLocalMemory) {
  for (const auto& k : all_kernels()) {
    EXPECT_FALSE(has_instruction(k.sass, "LDL") || has_instruction(k.sass, "STL"))
        << k.arch << " " << k.name << " uses local memory (register spill or a stack array)";
  }
  for (const auto& o : g_opt.objects) {
    int st = 0;
    std::string res = run("'" + g_opt.cuobjdump + "' -res-usage '" + o + "'", &st);
    ASSERT_EQ(st, 0) << res;
    std::regex re(R"(STACK:(\d+).*LOCAL:(\d+))");
    std::istringstream in(res);
    std::string line, fn;
    while (std::getline(in, line)) {
      if (line.find("Function") != std::string::npos) fn = line;
      std::smatch m;
      if (std::regex_search(line, m, re)) {
        EXPECT_EQ(std::stoi(m[1]), 0) << "stack frame in " << fn;
        EXPECT_EQ(std::stoi(m[2]), 0) << "local memory in " << fn;
      }
    }
  }
}

// The kernels the instruction rules apply to (--kernel, a regex over the mangled names, of the
// architectures matching --arch).
std::vector<const Kernel*> matching_kernels() {
  std::regex kernel_re(g_opt.kernel), arch_re(g_opt.arch);
  std::vector<const Kernel*> out;
  for (const auto& k : all_kernels())
    if (std::regex_search(k.name, kernel_re) && std::regex_match(k.arch, arch_re)) out.push_back(&k);
  return out;
}

TEST(Sass, RequiredInstructions) {
  if (g_opt.require.empty()) {
    std::cout << "  (no instruction requirements for this step)\n";
    return;
  }
  std::map<std::string, std::vector<const Kernel*>> by_arch;
  for (const Kernel* k : matching_kernels()) by_arch[k->arch].push_back(k);
  ASSERT_FALSE(by_arch.empty()) << "no kernel matches --kernel=" << g_opt.kernel << " --arch=" << g_opt.arch;
  for (const auto& [arch, ks] : by_arch) {
    for (const auto& ins : g_opt.require) {
      bool found = false;
      for (const Kernel* k : ks) found |= has_instruction(k->sass, ins);
      EXPECT_TRUE(found) << arch << ": no " << ins << " in the kernels matching '" << g_opt.kernel << "'";
    }
  }
}

TEST(Sass, ForbiddenInstructions) {
  if (g_opt.forbid.empty()) {
    std::cout << "  (no forbidden instructions for this step)\n";
    return;
  }
  const std::vector<const Kernel*> kernels = matching_kernels();
  ASSERT_FALSE(kernels.empty()) << "no kernel matches --kernel=" << g_opt.kernel << " --arch=" << g_opt.arch;
  for (const Kernel* k : kernels)
    for (const auto& ins : g_opt.forbid) {
      const int got = count_instruction(k->sass, ins);
      EXPECT_EQ(got, 0) << k->arch << " " << k->name << " has " << got << " " << ins
                        << ", which this step must not use";
    }
}

// --min-count and --max-count: each listed instruction's count in each kernel matching --kernel,
// against its bound.
void check_counts(const std::vector<std::pair<std::string, int>>& bounds, bool at_least) {
  if (bounds.empty()) {
    std::cout << (at_least ? "  (no instruction counts required for this step)\n"
                           : "  (no instruction count limits for this step)\n");
    return;
  }
  const std::vector<const Kernel*> kernels = matching_kernels();
  ASSERT_FALSE(kernels.empty()) << "no kernel matches --kernel=" << g_opt.kernel << " --arch=" << g_opt.arch;
  for (const Kernel* k : kernels)
    for (const auto& [ins, n] : bounds) {
      const int got = count_instruction(k->sass, ins);
      std::cout << "  " << k->arch << " " << k->name << ": " << got << " " << ins << "\n";
      if (at_least)
        EXPECT_GE(got, n) << k->arch << " " << k->name << " has " << got << " " << ins << ", expected at least " << n;
      else
        EXPECT_LE(got, n) << k->arch << " " << k->name << " has " << got << " " << ins << ", expected at most " << n;
    }
}

TEST(Sass, MinimumInstructionCounts) {
  check_counts(g_opt.min_count, true);
}
TEST(Sass, MaximumInstructionCounts) {
  check_counts(g_opt.max_count, false);
}

// 2·(D/16)·(BLOCK_N/8) from a mangled attention_kernel<D, Config<BLOCK_M, BLOCK_N, ...>> name;
// 0 if the name has no head dim.
int hmma_per_kv_tile(const std::string& name, int default_block_n);

// The 16-row mma tiles a warp owns: a Config's fourth integer where it has one (kernel 100's
// M_TILES; of the steps that take HMMA_PER_KV_TILE, none has a fourth), else the option's.
int row_tiles(const std::string& name, int default_row_tiles) {
  static const std::regex re(R"(ConfigILi\d+ELi\d+ELi\d+ELi(\d+)E)");
  std::smatch m;
  return std::regex_search(name, m, re) ? std::stoi(m[1]) : default_row_tiles;
}

int hmma_per_kv_tile(const std::string& name, int default_block_n) {
  static const std::regex dim_re(R"(attention_kernelILi(\d+)E)"), cfg_re(R"(ConfigILi\d+ELi(\d+)E)");
  std::smatch m;
  if (!std::regex_search(name, m, dim_re)) return 0;
  const int d = std::stoi(m[1]);
  const int block_n = std::regex_search(name, m, cfg_re) ? std::stoi(m[1]) : default_block_n;
  return 2 * (d / 16) * (block_n / 8);
}

TEST(Sass, HmmaPerKvTile) {
  if (g_opt.hmma_block_n == 0) {
    std::cout << "  (no per-tile HMMA count for this step)\n";
    return;
  }
  const std::vector<const Kernel*> kernels = matching_kernels();
  ASSERT_FALSE(kernels.empty()) << "no kernel matches --kernel=" << g_opt.kernel << " --arch=" << g_opt.arch;
  for (const Kernel* k : kernels) {
    const int need = hmma_per_kv_tile(k->name, g_opt.hmma_block_n) * row_tiles(k->name, g_opt.hmma_row_tiles);
    ASSERT_GT(need, 0) << k->name << ": no attention_kernel<HEAD_DIM, ...> in the name";
    const int got = count_instruction(k->sass, "HMMA");
    std::cout << "  " << k->arch << " " << k->name << ": " << got << " HMMA, one K/V tile needs " << need << "\n";
    EXPECT_GE(got, need) << k->arch << " " << k->name << " has " << got << " HMMA; one K/V tile with Q·Kᵀ and P·V on "
                         << "tensor cores needs " << need;
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* key) { return a.substr(std::string(key).size()); };
    if (a.rfind("--object=", 0) == 0)
      g_opt.objects.push_back(val("--object="));
    else if (a.rfind("--cuobjdump=", 0) == 0)
      g_opt.cuobjdump = val("--cuobjdump=");
    else if (a.rfind("--require=", 0) == 0)
      g_opt.require.push_back(val("--require="));
    else if (a.rfind("--forbid=", 0) == 0)
      g_opt.forbid.push_back(val("--forbid="));
    else if (a.rfind("--kernel=", 0) == 0)
      g_opt.kernel = val("--kernel=");
    else if (a.rfind("--arch=", 0) == 0)
      g_opt.arch = val("--arch=");
    else if (a.rfind("--hmma-per-kv-tile=", 0) == 0) {  // BLOCK_N[:ROW_TILES]
      const std::string spec = val("--hmma-per-kv-tile=");
      const size_t colon = spec.find(':');
      g_opt.hmma_block_n = std::stoi(spec.substr(0, colon));
      if (colon != std::string::npos) g_opt.hmma_row_tiles = std::stoi(spec.substr(colon + 1));
    } else if (a.rfind("--min-count=", 0) == 0 || a.rfind("--max-count=", 0) == 0) {
      const bool min = a.rfind("--min-count=", 0) == 0;
      const std::string spec = val("--min-count=");  // both prefixes are 12 characters long
      const size_t colon = spec.find(':');
      if (colon == std::string::npos) {
        std::fprintf(stderr, "fa_sass_check: %s wants INSTRUCTION:N, got %s\n", min ? "--min-count" : "--max-count",
                     spec.c_str());
        return 2;
      }
      (min ? g_opt.min_count : g_opt.max_count).emplace_back(spec.substr(0, colon), std::stoi(spec.substr(colon + 1)));
    } else {
      std::fprintf(stderr, "fa_sass_check: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  // An --arch the build has no code for (sm_90 rules in a build for sm_80 alone): nothing to check,
  // which ctest reports as skipped (exit code 77), never as passed.
  // An object with no kernels at all is not this case: its tests run, and fail.
  if (g_opt.arch != ".*" && !g_opt.objects.empty() && !all_kernels().empty()) {
    const std::regex arch_re(g_opt.arch);
    bool any = false;
    for (const auto& k : all_kernels()) any |= std::regex_match(k.arch, arch_re);
    if (!any) {
      std::printf("fa_sass_check: this build has no code for --arch=%s; the rules on it are not checked\n",
                  g_opt.arch.c_str());
      return 77;
    }
  }
  return RUN_ALL_TESTS();
}
