// Uses the installed headers and library; exits non-zero if anything disagrees.
#include <torchbridge/torchbridge.h>

#include <cstring>
#include <iostream>

int main() {
  if (std::strcmp(torchbridge::library_version(), TORCHBRIDGE_VERSION_STRING) != 0) {
    std::cerr << "header/library version mismatch\n";
    return 1;
  }
  auto cpu = torchbridge::create_backend("cpu");
  const auto info = cpu->info(0);
  if (cpu->device_count() != 1 || !info.cpu || info.cpu->logical_cores < 1) {
    std::cerr << "unexpected cpu backend description\n";
    return 1;
  }
  std::cout << "consumer ok: torchbridge " << torchbridge::library_version() << ", best backend "
            << torchbridge::detect_best_backend() << ", " << info.cpu->logical_cores << " logical cores\n";
  return 0;
}
