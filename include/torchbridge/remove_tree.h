#pragma once
// Removes a file or a directory with everything below it: std::filesystem::remove_all's job,
// which code linked against torch must not call. torch 2.11's libtorch.so exports a statically
// linked copy of remove_all (PyTorch's wheels expose libstdc++ symbols, pytorch#133437; 2.13's
// does not), the dynamic loader binds every program's and library's call to that copy, and it
// calls recursive_directory_iterator::__erase, a weak symbol no shared libstdc++ defines: the
// call jumps to address 0 (`torchbridge bench` died so on the H200, and on any machine with
// torch 2.11). scripts/check_forbidden_calls.py keeps remove_all out of the project.

#include <cstdint>
#include <string>

namespace torchbridge {

// Symbolic links are removed, never followed. A path that does not exist removes nothing.
// Returns how many entries were removed; a failure raises c10::Error naming the entry and the
// operating system's reason, with what was removed before it gone.
std::uintmax_t remove_tree(const std::string& path);

}  // namespace torchbridge
