# One warning policy for TorchBridge's own code. Torch's and GoogleTest's headers come in as system
# headers, so their warnings never count. Development and CI build with TORCHBRIDGE_WERROR=ON
# (scripts/setup.sh, scripts/gpu-check.sh); a user building the package with a newer compiler that
# warns about something new still gets a working build with the default OFF.
option(TORCHBRIDGE_WERROR "Treat warnings in TorchBridge's own code as errors" OFF)

# GCC 12 and 13 at -O3 report std::string concatenations inside libstdc++ as buffer overflows
# ("specified bound ... exceeds maximum object size", "pointer overflow between offset", and GCC 13.3
# on the lent H100 machine: "__builtin_memcpy forming offset [32, 86] is out of the bounds [0, 32]"
# for `std::string(...) + ... + dtype` in precision_policy.cpp; GCC bugs 105329 and 105651): those
# three diagnostics are off for GCC before 14 only, so -Werror stays usable there.
set(_torchbridge_gcc_string_false_positives
    "$<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,14>>:-Wno-stringop-overflow;-Wno-restrict;-Wno-array-bounds>")

# -Wno-missing-field-initializers: C++20 aggregate initialisation leaves later members to their
# default member initialisers on purpose ({{"cpu"}, "fp32"} for ValidatorOptions).
function(torchbridge_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
                         ${_torchbridge_gcc_string_false_positives}
                         $<$<BOOL:${TORCHBRIDGE_WERROR}>:-Werror>)
endfunction()
