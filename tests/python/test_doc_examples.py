"""Every Python example in README.md and docs/*.md runs, on the cpu backend and on emu, so the
documentation cannot drift from the code.

Each ```python block runs in a fresh interpreter (redirection and device loading are once per
process) in an empty directory, several at once on a machine with many cores, with
TORCHBRIDGE_BACKEND naming the backend, after a prelude that defines the stand-ins examples leave
to the reader (``YourModel``, ``model``, ``x``, ``train_loader``, ``criterion``, ``optimizer``,
``backend``). A block that cannot run here is listed in SKIPPED with the reason; an unlisted block
that fails, or a listed one that no longer exists, fails."""

import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BACKENDS = ["cpu", "emu"]

# The reader's own objects, small: a 32-feature model with 4 classes (a body and a ``head``, which
# the checkpoint example places on its own) and data for it, on the CPU as a freshly built model
# is; and ``backend``, which the examples after the first on a page take from it: the backend
# TORCHBRIDGE_BACKEND names.
PRELUDE = '''
import torch
from torchbridge.backends import BackendFactory
torch.manual_seed(0)

class YourModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.body(x))

model = YourModel()
x = torch.randn(8, 32)
train_loader = [(torch.randn(8, 32), torch.randint(0, 4, (8,))) for _ in range(3)]
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
backend = BackendFactory.create()
'''

def _has_cuda_beside(backend: str) -> bool:
    import torch

    # On emu the prelude has loaded emu as this process's PrivateUse1 device, and TorchBridge
    # refuses a native accelerator beside it (one accelerator per process, docs/device-sdk.md).
    return torch.cuda.is_available() and backend == "cpu"


def _has_torch_xla(backend: str) -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


# (document, a text that occurs in exactly one block of it, why that block does not run here, and
# the check, given the backend, that it can run after all: then the block runs; None: it never
# runs here). Reviewed: each entry needs hardware this machine lacks or an API another issue builds.
SKIPPED = [
    ("docs/python-api.md", "NVIDIABackend(device_index=0",
     "needs an NVIDIA GPU and a CUDA build of torch, in a process without an SDK device (on emu, the "
     "prelude loaded one: one accelerator per process)", _has_cuda_beside),
    ("docs/python-api.md", "TPUBackend(",
     "needs a TPU and torch_xla (this machine and CI have neither)", _has_torch_xla),
]

def python_blocks():
    """(document path relative to the root, first line number, code) of every ```python block."""
    blocks = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in re.finditer(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, flags=re.S | re.M):
            line = text.count("\n", 0, match.start()) + 2
            blocks.append((str(document.relative_to(ROOT)), line, match.group(1)))
    return blocks


BLOCKS = python_blocks()


def skip_reason(document: str, code: str, backend: str) -> "str | None":
    reasons = [(reason, runs) for doc, marker, reason, runs in SKIPPED if doc == document and marker in code]
    if not reasons or (reasons[0][1] is not None and reasons[0][1](backend)):
        return None
    return reasons[0][0]


def test_every_skip_entry_names_exactly_one_block():
    for document, marker, _, _ in SKIPPED:
        hits = [line for doc, line, code in BLOCKS if doc == document and marker in code]
        assert len(hits) == 1, f"SKIPPED entry ({document!r}, {marker!r}) matches blocks at lines {hits}; expected one"


def test_the_documents_have_examples():
    documents = {doc for doc, _, _ in BLOCKS}
    assert {"README.md", "docs/python-api.md", "docs/torchdevice-migration.md"} <= documents


class ExampleRunner:
    """Runs examples, each in its own interpreter, and stops the running ones when the session ends
    early (``-x``, Ctrl-C): a stopped session then does not wait for examples nobody will read."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running = set()
        self._stopped = False

    def run(self, folder, code: str, backend: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, TORCHBRIDGE_BACKEND=backend, TORCHBRIDGE_EMU_GUARDED="1")
        env.pop("TORCHBRIDGE_LOAD_DEVICE", None)
        with self._lock:
            if self._stopped:
                raise RuntimeError("the session ended before this example started")
            process = subprocess.Popen([sys.executable, "-c", PRELUDE + "\n" + code], cwd=folder, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self._running.add(process)
        try:
            stdout, stderr = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        finally:
            with self._lock:
                self._running.discard(process)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def stop(self):
        with self._lock:
            self._stopped = True
            for process in self._running:
                process.kill()


@pytest.fixture(scope="session")
def started_examples(request, tmp_path_factory):
    """Every selected example that runs here, started in the background, half as many at a time as
    this process may use cores (one at a time on the 2-core VM, as before): each is its own
    interpreter, and 58 one after another never finished within a lent GPU machine's budget."""
    workers = max(1, len(os.sched_getaffinity(0)) // 2) if hasattr(os, "sched_getaffinity") else 1
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    runner = ExampleRunner()
    started = {}
    for item in request.session.items:
        if getattr(item, "originalname", None) != "test_example_runs":
            continue
        p = item.callspec.params
        if skip_reason(p["document"], p["code"], p["backend"]) is None:
            started[(p["document"], p["line"], p["backend"])] = pool.submit(
                runner.run, tmp_path_factory.mktemp("example"), p["code"], p["backend"])
    yield started
    # After a full session every example has been waited for; after an early stop the rest are not.
    pool.shutdown(wait=False, cancel_futures=True)
    runner.stop()
    pool.shutdown()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("document,line,code", BLOCKS, ids=[f"{doc}:{line}" for doc, line, _ in BLOCKS])
def test_example_runs(started_examples, document, line, code, backend):
    reason = skip_reason(document, code, backend)
    if reason:
        pytest.skip(reason)
    result = started_examples[(document, line, backend)].result()
    assert result.returncode == 0, (f"{document}:{line} failed on {backend} (exit {result.returncode}):\n"
                                    f"{code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
