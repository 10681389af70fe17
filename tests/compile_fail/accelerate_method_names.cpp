// Must NOT compile under -Werror=deprecated-declarations: Accelerate's method names
// (num_processes(), process_index(), ...) still exist for ports of Python scripts, but warn,
// naming Accelerant's one name (docs/names.md). Built only by the CTest
// compile_fail.accelerate_method_names, which expects that message.
#include <accelerant/accelerant.h>

int main() {
  accelerant::Accelerator acc;
  return acc.num_processes() == acc.world_size() ? 0 : 1;
}
