#pragma once
// Stand-in for Gloo's algorithm.h (see README.md): ProcessGroupGloo.hpp includes it but uses
// nothing from it.
