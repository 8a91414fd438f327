// The pickle machine: a value stack, a stack of MARK positions and the memo. Values are shared
// pointers because the memo and containers refer to the same mutable objects as Python does
// (a dict filled by SETITEMS after being memoized is the same dict when fetched back).
// Every read is bounds-checked and every pop checked, so malformed input raises, never crashes.
#include "checkpoint/pickle.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <iterator>

namespace torchbridge::checkpoint {

std::string PickleValue::type_name() const {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::real: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::tuple: return "tuple";
    case Kind::list: return "list";
    case Kind::dict: return ordered ? "OrderedDict" : "dict";
    case Kind::global: return "global '" + text + "'";
    case Kind::tensor: return "torch.Tensor";
  }
  return "?";
}

std::string PickleValue::description() const {
  if (kind == Kind::none) return "None";
  const std::string name = type_name();
  return (std::string("aeiouAEIOU").find(name[0]) != std::string::npos ? "an " : "a ") + name;
}

void PickleValue::set_item(PickleRef key, PickleRef value) {
  if (key->kind == Kind::string) {
    const auto [it, fresh] = string_keys_.emplace(key->text, entries.size());
    if (!fresh) {
      entries[it->second].second = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

namespace {

// Opcodes by their byte, as named in CPython's pickletools.
enum Op : uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2', BINBYTES = 'B', SHORT_BINBYTES = 'C',
  BINFLOAT = 'G', BININT = 'J', BININT1 = 'K', BININT2 = 'M', NONE = 'N', BINPERSID = 'Q', REDUCE = 'R',
  BINUNICODE = 'X', EMPTY_LIST = ']', APPEND = 'a', BUILD = 'b', GLOBAL = 'c', DICT = 'd', APPENDS = 'e',
  BINGET = 'h', LONG_BINGET = 'j', LIST = 'l', BINPUT = 'q', LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't',
  EMPTY_TUPLE = ')', SETITEMS = 'u', EMPTY_DICT = '}', PROTO = 0x80, TUPLE1 = 0x85, TUPLE2 = 0x86,
  TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
};

class Machine {
 public:
  Machine(std::string_view bytes, const PickleHooks& hooks, const std::string& context)
      : bytes_(bytes), hooks_(hooks), context_(context) {}

  PickleRef run() {
    while (true) {
      op_at_ = pos_;
      const uint8_t op = byte();
      if (op == STOP) break;
      step(op);
    }
    check(stack_.size() == 1 && marks_.empty(), "STOP with ", stack_.size(), " values and ", marks_.size(),
          " open MARKs on the stack, expected exactly one value");
    return stack_.back();
  }

 private:
  template <typename... Args>
  void check(bool condition, const Args&... message) const {
    TORCH_CHECK_VALUE(condition, context_, ": pickle byte ", op_at_, ": ", message...);
  }

  uint8_t byte() {
    check(pos_ < bytes_.size(), "the pickle ends without a STOP opcode");
    return static_cast<uint8_t>(bytes_[pos_++]);
  }
  std::string_view take(uint64_t n) {
    check(n <= bytes_.size() - pos_, "a ", n, "-byte argument runs past the end of the ", bytes_.size(),
          "-byte pickle");
    const std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t little_endian(int n) {  // pickle's fixed-size integer arguments are little-endian
    const std::string_view raw = take(n);
    uint64_t value = 0;
    for (int i = n - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(raw[i]);
    return value;
  }
  std::string line() {  // GLOBAL's arguments: text up to a newline
    const size_t end = bytes_.find('\n', pos_);
    check(end != std::string_view::npos, "GLOBAL argument without a terminating newline");
    std::string out(bytes_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }

  static PickleRef make(PickleValue::Kind kind) {
    auto value = std::make_shared<PickleValue>();
    value->kind = kind;
    return value;
  }
  static PickleRef integer(int64_t v, PickleValue::Kind kind = PickleValue::Kind::integer) {
    PickleRef value = make(kind);
    value->integer = v;
    return value;
  }
  static PickleRef text(PickleValue::Kind kind, std::string_view s) {
    PickleRef value = make(kind);
    value->text = std::string(s);
    return value;
  }

  // The innermost dict key (a str) below the value being built, or "": in a state dict, the name
  // of the tensor whose pickle is being read.
  std::string nearest_key() const {
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
      if ((*it)->kind == PickleValue::Kind::string) return (*it)->text;
    }
    return "";
  }

  PickleRef pop() {
    check(stack_.size() > (marks_.empty() ? 0 : marks_.back()), "pop from an empty stack");
    PickleRef value = std::move(stack_.back());
    stack_.pop_back();
    return value;
  }
  PickleRef& top() {
    check(stack_.size() > (marks_.empty() ? 0 : marks_.back()), "the stack is empty");
    return stack_.back();
  }
  // The values pushed since the last MARK, removed from the stack together with the MARK.
  std::vector<PickleRef> pop_to_mark() {
    check(!marks_.empty(), "no MARK to pop to");
    const size_t start = marks_.back();
    marks_.pop_back();
    std::vector<PickleRef> values(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(start)),
                                  std::make_move_iterator(stack_.end()));
    stack_.resize(start);
    return values;
  }
  PickleRef& container(PickleValue::Kind kind, const char* opcode) {
    PickleRef& target = top();
    check(target->kind == kind, opcode, " applied to ", target->description());
    return target;
  }
  void set_items(PickleValue& dict, const std::vector<PickleRef>& values) {
    check(values.size() % 2 == 0, "SETITEMS with an odd number (", values.size(), ") of keys and values");
    for (size_t i = 0; i < values.size(); i += 2) dict.set_item(values[i], values[i + 1]);
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  void memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    check(it != memo_.end(), "memo entry ", index, " is read before it is written");
    stack_.push_back(it->second);
  }
  void push_global(std::string module, const std::string& name) {
    stack_.push_back(text(PickleValue::Kind::global, module.append(".").append(name)));
  }
  PickleRef tuple(std::vector<PickleRef> items) {
    PickleRef value = make(PickleValue::Kind::tuple);
    value->items = std::move(items);
    return value;
  }

  void step(uint8_t op) {
    using Kind = PickleValue::Kind;
    switch (op) {
      case PROTO: {
        const uint8_t protocol = byte();
        check(protocol >= 2 && protocol <= 5, "pickle protocol ", int(protocol), " (only 2 to 5 are read)");
        break;
      }
      case FRAME: take(8); break;  // framing only groups opcodes for buffered readers
      case MARK: marks_.push_back(stack_.size()); break;
      case POP: pop(); break;
      case POP_MARK: pop_to_mark(); break;
      case DUP: stack_.push_back(top()); break;
      case NONE: stack_.push_back(make(Kind::none)); break;
      case NEWTRUE: stack_.push_back(integer(1, Kind::boolean)); break;
      case NEWFALSE: stack_.push_back(integer(0, Kind::boolean)); break;
      case BININT1: stack_.push_back(integer(static_cast<int64_t>(little_endian(1)))); break;
      case BININT2: stack_.push_back(integer(static_cast<int64_t>(little_endian(2)))); break;
      case BININT: stack_.push_back(integer(static_cast<int32_t>(little_endian(4)))); break;
      case LONG1: {  // n-byte little-endian two's complement
        const int n = byte();
        check(n <= 8, "integer of ", n, " bytes does not fit in 64 bits");
        uint64_t value = n == 0 ? 0 : little_endian(n);
        if (n > 0 && n < 8 && (value >> (8 * n - 1)) != 0) value |= ~uint64_t{0} << (8 * n);  // sign-extend
        stack_.push_back(integer(static_cast<int64_t>(value)));
        break;
      }
      case BINFLOAT: {  // the one big-endian argument
        const std::string_view raw = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(raw[i]);
        PickleRef value = make(Kind::real);
        std::memcpy(&value->real, &bits, sizeof(bits));
        stack_.push_back(value);
        break;
      }
      case SHORT_BINUNICODE: stack_.push_back(text(Kind::string, take(little_endian(1)))); break;
      case BINUNICODE: stack_.push_back(text(Kind::string, take(little_endian(4)))); break;
      case BINUNICODE8: stack_.push_back(text(Kind::string, take(little_endian(8)))); break;
      case SHORT_BINBYTES: stack_.push_back(text(Kind::bytes, take(little_endian(1)))); break;
      case BINBYTES: stack_.push_back(text(Kind::bytes, take(little_endian(4)))); break;
      case BINBYTES8: stack_.push_back(text(Kind::bytes, take(little_endian(8)))); break;
      case EMPTY_TUPLE: stack_.push_back(tuple({})); break;
      case TUPLE1: case TUPLE2: case TUPLE3: {
        std::vector<PickleRef> items(op - TUPLE1 + 1);
        for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
        stack_.push_back(tuple(std::move(items)));
        break;
      }
      case TUPLE: stack_.push_back(tuple(pop_to_mark())); break;
      case EMPTY_LIST: stack_.push_back(make(Kind::list)); break;
      case LIST: {
        PickleRef list = make(Kind::list);
        list->items = pop_to_mark();
        stack_.push_back(list);
        break;
      }
      case APPEND: {
        PickleRef item = pop();
        container(Kind::list, "APPEND")->items.push_back(std::move(item));
        break;
      }
      case APPENDS: {
        std::vector<PickleRef> items = pop_to_mark();
        auto& list = container(Kind::list, "APPENDS")->items;
        list.insert(list.end(), items.begin(), items.end());
        break;
      }
      case EMPTY_DICT: stack_.push_back(make(Kind::dict)); break;
      case DICT: {
        PickleRef dict = make(Kind::dict);
        set_items(*dict, pop_to_mark());
        stack_.push_back(dict);
        break;
      }
      case SETITEM: {
        PickleRef value = pop();
        PickleRef key = pop();
        container(Kind::dict, "SETITEM")->set_item(std::move(key), std::move(value));
        break;
      }
      case SETITEMS: {
        const std::vector<PickleRef> values = pop_to_mark();
        set_items(*container(Kind::dict, "SETITEMS"), values);
        break;
      }
      case BINPUT: memo_put(little_endian(1)); break;
      case LONG_BINPUT: memo_put(little_endian(4)); break;
      case MEMOIZE: memo_put(memo_.size()); break;
      case BINGET: memo_get(little_endian(1)); break;
      case LONG_BINGET: memo_get(little_endian(4)); break;
      case GLOBAL: {
        std::string module = line();
        push_global(std::move(module), line());
        break;
      }
      case STACK_GLOBAL: {
        const PickleRef name = pop();
        const PickleRef module = pop();
        check(module->kind == Kind::string && name->kind == Kind::string, "STACK_GLOBAL needs two strs, got ",
              module->description(), " and ", name->description());
        push_global(module->text, name->text);
        break;
      }
      case REDUCE: {
        const PickleRef args = pop();
        const PickleRef callable = pop();
        check(callable->kind == Kind::global && args->kind == Kind::tuple, "REDUCE needs a global and a tuple, got ",
              callable->description(), " and ", args->description());
        try {
          stack_.push_back(hooks_.reduce(*callable, *args));
        } catch (const c10::ValueError& error) {
          // A refusal names the entry it was building: the nearest key below it on the stack.
          const std::string key = nearest_key();
          if (key.empty()) throw;
          C10_THROW_ERROR(ValueError, c10::str(error.msg(), " (in entry '", key, "')"));
        }
        break;
      }
      case BUILD: {
        const PickleRef state = pop();
        hooks_.build(*top(), *state);
        break;
      }
      case BINPERSID: {
        const PickleRef id = pop();
        stack_.push_back(hooks_.persistent_load(*id));
        break;
      }
      default: {
        // torch.save(model) pickles the module itself: NEWOBJ on its class. Named, that mistake
        // explains itself, where the opcode alone did not.
        std::string object;
        for (size_t i = stack_.size(); i > 0 && i + 2 >= stack_.size(); --i) {
          if (stack_[i - 1] && stack_[i - 1]->kind == Kind::global) {
            object = " (it builds an object of class '" + stack_[i - 1]->text +
                     "': torch.save of a whole model or another object, not of a state dict; save "
                     "model.state_dict() instead)";
            break;
          }
        }
        check(false, "opcode 0x", "0123456789abcdef"[op >> 4], "0123456789abcdef"[op & 15],
              " is not one a state dict needs (not read here)", object);
      }
    }
  }

  std::string_view bytes_;
  const PickleHooks& hooks_;
  const std::string& context_;
  size_t pos_ = 0;
  size_t op_at_ = 0;  // offset of the opcode being run, for errors
  std::vector<PickleRef> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleRef> memo_;
};

}  // namespace

PickleRef unpickle(std::string_view bytes, const PickleHooks& hooks, const std::string& context) {
  return Machine(bytes, hooks, context).run();
}

}  // namespace torchbridge::checkpoint
