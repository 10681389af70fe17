// Anchors a precompiled header target (accelerant_pch, accelerant_library_pch in
// src/CMakeLists.txt); intentionally empty.
