// Written arguments (out=, in-place self, other written inputs) must behave exactly as on the CPU,
// whatever their layout: an out= tensor of the wrong size (resized), transposed, a view with a
// storage offset or with holes, overlapping itself where torch allows it (and refused where it
// refuses it), empty, aliasing an input, or several of them at once. Every case runs on views of
// one 48-element base tensor on the CPU and on the backend, then compares what the kernel left
// behind: whether it raised, every byte of the base, and each result's values and layout.
#include "contract.h"

#include <torchbridge/one_accelerator.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torchbridge::contract {
namespace {

using at::Tensor;

struct WriteCase {
  std::string name;
  // Runs the operator with written arguments built from `base` (a double tensor 0, 0.5, ..., 23.5
  // on the device under test); returns the tensors whose values and layout must match the CPU's.
  std::function<std::vector<Tensor>(const Tensor& base)> run;
  // Non-empty where torch's own kernels for a native accelerator refuse what the CPU kernel
  // accepts: says why. A native backend may then raise, leaving the base untouched; an SDK
  // device must still do what the CPU does (its fallback runs the CPU kernel).
  std::string native_kernels_may_refuse = {};
};

Tensor grid(const Tensor& base, int64_t offset, int64_t rows, int64_t cols) {
  return base.narrow(0, offset, rows * cols).view({rows, cols});
}

Tensor values(const Tensor& like, std::vector<int64_t> shape, double start = 1.0) {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  return (at::arange(n, at::kDouble) * 0.25 + start).view(shape).to(like.device());
}

std::vector<WriteCase> write_cases() {
  return {
      {"out_empty_is_resized", [](const Tensor& b) {
         Tensor out = at::empty({0}, b.options());
         at::add_out(out, values(b, {3, 4}), values(b, {3, 4}, 2.0));
         return std::vector<Tensor>{out};
       }},
      {"out_empty_view_is_resized_into_its_storage", [](const Tensor& b) {
         Tensor out = b.narrow(0, 10, 0);
         at::mul_out(out, values(b, {2, 3}), values(b, {2, 3}, -1.0));
         return std::vector<Tensor>{out};
       }},
      {"out_too_large_shrinks", [](const Tensor& b) {
         Tensor out = b.narrow(0, 4, 20);
         at::sub_out(out, values(b, {6}), values(b, {6}, 3.0));
         return std::vector<Tensor>{out};
       }},
      {"out_too_small_grows_its_storage", [](const Tensor& b) {
         Tensor out = at::zeros({2}, b.options());
         at::add_out(out, values(b, {5, 6}), 1.5);
         return std::vector<Tensor>{out};
       }},
      {"out_transposed", [](const Tensor& b) {
         Tensor out = grid(b, 0, 3, 4).t();
         at::mm_out(out, values(b, {4, 5}), values(b, {5, 3}, -2.0));
         return std::vector<Tensor>{out};
       }},
      {"out_view_with_storage_offset", [](const Tensor& b) {
         Tensor out = grid(b, 7, 3, 4);
         at::add_out(out, values(b, {3, 4}), values(b, {4}, 5.0));
         return std::vector<Tensor>{out};
       }},
      {"out_view_with_holes", [](const Tensor& b) {
         Tensor out = b.view({6, 8}).narrow(1, 2, 3);
         Tensor batched = out.unsqueeze(0);
         at::bmm_out(batched, values(b, {1, 6, 2}), values(b, {1, 2, 3}, -1.0));
         return std::vector<Tensor>{out};
       }},
      {"out_view_in_a_composite", [](const Tensor& b) {  // _trilinear (nn.Bilinear) writes bmm into views
         return std::vector<Tensor>{at::_trilinear(values(b, {2, 3}), values(b, {5, 3, 4}, -3.0),
                                                   values(b, {2, 4}, 0.5), {1, 3}, {0}, {1, 2}, {2, 3})};
       }},
      {"out_overlapping_itself_is_refused", [](const Tensor& b) {
         Tensor out = b.narrow(0, 3, 1).expand({4});
         at::add_out(out, values(b, {4}), 1.0);
         return std::vector<Tensor>{out};
       }},
      {"out_overlapping_itself_where_torch_allows_it", [](const Tensor& b) {
         Tensor out = b.narrow(0, 3, 1).expand({4});
         at::mv_out(out, values(b, {4, 2}), values(b, {2}, 3.0));
         return std::vector<Tensor>{out};
       },
       "cuBLAS's gemv takes no zero output stride, so torch's CUDA mv refuses an expanded out= "
       "(\"argument incy must be positive\", seen on an H100 with torch 2.11)"},
      {"self_overlapping_itself_where_torch_allows_it", [](const Tensor& b) {
         Tensor self = b.narrow(0, 5, 1).expand({4});
         self.index_fill_(0, at::tensor({int64_t{2}}).to(b.device()), -7.0);
         return std::vector<Tensor>{self};
       }},
      {"out_and_inputs_empty", [](const Tensor& b) {
         Tensor out = b.narrow(0, 5, 0);
         at::add_out(out, values(b, {0}), values(b, {0}));
         return std::vector<Tensor>{out};
       }},
      {"out_is_an_input", [](const Tensor& b) {
         Tensor x = b.narrow(0, 3, 10);
         at::add_out(x, x, x, 0.5);
         return std::vector<Tensor>{x};
       }},
      {"out_partially_overlapping_an_input_is_refused", [](const Tensor& b) {
         Tensor out = b.narrow(0, 1, 10);
         at::add_out(out, b.narrow(0, 0, 10), values(b, {10}));
         return std::vector<Tensor>{out};
       }},
      {"several_outs_that_are_views", [](const Tensor& b) {
         Tensor values_out = b.narrow(0, 40, 4);
         Tensor indices = at::empty({0}, b.options().dtype(at::kLong));
         at::max_out(values_out, indices, grid(b, 8, 4, 6).t().contiguous().t(), 1);
         return std::vector<Tensor>{values_out, indices};
       }},
      {"in_place_on_a_transposed_view", [](const Tensor& b) {
         Tensor self = grid(b, 0, 4, 4).t();
         self.add_(values(b, {4, 4}));
         return std::vector<Tensor>{self};
       }},
      {"in_place_on_a_view_with_holes", [](const Tensor& b) {
         Tensor self = b.view({6, 8}).narrow(1, 1, 3);
         self.mul_(3.0);
         return std::vector<Tensor>{self};
       }},
      {"in_place_with_self_as_the_other_argument", [](const Tensor& b) {
         Tensor self = grid(b, 16, 4, 4).t();
         self.addcmul_(self, self, 0.5);
         return std::vector<Tensor>{self};
       }},
      {"written_list_of_views", [](const Tensor& b) {
         std::vector<Tensor> list = {grid(b, 0, 3, 4).t(), b.view({6, 8}).narrow(1, 5, 2), b.narrow(0, 30, 0)};
         at::_foreach_mul_(list, 2.5);
         return list;
       }},
      {"written_input_that_is_read_too", [](const Tensor& b) {  // _amp_update_scale_'s growth_tracker
         Tensor scale = at::full({1}, 4.0, b.options().dtype(at::kFloat));
         Tensor tracker = at::full({1}, 3, b.options().dtype(at::kInt));
         Tensor found_inf = at::zeros({1}, b.options().dtype(at::kFloat));
         at::_amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 4);
         return std::vector<Tensor>{scale, tracker};
       }},
      {"out_of_another_dtype", [](const Tensor& b) {
         Tensor out = at::empty({0}, b.options().dtype(at::kFloat));
         at::sum_out(out, grid(b, 0, 4, 6), {1});
         return std::vector<Tensor>{out};
       }},
  };
}

struct Outcome {
  std::string error;  // empty when the operator returned
  Tensor base;        // the base's bytes afterwards, on the CPU
  std::vector<Tensor> results;
};

Tensor initial_base() { return at::arange(48, at::kDouble) * 0.5; }

Outcome run(const WriteCase& c, const c10::Device& device) {
  const Tensor base = initial_base().to(device);
  Outcome outcome;
  try {
    outcome.results = c.run(base);
  } catch (const c10::Error& e) {
    outcome.error = e.what_without_backtrace();
  }
  outcome.base = base.cpu();
  return outcome;
}

TEST_P(Contract, WrittenArgumentsOfEveryLayoutBehaveAsOnTheCpu) {
  for (const WriteCase& c : write_cases()) {
    SCOPED_TRACE(c.name);
    const Outcome expected = run(c, c10::Device(c10::kCPU));
    // The table itself: the cases named as refused are the ones torch refuses.
    const bool refused = c.name.find("_is_refused") != std::string::npos;
    ASSERT_EQ(!expected.error.empty(), refused) << "on the CPU: " << expected.error.substr(0, 200);
    const Outcome actual = run(c, device());
    if (is_native_accelerator(backend()) && !c.native_kernels_may_refuse.empty() && expected.error.empty() &&
        !actual.error.empty()) {
      EXPECT_TRUE(bit_equal(actual.base, initial_base())) << "refused, but wrote into the base first";
      continue;  // torch's own kernel refuses: see native_kernels_may_refuse
    }
    if (actual.error.empty() != expected.error.empty()) {
      ADD_FAILURE() << "the CPU " << (expected.error.empty() ? "returned" : "raised: " + expected.error.substr(0, 200))
                    << "; " << GetParam()
                    << (actual.error.empty() ? " returned" : " raised: " + actual.error.substr(0, 200));
      continue;
    }
    EXPECT_TRUE(bit_equal(actual.base, expected.base)) << "the base tensor's bytes differ";
    if (actual.results.size() != expected.results.size()) {
      ADD_FAILURE() << actual.results.size() << " results, the CPU has " << expected.results.size();
      continue;
    }
    for (size_t i = 0; i < expected.results.size(); ++i) {
      const Tensor& e = expected.results[i];
      const Tensor& a = actual.results[i];
      EXPECT_EQ(a.sizes(), e.sizes()) << "result " << i;
      EXPECT_EQ(a.strides(), e.strides()) << "result " << i;
      EXPECT_EQ(a.storage_offset(), e.storage_offset()) << "result " << i;
      EXPECT_TRUE(bit_equal(a.cpu(), e)) << "result " << i;
    }
  }
}

// A kernel that resizes an out= argument gives it the layout the CPU kernel chose, not merely
// the right values (channels-last here, from channels-last inputs).
TEST_P(Contract, ResizedOutArgumentsTakeTheCpuKernelsLayout) {
  const auto make = [&](const c10::Device& d) {
    const Tensor input = at::arange(2 * 3 * 4 * 5, at::kDouble).view({2, 3, 4, 5}).to(d)
                             .contiguous(at::MemoryFormat::ChannelsLast);
    Tensor out = at::empty({0}, input.options());
    at::add_out(out, input, input);
    return out;
  };
  const Tensor expected = make(c10::Device(c10::kCPU));
  const Tensor actual = make(device());
  EXPECT_EQ(actual.strides(), expected.strides());
  EXPECT_TRUE(bit_equal(actual.cpu(), expected));
}

}  // namespace
}  // namespace torchbridge::contract
