#pragma once
// For vendors who write their runtime in C++: no C++ exception may cross the C ABI of the
// tb_runtime table (runtime.h). An exception leaving an entry is undefined behaviour for a C
// caller and, through TorchBridge's C++ caller, an unexplained crash far from its cause; an
// allocation inside an entry (a handle table, an error sentence) is enough to throw one.
//
// Put every entry behind the barrier when filling the table:
//
//   tb_status my_report(tb_status status, std::string message);   // records last_error_message
//   table.device_malloc = torchbridge::sdk::ExceptionBarrier<&my_device_malloc, &my_report>::entry;
//
// An exception becomes a status and a sentence: std::bad_alloc -> TB_ERROR_OUT_OF_MEMORY,
// std::system_error -> TB_ERROR_DEVICE_FAILURE, anything else -> TB_ERROR_UNKNOWN.
// Header-only, so device libraries need not link TorchBridge.

#include <torchbridge/sdk/runtime.h>

#include <exception>
#include <new>
#include <string>
#include <system_error>
#include <utility>

namespace torchbridge::sdk {

// Records `message` as the calling thread's last error and returns `status` (the vendor's own).
using ErrorReporter = tb_status (*)(tb_status status, std::string message);

namespace detail {

template <ErrorReporter Report>
tb_status report_without_throwing(tb_status status, const char* what, const char* detail) noexcept {
  try {
    return Report(status, std::string(what) + detail);
  } catch (...) {
    return status;  // no memory even for the sentence: the status alone must do
  }
}

}  // namespace detail

// Runs `call` (returning tb_status); an exception it throws is reported through `Report`.
template <ErrorReporter Report, typename Call>
tb_status call_without_exceptions(Call&& call) noexcept {
  try {
    return std::forward<Call>(call)();
  } catch (const std::bad_alloc&) {
    return detail::report_without_throwing<Report>(TB_ERROR_OUT_OF_MEMORY,
                                                   "the runtime ran out of host memory for its own bookkeeping", "");
  } catch (const std::system_error& error) {
    return detail::report_without_throwing<Report>(TB_ERROR_DEVICE_FAILURE, "system error in the runtime: ",
                                                   error.what());
  } catch (const std::exception& error) {
    return detail::report_without_throwing<Report>(TB_ERROR_UNKNOWN, "internal error in the runtime: ",
                                                   error.what());
  } catch (...) {
    return detail::report_without_throwing<Report>(TB_ERROR_UNKNOWN,
                                                   "internal error in the runtime (a non-standard exception)", "");
  }
}

// ExceptionBarrier<&entry, &report>::entry has `entry`'s C signature and never throws.
template <auto Entry, ErrorReporter Report>
struct ExceptionBarrier;

template <typename... Args, tb_status (*Entry)(Args...), ErrorReporter Report>
struct ExceptionBarrier<Entry, Report> {
  static tb_status entry(Args... args) noexcept {
    return call_without_exceptions<Report>([&] { return Entry(args...); });
  }
};

}  // namespace torchbridge::sdk
