// Anchors the shared precompiled header (src/pch.h); intentionally empty.
