#include <torchbridge/error_summary.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <string_view>

namespace torchbridge {

namespace {

// The first line, continued while a quoted value is open: a value holding a newline (a file name
// typed with one) cut "cannot read 'no\nsuch.json': ..." down to "cannot read 'no". The newlines
// kept are written \n, so the summary stays one line.
std::string message_on_one_line(const std::string& text) {
  constexpr std::string_view kContext = "\nException raised from";  // c10's C++ stack follows
  std::string line;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    line += text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const bool quote_open = std::count(line.begin(), line.end(), '\'') % 2 == 1;
    if (end == std::string::npos || !quote_open || text.compare(end, kContext.size(), kContext) == 0) return line;
    line += "\\n";
    start = end + 1;
  }
}

}  // namespace

std::string error_summary(const std::string& text) {
  if (text.find("failed in the TorchScript interpreter") == std::string::npos) return message_on_one_line(text);
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    // An error raised in a Python callback (a Python model's run) reaches C++ with pybind's Python
    // stack after it, under a line "At:"; the error is the line before that stack.
    if (line == "At:") break;
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
  }
  return last;
}

}  // namespace torchbridge
