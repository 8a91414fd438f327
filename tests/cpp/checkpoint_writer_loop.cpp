// Helper for the crash-safety tests.
//   checkpoint_writer_loop FILE: rewrites one checkpoint forever, each version internally
//     consistent (every element of "x" equals the "version" metadata), until it is killed.
//   checkpoint_writer_loop --sharded DIR VERSION: saves six tensors, every element
//     VERSION, one shard each, into DIR once (killed on the way by the test's rename shim).
#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/checkpoint/safetensors.h>

#include <ATen/ops/full.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--sharded") {
    const float version = std::stof(argv[3]);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (int i = 0; i < 6; ++i) tensors.emplace_back("t" + std::to_string(i), at::full({256}, version));
    torchbridge::checkpoint::save_sharded(argv[2], tensors, /*max_shard_bytes=*/1024);
    return 0;
  }
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
