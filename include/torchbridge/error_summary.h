#pragma once
// The line of an error message worth showing to a person, for reports and command-line errors.

#include <string>

namespace torchbridge {

// The first line of `text`, continued while a quoted value is open (a value typed with a newline:
// cutting at the first newline left "error: no" of "cannot read 'no\nsuch.json'"), the newlines
// kept written \n. Errors raised inside TorchScript are the exception: its interpreter puts a
// generic first line ("The following operation failed in the TorchScript interpreter.") and a
// script traceback before the original error, which comes last (before pybind's "At:" Python
// stack, when the error crossed a Python callback); that last line is returned.
std::string error_summary(const std::string& text);

}  // namespace torchbridge
