"""torch.compile with an SDK device loaded. Inductor has no code generator for a PrivateUse1
device and used to fail deep inside with an error naming nothing useful (KeyError: 'emu'); it now
refuses graphs on the device saying why and what works, while 'aot_eager' runs them and inductor
keeps compiling graphs on the CPU in the same process."""

import json

PROGRAM = """
import json, torch, torchbridge
torchbridge.devices.load("emu")
torch.manual_seed(0)
layer = torch.nn.Linear(8, 2)
x = torch.randn(4, 8)
pointwise = lambda t: (t.sin() * 2).sum()
refusals = []
for function in (layer.to("emu"), pointwise):
    try:
        torch.compile(function)(x.to("emu"))
        refusals.append("compiled")
    except Exception as error:
        refusals.append(str(error))
eager_error = (torch.compile(pointwise, backend="aot_eager")(x.to("emu")).cpu() - pointwise(x)).abs().item()
cpu_error = (torch.compile(pointwise)(x) - pointwise(x)).abs().item()
print(json.dumps({"refusals": refusals, "aot_eager_error": eager_error, "cpu_inductor_error": cpu_error}))
"""


def test_inductor_refuses_the_sdk_device_by_name_and_aot_eager_and_cpu_still_compile(fresh_python):
    result = fresh_python(PROGRAM, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    for refusal in found["refusals"]:
        assert "no code generator for SDK device 'emu'" in refusal and "backend='aot_eager'" in refusal
    assert found["aot_eager_error"] <= 1e-6
    assert found["cpu_inductor_error"] <= 1e-5
