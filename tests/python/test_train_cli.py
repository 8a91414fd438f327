"""`torchbridge train` alone and under torchrun: data parallel against one process on the whole
batch, ZeRO-1 against data parallel (bit for bit, state split across ranks), saving and resuming
with another number of ranks, and the errors a wrongly started job gets. References: the saved
parameters read by the safetensors package, and the same job run another way."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from safetensors.torch import load_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("TORCHBRIDGE_CLI_PATH", str(ROOT / "build" / "bin" / "torchbridge"))
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def train(*args, ranks=None, check=True):
    """Runs `torchbridge train ARGS --json` alone (ranks None) or under torchrun; rank 0's report."""
    command = [BINARY, "train", *args, "--json"]
    if ranks is not None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                   "--no-python", *command]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=ENV)
    if not check:
        return run
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout[run.stdout.index("{"):])


def parameters(path):
    return {name: tensor for name, tensor in load_file(str(path)).items() if name.startswith("model.")}


def max_difference(a, b):
    assert a.keys() == b.keys()
    return max((a[name].double() - b[name].double()).abs().max().item() for name in a)


def test_data_parallel_matches_one_process_on_the_whole_batch(tmp_path):
    alone = train("--model", "builtin:mlp", "--steps", "8", "--save", str(tmp_path / "alone.safetensors"))
    for ranks in (2, 4):
        report = train("--model", "builtin:mlp", "--steps", "8", "--data-parallel",
                       "--save", str(tmp_path / f"dp{ranks}.safetensors"), ranks=ranks)
        assert report["world_size"] == ranks and report["mode"] == "data-parallel"
        assert report["parameters_identical_across_ranks"]
        assert len({r["parameter_fingerprint"] for r in report["ranks"]}) == 1
        # float32: the same gradients, summed in another order
        assert max_difference(parameters(tmp_path / f"dp{ranks}.safetensors"),
                              parameters(tmp_path / "alone.safetensors")) < 1e-5
    assert alone["ranks"][0]["last_loss"] < alone["ranks"][0]["first_loss"]


def test_zero1_is_data_parallel_bit_for_bit_with_the_state_split():
    dp = train("--model", "builtin:mlp", "--steps", "6", "--data-parallel", ranks=2)
    zero = train("--model", "builtin:mlp", "--steps", "6", "--zero1", ranks=2)
    assert zero["ranks"][0]["parameter_fingerprint"] == dp["ranks"][0]["parameter_fingerprint"]
    full = dp["ranks"][0]["optimizer_state_bytes"]
    shards = [r["optimizer_state_bytes"] for r in zero["ranks"]]
    assert sum(shards) == full
    assert all(0 < shard < full for shard in shards)


@pytest.mark.parametrize("first,second", [("data-parallel", "data-parallel"), ("zero1", "data-parallel"),
                                          ("data-parallel", "zero1")])
def test_a_resumed_run_continues_as_the_uninterrupted_one(tmp_path, first, second):
    uninterrupted = train("--model", "builtin:mlp", "--steps", "8", "--data-parallel", ranks=2)
    saved = tmp_path / "half.safetensors"
    train("--model", "builtin:mlp", "--steps", "4", f"--{first}", "--save", str(saved), ranks=2)
    resumed = train("--model", "builtin:mlp", "--steps", "8", f"--{second}", "--resume", str(saved), ranks=2)
    assert resumed["resumed_at_step"] == 4
    assert resumed["ranks"][0]["parameter_fingerprint"] == uninterrupted["ranks"][0]["parameter_fingerprint"]


def test_a_run_resumes_with_another_number_of_ranks(tmp_path):
    train("--model", "builtin:mlp", "--steps", "8", "--data-parallel", "--save", str(tmp_path / "full.safetensors"),
          ranks=2)
    train("--model", "builtin:mlp", "--steps", "4", "--data-parallel", "--save", str(tmp_path / "half.safetensors"),
          ranks=2)
    resumed = train("--model", "builtin:mlp", "--steps", "8", "--zero1", "--resume", str(tmp_path / "half.safetensors"),
                    "--save", str(tmp_path / "resumed.safetensors"), ranks=4)
    assert resumed["world_size"] == 4 and resumed["parameters_identical_across_ranks"]
    # Four ranks average the same gradients in another order than two: float32 rounding only.
    assert max_difference(parameters(tmp_path / "resumed.safetensors"), parameters(tmp_path / "full.safetensors")) < 1e-5


def test_a_run_resumed_under_another_seed_is_refused(tmp_path):
    # The teacher and the data follow the seed: a resume under another one trained towards other
    # targets, silently (exit 0).
    saved = tmp_path / "seed0.safetensors"
    train("--model", "builtin:mlp", "--steps", "4", "--save", str(saved))
    refused = train("--model", "builtin:mlp", "--steps", "8", "--seed", "1", "--resume", str(saved), check=False)
    assert refused.returncode != 0
    assert f"--resume {saved} was trained with --seed 0, and this run has --seed 1" in refused.stderr


def test_data_parallel_on_an_sdk_device_matches_the_cpu(tmp_path):
    """emu's gradients and ZeRO-1's parameter exchange travel through host memory (Gloo takes CPU
    tensors only); the training must be the CPU's."""
    on_cpu = train("--model", "builtin:mlp", "--steps", "6", "--zero1", "--save", str(tmp_path / "cpu.safetensors"),
                   ranks=2)
    on_emu = train("--model", "builtin:mlp", "--steps", "6", "--zero1", "--device", "emu",
                   "--save", str(tmp_path / "emu.safetensors"), ranks=2)
    assert on_emu["device"] == "emu" and on_emu["parameters_identical_across_ranks"]
    assert [r["optimizer_state_bytes"] for r in on_emu["ranks"]] == [r["optimizer_state_bytes"] for r in on_cpu["ranks"]]
    assert max_difference(parameters(tmp_path / "emu.safetensors"), parameters(tmp_path / "cpu.safetensors")) < 1e-6


def test_tensor_and_pipeline_parallel_train_as_one_process_does():
    """The ranks split the model, not the data: the whole batch's loss must follow one process's
    (float32: the split sums round differently), and every rank ends with the whole model; on emu
    too, whose activations and partial sums travel through host memory."""
    alone = train("--model", "builtin:mlp", "--steps", "10")["ranks"][0]
    split = {
        "tensor 2": train("--model", "builtin:mlp", "--steps", "10", "--tensor-parallel", "2", ranks=2),
        "pipeline 3, 1f1b": train("--model", "builtin:mlp", "--steps", "10", "--pipeline-parallel", "3", ranks=3),
        "pipeline 3, gpipe": train("--model", "builtin:mlp", "--steps", "10", "--pipeline-parallel", "3",
                                   "--schedule", "gpipe", "--micro-batches", "6", ranks=3),
        "tensor 2 on emu": train("--model", "builtin:mlp", "--steps", "10", "--tensor-parallel", "2",
                                 "--device", "emu", ranks=2),
        "pipeline 2 on emu, 1f1b": train("--model", "builtin:mlp", "--steps", "10", "--pipeline-parallel", "2",
                                         "--device", "emu", ranks=2),
        "pipeline 3 on emu, gpipe": train("--model", "builtin:mlp", "--steps", "10", "--pipeline-parallel", "3",
                                          "--schedule", "gpipe", "--device", "emu", ranks=3),
    }
    for name, report in split.items():
        assert report["device"] == ("emu" if "emu" in name else "cpu"), name
        assert report["parameters_identical_across_ranks"], name
        for rank in report["ranks"]:
            assert rank["first_loss"] == pytest.approx(alone["first_loss"], rel=1e-6), name
            assert rank["last_loss"] == pytest.approx(alone["last_loss"], rel=1e-5), name
            assert 0 < rank["optimizer_state_bytes"] < alone["optimizer_state_bytes"], name


def test_ranks_started_with_different_options_are_named_before_training():
    command = f"exec {BINARY} train --model builtin:mlp --data-parallel --steps $((5 + RANK))"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "--no-python", "bash", "-c", command], capture_output=True, text=True, timeout=300, env=ENV)
    assert run.returncode != 0
    assert "rank 1 has --steps 6, rank 0 has 5" in run.stderr, run.stderr[-2000:]
    # A rank on emu beside one on the CPU trained to wrong numbers, or hung in a collective.
    command = f"exec {BINARY} train --model builtin:mlp --data-parallel --steps 3 $([ $RANK = 1 ] && echo --device emu)"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "--no-python", "bash", "-c", command], capture_output=True, text=True, timeout=300, env=ENV)
    assert run.returncode != 0
    assert "rank 1 has --device an SDK device, rank 0 has cpu" in run.stderr, run.stderr[-2000:]


def test_torchrun_without_a_parallel_mode_is_refused():
    run = train("--model", "builtin:mlp", ranks=2, check=False)
    assert run.returncode != 0
    assert "give a parallel mode (--data-parallel, --zero1, --tensor-parallel K, --pipeline-parallel K)" in run.stderr


@pytest.mark.parametrize("args,message", [
    (["--model", "builtin:mlp", "--global-batch", "7", "--data-parallel"],
     "--global-batch 7 does not divide into 2 equal shares"),
    (["--model", "builtin:nope"], "--model builtin:nope"),
    (["--model", "builtin:mlp", "--steps", "0"], "--steps"),
    (["--model", "builtin:mlp", "--zero1", "--data-parallel"], "exclude each other"),
    (["--model", "builtin:cnn", "--tensor-parallel", "2"], "--tensor-parallel trains builtin:mlp only"),
    (["--model", "builtin:mlp", "--tensor-parallel", "2"], "--tensor-parallel 2 needs exactly 2 ranks, this job has 1"),
    (["--model", "builtin:mlp", "--pipeline-parallel", "1", "--schedule", "zigzag"], "--schedule 'zigzag'"),
    (["--model", "builtin:mlp", "--pipeline-parallel", "1", "--save", "x.safetensors"],
     "not supported with pipeline-parallel yet"),
    (["--model", "builtin:mlp", "--pipeline-parallel", "1", "--micro-batches", "5"],
     "--global-batch 24 does not split into 5 equal micro-batches"),
    (["--model", "builtin:mlp", "--micro-batches", "7"], "without --pipeline-parallel it would change nothing"),
    (["--model", "builtin:mlp", "--data-parallel", "--schedule", "gpipe"],
     "--schedule sets how --pipeline-parallel feeds its stages"),
])
def test_bad_options_are_clear_errors(args, message):
    run = train(*args, ranks=2 if "--global-batch" in args else None, check=False)
    assert run.returncode != 0
    assert message in run.stderr, run.stderr[-2000:]


def test_resuming_past_the_last_step_is_refused(tmp_path):
    saved = tmp_path / "done.safetensors"
    train("--model", "builtin:mlp", "--steps", "3", "--save", str(saved))
    run = train("--model", "builtin:mlp", "--steps", "3", "--resume", str(saved), check=False)
    assert run.returncode != 0 and "is at step 3, not before --steps 3" in run.stderr


def test_a_tensor_parallel_dimension_that_does_not_split_is_refused_before_training():
    run = train("--model", "builtin:mlp", "--tensor-parallel", "3", ranks=3, check=False)
    assert run.returncode != 0
    assert "out_features 64 does not divide into 3 equal shares" in run.stderr, run.stderr[-2000:]


def test_cuda_needs_nccl_and_says_so_where_it_cannot_run():
    import torch

    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        pytest.skip("NCCL runs here: test_data_parallel_on_cuda_over_nccl_is_one_process_on_the_whole_batch")
    run = train("--model", "builtin:mlp", "--device", "cuda", "--steps", "2", check=False)
    assert run.returncode != 0
    assert "the nccl collective backend is not available" in run.stderr, run.stderr[-2000:]


def test_data_parallel_on_cuda_over_nccl_is_one_process_on_the_whole_batch():
    """A GPU machine with one GPU: a world of one over NCCL (DataParallel's reducer, no host staging)
    and ZeRO-1 must train exactly as the process alone on the same GPU."""
    import torch

    if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
        pytest.skip("needs a CUDA device and a torch with NCCL")
    alone = train("--model", "builtin:mlp", "--steps", "6", "--device", "cuda")
    for mode in ("--data-parallel", "--zero1"):
        report = train("--model", "builtin:mlp", "--steps", "6", "--device", "cuda", mode, ranks=1)
        assert report["device"] == "cuda"
        assert report["ranks"][0]["parameter_fingerprint"] == alone["ranks"][0]["parameter_fingerprint"], mode
