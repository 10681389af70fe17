// AutocastGuard: bf16 compute inside, the previous state restored outside, nesting, and a clear
// error for fp16 on the CPU.
#include <accelerant/autocast.h>
#include <accelerant/error.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace accelerant;

TEST(Autocast, Bf16OnTheCpuInsideTheGuardOnly) {
  auto a = torch::rand({8, 8});
  auto w = torch::rand({8, 8}, torch::requires_grad());
  {
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    auto out = torch::mm(a, w);
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    {
      AutocastGuard off(torch::kCPU, torch::kBFloat16, /*enabled=*/false);  // a no-op guard
      EXPECT_EQ(torch::mm(a, w).scalar_type(), torch::kBFloat16);
    }
    out.sum().backward();
  }
  EXPECT_EQ(torch::mm(a, w).scalar_type(), torch::kFloat);
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat) << "master weights and their grads stay fp32";
}

TEST(Autocast, Fp16OnTheCpuIsAClearError) {
  try {
    AutocastGuard autocast(torch::kCPU, torch::kHalf);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("supports bf16 only"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Fix: use mixed_precision bf16"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(torch::mm(torch::rand({2, 2}), torch::rand({2, 2})).scalar_type(), torch::kFloat);
}
