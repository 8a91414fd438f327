#include "distributed/collective_backends.h"

#include <torchbridge/distributed/process_group.h>

#include <c10/util/Exception.h>

#include <string>

// USE_C10D_NCCL comes with a CUDA build of torch (torch_cuda's compile definitions);
// TORCHBRIDGE_NCCL_HEADERS when src/CMakeLists.txt found the nccl.h that ProcessGroupNCCL.hpp needs.
#if defined(USE_C10D_NCCL) && defined(TORCHBRIDGE_NCCL_HEADERS)
#include <ATen/Context.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define TORCHBRIDGE_HAS_NCCL 1
#else
#define TORCHBRIDGE_HAS_NCCL 0
#endif

namespace torchbridge::distributed {

std::string nccl_unavailable_reason() {
#if TORCHBRIDGE_HAS_NCCL
  if (!at::hasCUDA()) return "no CUDA device is usable in this process (torch.cuda.is_available() is false)";
  return "";
#elif defined(USE_C10D_NCCL)
  return "this torch has NCCL, but TorchBridge was built without NCCL's headers (nccl.h was not found: pip's "
         "nvidia-nccl package, or NCCL_INCLUDE_DIR); rebuild TorchBridge where nccl.h can be found";
#else
  return "this torch build has no NCCL (it was built without USE_C10D_NCCL, e.g. a CPU build)";
#endif
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout,
                                                    c10::Device device) {
  const std::string unavailable = nccl_unavailable_reason();
  TORCH_CHECK_VALUE(unavailable.empty(), "the nccl collective backend is not available: ", unavailable, "; use gloo");
  TORCH_CHECK_VALUE(device.is_cuda() && device.has_index(), "the nccl collective backend runs on a CUDA device with ",
                    "an index, got ", device);
#if TORCHBRIDGE_HAS_NCCL
  // NCCL binds a communicator to a GPU, and torchrun's convention is one GPU per local rank: two
  // ranks on one GPU would make NCCL fail later with "Duplicate GPU detected".
  const c10::impl::VirtualGuardImpl cuda(device.type());
  TORCH_CHECK_VALUE(device.index() < cuda.deviceCount(), "rank ", rank, " would use ", device, ", but this machine has ",
                    static_cast<int>(cuda.deviceCount()), " CUDA device(s): start at most that many ranks per node ",
                    "(torchrun --nproc-per-node), one per GPU");
  // Kernels this rank launches later go to the same GPU as its communicator.
  cuda.setDevice(device);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)timeout;
  TORCH_CHECK(false, "unreachable: nccl_unavailable_reason() is empty in a build without NCCL");
#endif
}

}  // namespace torchbridge::distributed
