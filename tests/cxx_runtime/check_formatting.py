"""Loads the fixture library into a process that has imported torch (so torch's libstdc++.so.6 is
loaded first, as in every TorchBridge Python process) and checks what it computes. Exit 0 when
every answer is right; a wrong answer or a crash is a failure."""

import ctypes
import sys

import torch  # noqa: F401  (loads torch's C++ runtime before the fixture)

library = ctypes.CDLL(sys.argv[1])
buffer = ctypes.create_string_buffer(128)
answers = []
for value in (5, 1234567):
    library.fixture_format(value, buffer, len(buffer))
    answers.append((buffer.value.decode(), f"device index {value} is out of range"))
answers.append((library.fixture_matches(b"emu"), 1))
answers.append((library.fixture_matches(b"../emu"), 0))
library.fixture_throw_and_catch(42, buffer, len(buffer))
answers.append((buffer.value.decode(), "index 42"))
wrong = [(got, expected) for got, expected in answers if got != expected]
print("wrong answers:", wrong if wrong else "none")
sys.exit(1 if wrong else 0)
