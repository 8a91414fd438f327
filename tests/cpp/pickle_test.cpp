// The pickle machine behind read_torch_save, on pickles CPython wrote (the byte strings below are
// pickle.dumps output, pasted) and on malformed ones, each with the problem it must name.
#include "checkpoint/pickle.h"

#include <gtest/gtest.h>

#include "error_message.h"

#include <limits>
#include <stdexcept>

namespace torchbridge::checkpoint {
namespace {

using test_support::error_of;
using Kind = PickleValue::Kind;

PickleHooks ordered_dict_hooks() {
  PickleHooks hooks;
  hooks.reduce = [](const PickleValue& callable, const PickleValue& args) {
    EXPECT_EQ(callable.text, "collections.OrderedDict");
    EXPECT_TRUE(args.items.empty());
    auto dict = std::make_shared<PickleValue>();
    dict->kind = Kind::dict;
    dict->ordered = true;
    return dict;
  };
  hooks.build = [](PickleValue&, const PickleValue&) { FAIL() << "no BUILD expected"; };
  hooks.persistent_load = [](const PickleValue&) -> PickleRef { throw std::runtime_error("no persistent id expected"); };
  return hooks;
}

// A string literal's bytes, embedded NULs included.
template <size_t N>
std::string_view raw(const char (&literal)[N]) {
  return {literal, N - 1};
}

PickleRef run(std::string_view bytes) { return unpickle(bytes, ordered_dict_hooks(), "test.pkl"); }

// The key is a const char*, not a std::string: GCC 13 -Wdangling-reference flags any returned
// reference when an argument is a temporary string.
const PickleValue& entry(const PickleValue& dict, const char* key) {
  for (const auto& [k, v] : dict.entries) {
    if (k->kind == Kind::string && k->text == key) return *v;
  }
  throw std::runtime_error(std::string("no key ") + key);
}

// {'a': [1, -2, 3.5, None, True, False, 300, -70000, 2**40, -2**63], 'b': (1, 'x'),
//  'c': OrderedDict([('k', 'v')])} in protocols 2 and 4 (framing, MEMOIZE, STACK_GLOBAL).
constexpr std::string_view kProtocol2(
    "\x80\x02}q\x00(X\x01\x00\x00\x00" "aq\x01]q\x02(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00N\x88\x89M,"
    "\x01J\x90\xee\xfe\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80" "eX\x01\x00\x00"
    "\x00" "bq\x03K\x01X\x01\x00\x00\x00xq\x04\x86q\x05X\x01\x00\x00\x00" "cq\x06" "ccollections\x0aOrderedDict"
    "\x0aq\x07)Rq\x08X\x01\x00\x00\x00kq\x09X\x01\x00\x00\x00vq\x0asu.",
    143);
constexpr std::string_view kProtocol4(
    "\x80\x04\x95t\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01" "a\x94]\x94(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00"
    "\x00\x00\x00N\x88\x89M,\x01J\x90\xee\xfe\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00"
    "\x00\x80" "e\x8c\x01" "b\x94K\x01\x8c\x01x\x94\x86\x94\x8c\x01" "c\x94\x8c\x0b" "collections\x94\x8c\x0b"
    "OrderedDict\x94\x93\x94)R\x94\x8c\x01k\x94\x8c\x01v\x94su.",
    127);

void expect_reference_value(const PickleValue& root) {
  ASSERT_EQ(root.kind, Kind::dict);
  EXPECT_FALSE(root.ordered);
  ASSERT_EQ(root.entries.size(), 3u);
  EXPECT_EQ(root.entries[0].first->text, "a");  // insertion order kept
  EXPECT_EQ(root.entries[2].first->text, "c");
  const PickleValue& list = entry(root, "a");
  ASSERT_EQ(list.kind, Kind::list);
  ASSERT_EQ(list.items.size(), 10u);
  EXPECT_EQ(list.items[0]->integer, 1);
  EXPECT_EQ(list.items[1]->integer, -2);
  EXPECT_EQ(list.items[2]->kind, Kind::real);
  EXPECT_EQ(list.items[2]->real, 3.5);
  EXPECT_EQ(list.items[3]->kind, Kind::none);
  EXPECT_EQ(list.items[4]->kind, Kind::boolean);
  EXPECT_EQ(list.items[4]->integer, 1);
  EXPECT_EQ(list.items[5]->integer, 0);
  EXPECT_EQ(list.items[6]->integer, 300);
  EXPECT_EQ(list.items[7]->integer, -70000);
  EXPECT_EQ(list.items[8]->integer, int64_t{1} << 40);
  EXPECT_EQ(list.items[9]->integer, std::numeric_limits<int64_t>::min());
  const PickleValue& tuple = entry(root, "b");
  ASSERT_EQ(tuple.kind, Kind::tuple);
  ASSERT_EQ(tuple.items.size(), 2u);
  EXPECT_EQ(tuple.items[1]->text, "x");
  const PickleValue& ordered = entry(root, "c");
  EXPECT_TRUE(ordered.ordered);
  EXPECT_EQ(entry(ordered, "k").text, "v");
}

TEST(Pickle, ReadsWhatCPythonWritesInProtocol2) { expect_reference_value(*run(kProtocol2)); }

TEST(Pickle, ReadsWhatCPythonWritesInProtocol4) { expect_reference_value(*run(kProtocol4)); }

TEST(Pickle, MemoizedContainersAreShared) {
  // d = {}; d['self'] = d  ->  the value is the dict itself, as in Python.
  const PickleRef root = run(raw("\x80\x02}q\x00X\x04\x00\x00\x00selfq\x01h\x00s."));
  EXPECT_EQ(root->entries.at(0).second.get(), root.get());
  root->entries.clear();  // break the cycle
}

TEST(Pickle, SetItemKeepsTheFirstPositionOfARepeatedKey) {
  // {'a': 1, 'b': 2, 'a': 3} built with SETITEMS, as a hand-written pickle can.
  const PickleRef root = run(raw("\x80\x02}(\x8c\x01" "aK\x01\x8c\x01" "bK\x02\x8c\x01" "aK\x03u."));
  ASSERT_EQ(root->entries.size(), 2u);
  EXPECT_EQ(root->entries[0].first->text, "a");
  EXPECT_EQ(root->entries[0].second->integer, 3);
}

TEST(Pickle, MalformedPicklesNameTheByteAndTheProblem) {
  const auto error = [](std::string_view bytes) { return error_of([&] { run(bytes); }); };
  // Cut inside BINUNICODE's length (the opcode is at byte 64), then between two opcodes.
  EXPECT_NE(error(kProtocol2.substr(0, 66)).find("test.pkl: pickle byte 64: a 4-byte argument runs past the end"),
            std::string::npos);
  EXPECT_NE(error(kProtocol2.substr(0, 80)).find("test.pkl: pickle byte 80: the pickle ends without a STOP"),
            std::string::npos);
  EXPECT_NE(error(raw("\x80\x02}")).find("ends without a STOP opcode"), std::string::npos);
  EXPECT_NE(error(raw("\x80\x01}.")).find("pickle protocol 1 (only 2 to 5 are read)"),
            std::string::npos);
  EXPECT_NE(error(raw("\x80\x02s.")).find("pickle byte 2: pop from an empty stack"), std::string::npos);
  EXPECT_NE(error(raw("\x80\x02h\x05.")).find("memo entry 5 is read before it is written"),
            std::string::npos);
  EXPECT_NE(error(raw("\x80\x02N\x8c\x01" "a\x8c\x01" "bs.")).find("SETITEM applied to None"),
            std::string::npos);
  EXPECT_NE(error(raw("\x80\x02}N.")).find("STOP with 2 values"), std::string::npos);
  EXPECT_NE(error(raw("\x80\x02}K\x01u.")).find("pickle byte 5: no MARK to pop to"), std::string::npos);
  EXPECT_NE(error(raw("\x80\x02I1\n.")).find("opcode 0x49 is not one a state dict needs"),
            std::string::npos);
  EXPECT_NE(error(raw("\x80\x02K\x01)R.")).find("REDUCE needs a global and a tuple, got an int"),
            std::string::npos);
  EXPECT_NE(error(raw("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00."))
                .find("integer of 9 bytes does not fit in 64 bits"),
            std::string::npos);
}

}  // namespace
}  // namespace torchbridge::checkpoint
