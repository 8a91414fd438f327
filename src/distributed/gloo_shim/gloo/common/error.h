#pragma once
// Stand-in for Gloo's common/error.h (see ../README.md): included, nothing from it used.
