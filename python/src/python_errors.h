#pragma once
// Raising a Python exception from a C++ error message. A message can hold bytes that are not UTF-8
// (a file name, the bytes a header parser stopped at); PyErr_SetString decodes strictly and would
// raise UnicodeDecodeError in place of the error, losing it. Such bytes are kept as \xNN escapes.

#include <Python.h>

#include <string>

namespace torchbridge::python {

inline void set_python_error(PyObject* type, const std::string& message) {
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace");
  if (text == nullptr) return;  // the decoding's own error (out of memory) is set instead
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

}  // namespace torchbridge::python
