// The program each layer's link check builds (cmake/Layers.cmake): it never runs. What matters is
// that the linker resolves every symbol the layer's objects and the lower layers' objects use,
// without the objects of any higher layer.
int main() { return 0; }
