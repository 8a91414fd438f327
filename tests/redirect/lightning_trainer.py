import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.devices_seen = set()

    def training_step(self, batch, batch_index):
        x, y = batch
        self.devices_seen.add(x.device)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16)
model = Regression()
trainer = L.Trainer(accelerator="gpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, data)
print(f"weight sum: {sum(p.sum().item() for p in model.parameters()):.6f}")
print(f"steps: {trainer.global_step}")
print(f"trained on the accelerator: {model.devices_seen == {torch.empty(0, device='cuda').device}}")
