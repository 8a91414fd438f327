import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainingArguments

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                   bos_token_id=0, eos_token_id=0))
data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (16, 16))]
with tempfile.TemporaryDirectory() as output:
    arguments = TrainingArguments(output_dir=output, max_steps=3, per_device_train_batch_size=4, report_to=[],
                                  save_strategy="no", disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=arguments, train_dataset=data)
    trainer.remove_callback(PrinterCallback)  # it prints timings, which differ by target
    result = trainer.train()
# A machine with several devices trains on all of them (DataParallel, as on several GPUs), so the
# loss depends on the device count: it is information, not compared.
print(f"info: devices {arguments.n_gpu}, training loss {result.training_loss:.4f}")
print(f"trained {result.global_step} steps: {result.global_step == 3}")
print(f"loss is finite: {bool(torch.isfinite(torch.tensor(result.training_loss)))}")
print(f"parameters on the accelerator: {next(model.parameters()).device == torch.empty(0, device='cuda').device}")
