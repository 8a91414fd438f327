// add, sub, mul, div and their in-place forms take a shortcut past the boxed CPU fallback
// (elementwise_fast_path.cpp) when every operand is plain and dense, and the boxed fallback
// otherwise. Whichever path an operand pair takes, the result must be the CPU's bit for bit (values,
// dtype, sizes, strides), errors must be the CPU's, and the run is counted and honours strict mode.
// Each test runs in its own process (gtest_discover_tests), so each may choose emu's memory mode.
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "error_message.h"

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

using test_support::error_of;

const c10::Device kEmu(c10::DeviceType::PrivateUse1, 0);

// Guarded: operands cross as copies. Host-addressable: the CPU kernel reads device memory itself.
class ElementwiseFastPath : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    setenv("TORCHBRIDGE_EMU_GUARDED", GetParam() ? "1" : "0", 1);
    load_device("emu");
  }
};

using Binary = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
using InPlace = std::function<void(at::Tensor&, const at::Tensor&)>;

const std::vector<std::pair<std::string, Binary>>& functional_ops() {
  static const std::vector<std::pair<std::string, Binary>> ops = {
      {"add", [](const at::Tensor& a, const at::Tensor& b) { return at::add(a, b, 2); }},
      {"sub", [](const at::Tensor& a, const at::Tensor& b) { return at::sub(a, b, 3); }},
      {"mul", [](const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); }},
      {"div", [](const at::Tensor& a, const at::Tensor& b) { return at::div(a, b); }},
  };
  return ops;
}

const std::vector<std::pair<std::string, InPlace>>& in_place_ops() {
  static const std::vector<std::pair<std::string, InPlace>> ops = {
      {"add_", [](at::Tensor& a, const at::Tensor& b) { a.add_(b, 2); }},
      {"sub_", [](at::Tensor& a, const at::Tensor& b) { a.sub_(b, 3); }},
      {"mul_", [](at::Tensor& a, const at::Tensor& b) { a.mul_(b); }},
      {"div_", [](at::Tensor& a, const at::Tensor& b) { a.div_(b); }},
  };
  return ops;
}

// Operand pairs on the CPU; each goes to the device except 0-dim CPU scalars, which stay.
struct Case {
  std::string name;
  at::Tensor self, other;
};

std::vector<Case> cases() {
  at::manual_seed(0);
  const auto positive = [](at::IntArrayRef sizes) { return at::rand(sizes) + 0.5; };
  const at::Tensor square = positive({6, 6});
  const at::Tensor nchw = positive({2, 3, 4, 5});
  at::Tensor wrapped = at::scalar_tensor(1.5, at::kDouble);  // what at::add(t, 1.5) passes on
  wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
  return {
      {"contiguous", positive({3, 4}), positive({3, 4})},
      {"broadcast", positive({3, 1}), positive({1, 4})},
      {"int64 with float", at::randint(1, 9, {5}, at::kLong), positive({5})},
      {"float64 with int32", positive({5}).to(at::kDouble), at::randint(1, 9, {5}, at::kInt)},
      {"cpu scalar", positive({4}), at::scalar_tensor(2.5)},
      {"wrapped number", positive({4}), wrapped},
      {"transposed (dense, not contiguous)", square.t(), positive({6, 6})},
      {"channels_last", nchw.contiguous(at::MemoryFormat::ChannelsLast), positive({2, 3, 4, 5})},
      {"strided view (boxed fallback)", square.slice(1, 0, 6, 2), positive({6, 3})},
      {"larger than the scratch buffer", positive({40000}), positive({40000})},
      {"empty", positive({0, 3}), positive({0, 3})},
  };
}

at::Tensor on_device(const at::Tensor& t) { return t.is_cpu() && t.dim() == 0 ? t : t.to(kEmu); }

void expect_identical(const at::Tensor& device_result, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(device_result.device(), kEmu) << what;
  const at::Tensor host = device_result.cpu();
  EXPECT_EQ(host.scalar_type(), expected.scalar_type()) << what;
  EXPECT_EQ(host.sizes(), expected.sizes()) << what;
  EXPECT_EQ(host.strides(), expected.strides()) << what;
  EXPECT_TRUE(at::equal(host, expected)) << what;
}

TEST_P(ElementwiseFastPath, FunctionalFormsMatchTheCpuBitForBit) {
  for (const auto& [op_name, op] : functional_ops()) {
    for (const Case& c : cases()) {
      const std::string what = op_name + ", " + c.name;
      expect_identical(op(on_device(c.self), on_device(c.other)), op(c.self, c.other), what);
      // The scalar first: the device operand is the second one.
      if (c.other.dim() == 0) {
        expect_identical(op(c.other, on_device(c.self)), op(c.other, c.self), what + ", scalar first");
      }
    }
  }
}

TEST_P(ElementwiseFastPath, InPlaceFormsMatchTheCpuBitForBit) {
  for (const auto& [op_name, op] : in_place_ops()) {
    for (const Case& c : cases()) {
      const std::string what = op_name + ", " + c.name;
      if (c.self.is_floating_point() == false || c.self.sizes() != at::infer_size(c.self.sizes(), c.other.sizes())) {
        continue;  // in-place needs a result that fits self (the error cases are tested below)
      }
      at::Tensor expected = c.self.clone(at::MemoryFormat::Preserve);
      op(expected, c.other);
      at::Tensor self = on_device(c.self);
      const at::Tensor other = on_device(c.other);
      op(self, other);
      expect_identical(self, expected, what);
      EXPECT_TRUE(at::equal(other.cpu(), c.other)) << what << ": the operand was changed";
    }
  }
  // Into a view: the elements around it stay untouched.
  at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  at::Tensor base_device = base.to(kEmu);
  base.select(0, 1).add_(at::ones({4}));
  base_device.select(0, 1).add_(at::ones({4}).to(kEmu));
  EXPECT_TRUE(at::equal(base_device.cpu(), base));
  // self as its own operand (same memory, fully overlapping: allowed on the CPU).
  at::Tensor twice = at::arange(5, at::kFloat);
  at::Tensor twice_device = twice.to(kEmu);
  twice.mul_(twice);
  twice_device.mul_(twice_device);
  EXPECT_TRUE(at::equal(twice_device.cpu(), twice));
}

TEST_P(ElementwiseFastPath, ErrorsAreTheCpusAndNothingIsWritten) {
  const at::Tensor a = at::ones({3, 4}), b = at::ones({5});
  const at::Tensor ad = a.to(kEmu), bd = b.to(kEmu);
  // Shapes that do not broadcast.
  EXPECT_EQ(error_of([&] { at::add(ad, bd); }), error_of([&] { at::add(a, b); }));
  // An in-place result that would not fit self, and one of a type self cannot hold.
  at::Tensor small = at::ones({1, 4}), small_device = small.to(kEmu);
  EXPECT_EQ(error_of([&] { small_device.add_(ad); }), error_of([&] { small.add_(a); }));
  at::Tensor ints = at::ones({3, 4}, at::kLong), ints_device = ints.to(kEmu);
  EXPECT_EQ(error_of([&] { ints_device.div_(ad); }), error_of([&] { ints.div_(a); }));
  EXPECT_TRUE(at::equal(ints_device.cpu(), ints));
  // Written memory partly overlapping an operand: refused, as on the CPU.
  at::Tensor line = at::arange(6, at::kFloat), line_device = line.to(kEmu);
  const std::string cpu_overlap = error_of([&] { line.slice(0, 1).add_(line.slice(0, 0, 5)); });
  ASSERT_NE(cpu_overlap, "<no error>");
  EXPECT_EQ(error_of([&] { line_device.slice(0, 1).add_(line_device.slice(0, 0, 5)); }), cpu_overlap);
  EXPECT_TRUE(at::equal(line_device.cpu(), at::arange(6, at::kFloat)));
  // A device tensor with a CPU tensor that is not a scalar: torch's own device error.
  EXPECT_NE(error_of([&] { at::mul(ad, a); }).find("Expected all tensors to be on the same device"),
            std::string::npos);
}

TEST_P(ElementwiseFastPath, RunsAreCountedAndStrictModeRefusesThem) {
  const at::Tensor x = at::ones({4}).to(kEmu);
  const at::Tensor strided = at::ones({8}).to(kEmu).slice(0, 0, 8, 2);
  reset_fallback_counts();
  at::add(x, x);                                    // the shortcut
  at::add(strided, x);                              // the boxed fallback
  at::Tensor y = x.clone();
  y.mul_(x);
  const auto counts = fallback_counts();
  EXPECT_EQ(counts.at("aten::add.Tensor"), 2);
  EXPECT_EQ(counts.at("aten::mul_.Tensor"), 1);

  setenv(kStrictEnvVar, "1", 1);
  const std::string refused = error_of([&] { at::add(x, x); });
  unsetenv(kStrictEnvVar);
  EXPECT_NE(refused.find("aten::add.Tensor"), std::string::npos) << refused;
  EXPECT_NE(refused.find(kStrictEnvVar), std::string::npos) << refused;
}

INSTANTIATE_TEST_SUITE_P(Emu, ElementwiseFastPath, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "guarded" : "host_addressable";
                         });

}  // namespace
}  // namespace torchbridge::sdk
