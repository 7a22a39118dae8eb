"""Plain ``nn.Module`` models. Nothing here knows about processes or ranks."""
from __future__ import annotations

import torch.nn as nn


class SmallCNN(nn.Module):
    """Two 3x3 convolutions, a pooling step and a two-layer head."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * (image_size // 2) ** 2, 128), nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.head(self.features(x))


class MLP(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 8,
                 hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * image_size ** 2, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


def cifar_resnet18(in_channels: int = 3, num_classes: int = 10, image_size: int = 32):
    """torchvision's ResNet-18 with the CIFAR stem: a 3x3 stride-1 first convolution and
    no max-pool, so 32x32 images are not shrunk to 8x8 before the first block."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def get_model(name: str, in_channels: int = 1, num_classes: int = 10, image_size: int = 8):
    builders = {"cnn": SmallCNN, "mlp": MLP, "resnet18": cifar_resnet18}
    return builders[name](in_channels=in_channels, num_classes=num_classes, image_size=image_size)
