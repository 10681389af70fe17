// Must NOT compile: prepare() of an object it does not know (a raw tensor) is refused at compile
// time with a message listing what prepare accepts. Built only by the CTest
// compile_fail.prepare_unsupported, which expects that message.
#include <accelerant/accelerant.h>

int main() {
  accelerant::Accelerator acc;
  auto data = torch::zeros({4, 2});
  auto prepared = acc.prepare(data);
  return prepared.numel() > 0 ? 0 : 1;
}
