// Writing: tensors sorted by element size (largest first) so each lands naturally aligned after
// a header padded to a multiple of 8; written to a temporary file that atomically replaces the
// target only once it is complete and on disk.
#include <torchbridge/checkpoint/safetensors.h>

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

namespace torchbridge::checkpoint {
namespace {

class TemporaryFile {
 public:
  explicit TemporaryFile(const std::string& target) : target_(target) {
    const auto slash = target.find_last_of('/');
    directory_ = slash == std::string::npos ? "." : target.substr(0, slash);
    std::string pattern = target + ".tmp-XXXXXX";
    fd_ = mkstemp(pattern.data());
    TORCH_CHECK(fd_ >= 0, target, ": cannot create a temporary file next to it: ", std::strerror(errno));
    path_ = pattern;
  }
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  void write(const void* data, size_t bytes) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t written = ::write(fd_, p, bytes);
      if (written < 0 && errno == EINTR) continue;
      TORCH_CHECK(written > 0, target_, ": writing failed: ", std::strerror(errno));
      p += written;
      bytes -= static_cast<size_t>(written);
    }
  }

  // fsync, rename over the target, fsync the directory: the rename is the commit point.
  void commit() {
    TORCH_CHECK(::fsync(fd_) == 0, target_, ": fsync failed: ", std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
    TORCH_CHECK(::rename(path_.c_str(), target_.c_str()) == 0, target_, ": rename failed: ", std::strerror(errno));
    committed_ = true;
    const int dir = ::open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    TORCH_CHECK(dir >= 0 && ::fsync(dir) == 0, target_, ": fsync of directory ", directory_, " failed: ",
                std::strerror(errno));
    ::close(dir);
  }

 private:
  std::string target_, directory_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void save(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::map<const c10::StorageImpl*, std::string> owners;
  std::vector<std::pair<std::string, at::Tensor>> prepared;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK_VALUE(!name.empty() && name != "__metadata__", path, ": invalid tensor name '", name, "'");
    TORCH_CHECK_VALUE(names.insert(name).second, path, ": tensor name '", name, "' is given twice");
    TORCH_CHECK_VALUE(tensor.defined(), path, ": tensor '", name, "' is undefined");
    safetensors_dtype_name(tensor.scalar_type());  // raises for dtypes the format cannot hold
    // Shared storage is refused rather than silently duplicated or dropped: the caller decides.
    if (tensor.has_storage() && tensor.storage().nbytes() > 0) {
      const auto [it, fresh] = owners.emplace(tensor.storage().unsafeGetStorageImpl(), name);
      TORCH_CHECK_VALUE(fresh, path, ": tensors '", it->second, "' and '", name,
                        "' share storage; safetensors stores tensors separately, so save a clone of one "
                        "(e.g. for tied weights) or only one of them");
    }
    prepared.emplace_back(name, tensor.cpu().contiguous());
  }
  std::stable_sort(prepared.begin(), prepared.end(), [](const auto& a, const auto& b) {
    return a.second.element_size() != b.second.element_size() ? a.second.element_size() > b.second.element_size()
                                                              : a.first < b.first;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : prepared) {
    const uint64_t bytes = tensor.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(tensor.scalar_type())},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data section starts 8-byte aligned
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  TemporaryFile file(path);
  file.write(length, sizeof(length));
  file.write(text.data(), text.size());
  for (const auto& [name, tensor] : prepared) file.write(tensor.data_ptr(), tensor.nbytes());
  file.commit();
}

}  // namespace torchbridge::checkpoint
