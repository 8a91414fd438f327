#pragma once
// Raising a Python exception, or a warning, from a C++ message. A message can hold bytes that are
// not UTF-8 (a file name, the bytes a header parser stopped at); PyErr_SetString and PyErr_WarnEx
// decode strictly and would raise UnicodeDecodeError in place of the message, losing it. Such
// bytes are kept as \xNN escapes.

#include <Python.h>

#include <string>

namespace torchbridge::python {

// A new reference to `message` as a Python str, bytes that are not UTF-8 as \xNN; null with the
// decoding's own error set (out of memory).
inline PyObject* decoded_message(const std::string& message) {
  return PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace");
}

inline void set_python_error(PyObject* type, const std::string& message) {
  PyObject* text = decoded_message(message);
  if (text == nullptr) return;  // the decoding's own error is set instead
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

// PyErr_WarnEx with such a message; returns PyErr_WarnEx's result (-1: the warning became an error).
inline int warn_in_python(PyObject* category, const std::string& message, Py_ssize_t stack_level) {
  PyObject* text = decoded_message(message);
  if (text == nullptr) return -1;
  const char* utf8 = PyUnicode_AsUTF8(text);  // owned by `text`
  const int result = utf8 == nullptr ? -1 : PyErr_WarnEx(category, utf8, stack_level);
  Py_DECREF(text);
  return result;
}

}  // namespace torchbridge::python
