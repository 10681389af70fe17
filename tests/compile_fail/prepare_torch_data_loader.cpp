// Must NOT compile: prepare() of a torch::data loader (as torch::data::make_data_loader returns
// it) cannot shard its batches, and is refused at compile time with a message that says to pass
// the dataset to accelerant::make_data_loader. Built only by the CTest
// compile_fail.prepare_torch_data_loader, which expects that message.
#include <accelerant/accelerant.h>

struct Squares : torch::data::datasets::Dataset<Squares> {
  torch::data::Example<> get(size_t i) override {
    return {torch::full({1}, static_cast<float>(i * i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return 10; }
};

int main() {
  accelerant::Accelerator acc;
  auto loader = torch::data::make_data_loader(Squares(), /*batch_size=*/2);
  auto prepared = acc.prepare(loader);
  return prepared.size() > 0 ? 0 : 1;
}
