// One rank of a torchrun job (CTest distributed.torchrun_*): joins the group from torchrun's
// environment, runs each collective with values that depend on the rank, checks the results
// against what every rank must get, and exits non-zero naming the first disagreement.
#include <torchbridge/distributed/process_group.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + " disagrees with the expected value");
}

}  // namespace

int main() {
  using torchbridge::distributed::init;
  try {
    torchbridge::distributed::InitOptions options;
    options.timeout = std::chrono::seconds(60);
    const auto group = init(options);
    const int rank = group->rank(), world = group->world_size();
    expect(group->environment().launched, "launched by torchrun");

    at::Tensor sum = at::full({5}, static_cast<double>(rank + 1), at::kDouble);
    group->all_reduce_sum(sum);
    expect(at::all(sum == world * (world + 1) / 2.0).item<bool>(), "all_reduce_sum");

    const int root = world - 1;
    at::Tensor sent = at::full({3}, rank == root ? 42 : -1, at::kLong);
    group->broadcast(sent, root);
    expect(at::all(sent == 42).item<bool>(), "broadcast");

    const auto parts = group->all_gather(at::full({2}, static_cast<float>(rank)));
    expect(static_cast<int>(parts.size()) == world, "all_gather's count");
    for (int r = 0; r < world; ++r) expect(at::all(parts[r] == static_cast<float>(r)).item<bool>(), "all_gather");

    group->barrier();
    std::printf("rank %d of %d (local %d of %d): all_reduce, broadcast, all_gather, barrier agree\n", rank, world,
                group->environment().local_rank, group->environment().local_world_size);
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "distributed_worker: %s\n", e.msg().c_str());  // without the C++ backtrace
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_worker: %s\n", e.what());
    return 1;
  }
}
