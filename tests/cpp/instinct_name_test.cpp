// The Instinct generation parser on marketing names HIP reports, against what a reader of the
// name would say (the ROCm backend's fp8 and bf16 support follow from it).
#include "backends/instinct_name.h"

#include <gtest/gtest.h>

#include <memory>  // std::allocator, through the strings EXPECT_EQ builds (include-what-you-use)

namespace torchbridge::adapters {
namespace {

TEST(InstinctName, GenerationIsTheNumberAfterMi) {
  EXPECT_EQ(instinct_generation("AMD Instinct MI300X"), 300);
  EXPECT_EQ(instinct_generation("AMD Instinct MI250X/MI250"), 250);
  EXPECT_EQ(instinct_generation("AMD Instinct MI355X"), 355);
  EXPECT_EQ(instinct_generation("AMD Instinct MI 100"), 100);
  EXPECT_EQ(instinct_generation("AMD Instinct MI\t210"), 210);
  EXPECT_EQ(instinct_generation("MI50"), 50);
}

TEST(InstinctName, AtMostThreeDigitsAreRead) { EXPECT_EQ(instinct_generation("MI3000"), 300); }

TEST(InstinctName, NamesWithoutAGenerationGiveZero) {
  EXPECT_EQ(instinct_generation(""), 0);
  EXPECT_EQ(instinct_generation("AMD Radeon RX 7900 XTX"), 0);
  EXPECT_EQ(instinct_generation("MI"), 0);
  EXPECT_EQ(instinct_generation("MI8"), 0);  // one digit is not a generation
  EXPECT_EQ(instinct_generation("mi300"), 0);  // the marketing name spells it in capitals
}

TEST(InstinctName, ALaterMiIsFoundWhenTheFirstHasNoDigits) {
  EXPECT_EQ(instinct_generation("MINI accelerator MI210"), 210);
}

}  // namespace
}  // namespace torchbridge::adapters
