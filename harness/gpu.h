// Is there a usable GPU? Tests skip, and the CLI refuses, with the reason this returns.
#pragma once

#include <string>

namespace fa {

// True when a CUDA device can be used; otherwise false and `why` says what is missing.
bool gpu_available(std::string* why = nullptr);
// "NVIDIA H200, sm_90, 132 SMs, SM clock 1980 MHz" (empty when there is no GPU).
std::string gpu_description();
std::string gpu_name();
int gpu_sm_clock_mhz();

}  // namespace fa
