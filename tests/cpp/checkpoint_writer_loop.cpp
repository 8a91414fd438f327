// Helper for the crash-safety test: rewrites one checkpoint forever, each version internally
// consistent (every element of "x" equals the "version" metadata), until it is killed.
#include <torchbridge/checkpoint/safetensors.h>

#include <ATen/ops/full.h>

#include <cstdio>
#include <string>
#include <utility>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  for (int version = 1;; ++version) {
    torchbridge::checkpoint::save(argv[1], {{"x", at::full({1 << 20}, float(version))}},
                                  {{"version", std::to_string(version)}});
    if (version == 1) {
      std::printf("ready\n");  // the parent's kill clock starts once writes are under way
      std::fflush(stdout);
    }
  }
}
