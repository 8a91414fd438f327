// Reading: the whole file is mapped privately (copy-on-write), so CPU tensors can alias it with
// no copy and writes to them never reach the file. Nothing but the header is read on open.
#include "checkpoint/safetensors_header.h"
#include "checkpoint/torch_save_signature.h"
#include "core/devices_in_process.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {

namespace {

bool starts_with(const uint8_t* bytes, uint64_t size, std::string_view prefix) {
  return size >= prefix.size() && std::memcmp(bytes, prefix.data(), prefix.size()) == 0;
}

// For a file whose first bytes are no safetensors header: the files most often mistaken for one are
// named (their first bytes read as a length of petabytes otherwise). Returns for any other file.
void refuse_a_file_of_another_kind(const std::string& path, const uint8_t* bytes, uint64_t size) {
  const auto* text = reinterpret_cast<const char*>(bytes);
  TORCH_CHECK_VALUE(!begins_as_zip_archive(text, size), path,
                    ": is a zip archive (torch.save's format), not a safetensors file; torch.load reads it, and "
                    "`torchbridge checkpoint convert` turns it into safetensors");
  TORCH_CHECK_VALUE(!begins_as_legacy_torch_save(text, size), path,
                    ": is a torch.save file in the legacy format (a pickle), not a safetensors file");
  // What a repository cloned without git-lfs holds in place of each large file.
  TORCH_CHECK_VALUE(!starts_with(bytes, size, "version https://git-lfs"), path,
                    ": is a git-lfs pointer file, not the safetensors file it stands for; fetch the file itself "
                    "(`git lfs pull` in its repository)");
}

}  // namespace

struct SafetensorsFile::Mapping {
  void* address = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (address != nullptr) munmap(address, bytes);
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below as no file).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  TORCH_CHECK_VALUE(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    TORCH_CHECK_VALUE(false, path, ": cannot stat: ", std::strerror(error));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    TORCH_CHECK_VALUE(false, path, S_ISDIR(st.st_mode) ? ": is a directory" : ": is not a regular file",
                      ", expected a .safetensors file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    TORCH_CHECK_VALUE(false, path, ": file is ", size, " bytes, too small to hold the 8-byte header length");
  }
  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = std::make_shared<Mapping>();
  void* address = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);
  TORCH_CHECK_VALUE(address != MAP_FAILED, path, ": cannot map the file: ", std::strerror(map_error));
  file.mapping_->address = address;
  file.mapping_->bytes = size;

  const auto* bytes = static_cast<const uint8_t*>(address);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];  // little-endian
  const bool length_fits = header_bytes > 0 && header_bytes <= kMaxHeaderBytes && 8 + header_bytes <= size;
  // JSON may begin with whitespace (the safetensors package reads such a header too).
  uint64_t first = 8;
  while (length_fits && first < 8 + header_bytes && std::strchr(" \t\r\n", bytes[first]) && bytes[first] != 0) ++first;
  const bool starts_an_object = length_fits && first < 8 + header_bytes && bytes[first] == '{';
  if (!starts_an_object) refuse_a_file_of_another_kind(path, bytes, size);
  TORCH_CHECK_VALUE(header_bytes <= kMaxHeaderBytes, path, ": header length ", header_bytes,
                    " exceeds the format's limit of ", kMaxHeaderBytes, " bytes");
  TORCH_CHECK_VALUE(8 + header_bytes <= size, path, ": header length ", header_bytes, " runs past the end of the ",
                    size, "-byte file");
  TORCH_CHECK_VALUE(starts_an_object, path, ": header must be a JSON object starting with '{'");
  const std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_bytes);
  // JSON text holds no NUL byte (not even inside a string, where it must be escaped); the JSON
  // parser would take one for the end of its input and ignore whatever follows it.
  const size_t nul = header.find('\0');
  TORCH_CHECK_VALUE(nul == std::string_view::npos, path, ": header holds a NUL byte at byte ", nul,
                    " of its ", header_bytes, ", which JSON text cannot");
  ParsedHeader parsed = parse_header(path, header, size - 8 - header_bytes);
  file.data_ = bytes + 8 + header_bytes;
  file.records_ = std::move(parsed.records);
  file.metadata_ = std::move(parsed.metadata);
  for (size_t i = 0; i < file.records_.size(); ++i) file.index_[file.records_[i].name] = i;
  return file;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) > 0; }

const TensorRecord& SafetensorsFile::record(const std::string& name) const {
  const auto it = index_.find(name);
  TORCH_CHECK_VALUE(it != index_.end(), path_, ": no tensor named '", name, "' (the file holds ", records_.size(),
                    " tensors)");
  return records_[it->second];
}

bool SafetensorsFile::aliases(const std::string& name) const {
  const TensorRecord& r = record(name);
  return r.end > r.begin && reinterpret_cast<uintptr_t>(data_ + r.begin) % c10::elementSize(r.dtype) == 0;
}

at::Tensor SafetensorsFile::load(const std::string& name, c10::Device device) const {
  const TensorRecord& r = record(name);
  const auto options = at::TensorOptions().dtype(r.dtype);
  at::Tensor host;
  if (aliases(name)) {
    // The tensor keeps the mapping alive for as long as it lives.
    std::shared_ptr<Mapping> keep_alive = mapping_;
    host = at::from_blob(const_cast<uint8_t*>(data_ + r.begin), r.shape, [keep_alive](void*) {}, options);
  } else {
    host = at::empty(r.shape, options);
    if (r.end > r.begin) std::memcpy(host.data_ptr(), data_ + r.begin, r.end - r.begin);
  }
  if (device.is_cpu()) return host;
  // Named here: torch's own error ("Could not run 'aten::empty_strided' with arguments from the
  // 'CUDA' backend") names no file, tensor or device.
  const std::optional<int> count = detail::devices_in_process(device.type());
  TORCH_CHECK_VALUE(count.has_value(), path_, ": cannot load '", name, "' onto ", device, ": this torch has no ",
                    c10::DeviceTypeName(device.type(), /*lower_case=*/true),
                    " support (a build without it, or a device whose library is not loaded)");
  TORCH_CHECK_VALUE(!device.has_index() || device.index() < *count, path_, ": cannot load '", name, "' onto ", device,
                    ": the machine has ", *count, " such device(s)");
  return host.to(device);
}

}  // namespace torchbridge::checkpoint
