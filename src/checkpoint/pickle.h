#pragma once
// A small interpreter for the part of Python's pickle format (protocols 2 to 5) that torch.save
// writes for state dicts: scalars, strings, tuples, lists, dicts, the memo, globals, REDUCE,
// BUILD and persistent ids. It knows no Python class: what REDUCE and BUILD do with a global and
// what a persistent id loads are the caller's hooks, so a file can only produce values the
// caller defines (unlike Python's pickle, nothing in it can run code). LibTorch's own unpickler
// is not used because it reads collections.OrderedDict (what state_dict() returns) as None and
// accepts protocol 2 only. Internal to the checkpoint module.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {

struct PickleValue;
using PickleRef = std::shared_ptr<PickleValue>;

struct PickleValue {
  enum class Kind { none, boolean, integer, real, string, bytes, tuple, list, dict, global, tensor };
  Kind kind = Kind::none;
  int64_t integer = 0;                                   // boolean (0/1), integer
  double real = 0;                                       // real
  std::string text;                                      // string, bytes; global: "module.name"
  std::vector<PickleRef> items;                          // tuple, list
  std::vector<std::pair<PickleRef, PickleRef>> entries;  // dict, in insertion order
  bool ordered = false;                                  // dict: a collections.OrderedDict
  at::Tensor tensor;                                     // tensor (hooks produce these)

  // Python's name for what this is ("int", "str", "list", "OrderedDict", "torch.Tensor", ...).
  std::string type_name() const;
  // The type with its article, for messages: "an int", "a list", "None".
  std::string description() const;
  // dict[key] = value, keeping the position of a key that is already there.
  void set_item(PickleRef key, PickleRef value);

 private:
  std::unordered_map<std::string, size_t> string_keys_;  // dict: position of each str key
};

struct PickleHooks {
  // REDUCE: calls `callable` (always a global) with `args` (always a tuple).
  std::function<PickleRef(const PickleValue& callable, const PickleValue& args)> reduce;
  // BUILD: applies `state` to `object`.
  std::function<void(PickleValue& object, const PickleValue& state)> build;
  // BINPERSID: the object a persistent id stands for.
  std::function<PickleRef(const PickleValue& id)> persistent_load;
};

// Runs the pickle in `bytes`. Errors raise ValueError starting with `context` and naming the byte
// offset and the problem.
PickleRef unpickle(std::string_view bytes, const PickleHooks& hooks, const std::string& context);

}  // namespace torchbridge::checkpoint
