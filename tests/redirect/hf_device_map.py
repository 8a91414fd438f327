import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging

logging.set_verbosity_error()  # its progress bars and notes differ by target
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0)
prompt = torch.tensor([[5, 9, 2]])
with tempfile.TemporaryDirectory() as directory:
    GPT2LMHeadModel(config).save_pretrained(directory)
    # Big-model loading as its documentation shows it: accelerate places the layers on the GPUs
    # (device maps name them by index) and the generation runs where they are.
    for device_map in ("auto", {"": 0}):
        model = GPT2LMHeadModel.from_pretrained(directory, device_map=device_map)
        devices = sorted({str(p.device) for p in model.parameters()})
        print(f"info: device_map={device_map!r} placed the parameters on {devices}")
        generated = model.generate(prompt.to("cuda"), max_new_tokens=6, do_sample=False, pad_token_id=0)
        print(f"device_map={device_map!r}: generated {generated.tolist()}")
        with torch.no_grad():
            logits = model(prompt.to("cuda")).logits
        print(f"device_map={device_map!r}: logits checksum {logits.double().sum().item():.4f}")
